"""The numpy side of draft_trunc's cost model: what the simulator and the tests
use and the engine image must not carry.

- ``fit_routed_cost``/``fit_errors``: the fit of the routed-expert time
  coefficients (``kiln_engine.draft_trunc._cost.H200_FIT``) to the H200 table;
- ``cost_aware_tau``/``candidate_prices`` and the calibration helpers: the device
  policy of ``_kernels.device_functions.cost_aware_tau`` restated in numpy (same grid, bins, prices
  and tie rule), so that ``benchmarks/draft_trunc/sim_trunc.py`` replays exactly
  what the kernel would choose, and the tests check the kernel against it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import TypedDict

import numpy as np
import numpy.typing as npt
from kiln_engine.draft_trunc._cost import (
    CAL_CAP,
    CAL_PRIOR,
    TAU_GRID,
    MoELayer,
    RoutedCost,
    experts_touched,
)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int_]


class MoERow(TypedDict):
    """One row of the benchmark table (``results-*-h200.json``, ``"moe"``) the fit uses."""

    requests: int
    tokens: int
    dead_frac: float
    experts_touched: int
    routed_skip_us: float


def routed_us(layer: MoELayer, cost: RoutedCost, live: float, tokens: float, touched: float | None = None) -> float:
    """Routed-expert time of one layer (us), t_routed(L, N) of ``_cost``'s
    docstring; ``touched`` overrides U(live)."""
    u = experts_touched(layer, live) if touched is None else touched
    return (
        cost.t_fixed + cost.t_byte * u * layer.expert_bytes + cost.t_token * tokens + cost.t_route * live * layer.top_k
    )


def _live_tokens(row: MoERow) -> int:
    return row["tokens"] - round(row["dead_frac"] * row["tokens"])


def fit_routed_cost(rows: list[MoERow], layer: MoELayer) -> RoutedCost:
    """Non-negative least squares of ``routed_us`` on measured rows.

    Each row gives requests/tokens/dead_frac/experts_touched and the measured
    ``routed_skip_us``. Relative residuals are minimised (the table spans 2-8 ms),
    and every coefficient is kept >= 0 by trying each subset of free ones: a
    negative per-token time would be noise, not physics.
    """
    x = np.array(
        [
            [
                1.0,
                r["experts_touched"] * layer.expert_bytes,
                r["tokens"],
                _live_tokens(r) * layer.top_k,
            ]
            for r in rows
        ]
    )
    y = np.array([r["routed_skip_us"] for r in rows])
    w = 1.0 / y
    best: FloatArray | None = None
    best_err = math.inf
    for size in range(1, 5):
        for cols in itertools.combinations(range(4), size):
            sub = x[:, cols] * w[:, None]
            coef, *_ = np.linalg.lstsq(sub, y * w, rcond=None)
            if (coef < 0).any():
                continue
            full = np.zeros(4)
            full[list(cols)] = coef
            err = float(((((x @ full) - y) * w) ** 2).sum())
            if err < best_err:
                best, best_err = full, err
    assert best is not None  # the one-column subsets alone always give one
    return RoutedCost(*(float(c) for c in best))


def fit_errors(rows: list[MoERow], layer: MoELayer, cost: RoutedCost, expected: bool) -> list[float]:
    """Relative error per row: with the measured experts touched, or (``expected``)
    with U(L) from the routing model instead."""
    out = []
    for r in rows:
        touched = None if expected else r["experts_touched"]
        pred = routed_us(layer, cost, _live_tokens(r), r["tokens"], touched)
        out.append(pred / r["routed_skip_us"] - 1.0)
    return out


def survival_bins(surv: npt.ArrayLike) -> IntArray:
    """The kernel's bin of each survival: floor(S * TAU_GRID), capped."""
    bins: IntArray = np.minimum(np.floor(np.asarray(surv) * TAU_GRID), TAU_GRID - 1).astype(int)
    return bins


def calibrated_values(hits: npt.ArrayLike, counts: npt.ArrayLike, prior: float = CAL_PRIOR) -> FloatArray:
    """Expected survival of a draft by (position, predicted-survival bin).

    ``counts[k, b]``: verified drafts at position k (0-based) whose predicted
    survival fell in bin b; ``hits[k, b]``: how many of them survived (the
    window accepted k + 1 drafts or more). Only verified drafts are graded, and
    whether a draft is verified depends only on its bin and position (the
    threshold, min_keep, exploration), never on its outcome, so each cell's rate
    is unbiased. The estimate shrinks toward the bin's middle (the prediction
    itself) with ``prior`` pseudo-drafts: with no grades the policy is the
    uncalibrated one. Position matters because the estimator's error does:
    on the CPU twin's traces a survival of 0.2 meant 0.19 at the first draft
    and 0.09 at the third.
    """
    mids = (np.arange(TAU_GRID) + 0.5) / TAU_GRID
    values: FloatArray = (np.asarray(hits, dtype=np.float64) + prior * mids) / (
        np.asarray(counts, dtype=np.float64) + prior
    )
    return values


def draft_values(surv: npt.ArrayLike, values: npt.ArrayLike | None = None) -> FloatArray:
    """[..., K] expected survival of each draft: the calibrated value of its
    (position, bin) cell, or the middle of its bin without calibration."""
    bins = survival_bins(surv)
    if values is None:
        middles: FloatArray = (bins + 0.5) / TAU_GRID
        return middles
    k = np.arange(bins.shape[-1])
    calibrated: FloatArray = np.asarray(values, dtype=np.float64)[k, bins]
    return calibrated


def calibration_update(
    hits: FloatArray,
    counts: FloatArray,
    surv: npt.ArrayLike,
    kept: npt.ArrayLike,
    accepted: npt.ArrayLike,
    cap: float = CAL_CAP,
) -> None:
    """Grade the verified drafts of a batch into ``hits``/``counts`` [K, TAU_GRID]
    (in place), as ``draft_trunc.graded`` does on the device.

    ``surv`` [..., K] survival at marking time, ``kept`` [...] drafts verified,
    ``accepted`` [...] of them accepted.
    """
    survs = np.asarray(surv)
    k = np.arange(survs.shape[-1])
    verified = k < np.asarray(kept)[..., None]
    survived = (k < np.asarray(accepted)[..., None]) & verified
    cells = np.broadcast_to(k, survs.shape)[verified], survival_bins(survs)[verified]
    np.add.at(counts, cells, 1.0)
    np.add.at(hits, cells, survived[verified].astype(float))
    over = counts > cap
    hits[over] *= 0.5
    counts[over] *= 0.5


def cost_aware_tau(
    surv: npt.ArrayLike,
    optional: npt.ArrayLike,
    num_tokens: npt.ArrayLike,
    num_reqs: npt.ArrayLike,
    table: npt.ArrayLike,
    cost: RoutedCost,
    ratio_other: float,
    values: npt.ArrayLike | None = None,
    draft_us: npt.ArrayLike = 0.0,
    undrafted: npt.ArrayLike = 0,
) -> FloatArray:
    """The device policy's choice, in numpy (the simulator replays it)."""
    tokens, time_us = candidate_prices(
        surv, optional, num_tokens, num_reqs, table, cost, ratio_other, values, draft_us, undrafted
    )
    taus = np.arange(TAU_GRID) / TAU_GRID
    chosen: FloatArray = taus[np.argmax(tokens / time_us, axis=-1)]
    return chosen


def candidate_prices(
    surv: npt.ArrayLike,
    optional: npt.ArrayLike,
    num_tokens: npt.ArrayLike,
    num_reqs: npt.ArrayLike,
    table: npt.ArrayLike,
    cost: RoutedCost,
    ratio_other: float,
    values: npt.ArrayLike | None = None,
    draft_us: npt.ArrayLike = 0.0,
    undrafted: npt.ArrayLike = 0,
) -> tuple[FloatArray, FloatArray]:
    """Expected tokens and routed+other(+drafting) time (per layer) of each candidate tau.

    ``surv`` [..., R, K]: survival of each draft (0 where there is none);
    ``optional`` [..., R, K]: drafts the policy may cut (past min_keep, in a
    truncatable request); ``num_tokens``/``num_reqs``: scalars or [...];
    ``values`` [K, TAU_GRID]: calibrated survival by (position, bin), see
    ``calibrated_values`` (None: each optional draft counts the middle of its
    bin; drafts no candidate cuts always count their survival). Same
    grid, bins, prices and tie rule (smallest tau) as the kernel: candidate g
    keeps the optional drafts of bins >= g. ``draft_us`` (scalar or [...]): the
    step's drafting time per layer, the same for every candidate (0: drafting
    unpriced); ``undrafted`` (scalar or [...]):
    scheduled draft tokens that were never drafted (an early exit of drafting),
    dead whatever tau is (their ``surv`` must be 0). Returns two arrays
    [..., TAU_GRID].
    """
    survs = np.asarray(surv, dtype=np.float64)
    lead = survs.shape[:-2]
    worth = draft_values(survs, values).reshape(*lead, -1)
    live_draft = survs.reshape(*lead, -1) > 0
    flat = survs.reshape(*lead, -1)
    opt = np.asarray(optional, dtype=bool).reshape(*lead, -1)
    bins = np.where(opt, survival_bins(flat), -1)
    # one histogram per step: bincount over (step, bin) cells (what the
    # kernel's tl.histogram does per position)
    rows = int(np.prod(lead, dtype=np.int64))
    cell = (np.arange(rows).reshape(*lead, 1) * TAU_GRID + bins)[bins >= 0]
    size = rows * TAU_GRID
    hist = np.bincount(cell, minlength=size).reshape(*lead, TAU_GRID)
    weighted = np.bincount(cell, weights=worth[bins >= 0], minlength=size).reshape(*lead, TAU_GRID)
    kept = np.flip(np.cumsum(np.flip(hist, -1), axis=-1), -1)
    gain = np.flip(np.cumsum(np.flip(weighted, -1), axis=-1), -1)
    # drafts no candidate cuts count their raw survival, as in the kernel
    forced = np.where(opt | ~live_draft, 0.0, flat).sum(axis=-1)
    prices = np.asarray(table, dtype=np.float64)
    cap = len(prices) - 1
    scheduled = np.asarray(num_tokens)
    dead = opt.sum(axis=-1) + np.asarray(undrafted)
    live = np.clip(scheduled[..., None] - dead[..., None] + kept, 0, cap)
    shared = cost.t_fixed + cost.t_token * scheduled
    other = ratio_other * (prices[np.minimum(scheduled, cap)] + shared)
    tokens = np.asarray(num_reqs)[..., None] + forced[..., None] + gain
    return tokens, (shared + other + np.asarray(draft_us))[..., None] + prices[live]


def depth_continue(
    surv: npt.ArrayLike,
    optional: npt.ArrayLike,
    n: npt.ArrayLike,
    drafted: int,
    num_tokens: npt.ArrayLike,
    num_reqs: npt.ArrayLike,
    table: npt.ArrayLike,
    cost: RoutedCost,
    ratio_other: float,
    values: npt.ArrayLike | None,
    draft_us: Sequence[npt.ArrayLike],
) -> npt.NDArray[np.bool_]:
    """Whether drafting goes on, after ``drafted`` (>= 1) positions.

    The drafter has written survivals for positions < ``drafted``; the later
    drafts of each request are not known yet. Their survival is at most the last
    one's (survival never grows with depth), so they enter as candidates with
    that survival, each worth what its (position, bin) cell has measured so far
    (optimistic: a real draft can only fall into a lower bin). Each depth d from
    ``drafted`` to the deepest scheduled draft is priced as ``candidate_prices``
    prices a step, at its best tau, with ``draft_us[d]`` of drafting and the
    scheduled drafts past d dead; drafting goes on where some deeper d is
    strictly better than stopping now. Looking past the next position matters:
    the verify cost of live tokens is concave (an expert is paid once), so one
    more position can cost more per draft than three more.

    ``surv``/``optional`` [..., R, K] as for ``candidate_prices`` (positions
    >= ``drafted`` are ignored); ``n`` [..., R] drafts scheduled per request;
    ``draft_us`` [K + 1] drafting times by depth (scalars or [...]).
    Returns a bool [...] (False where no request has a draft left to make).
    """
    survs = np.asarray(surv, dtype=np.float64)
    opt = np.asarray(optional, dtype=bool)
    sched = np.asarray(n)
    k = np.arange(survs.shape[-1])
    s = drafted
    made = k < s
    guess = np.where(made, survs, survs[..., s - 1 : s])

    def best(depth: int) -> npt.NDArray[np.float64]:
        inside = (k < depth) & (k < sched[..., None])
        tokens, time_us = candidate_prices(
            np.where(inside, guess, 0.0),
            opt & inside,
            num_tokens,
            num_reqs,
            table,
            cost,
            ratio_other,
            values,
            draft_us[depth],
            np.maximum(sched - depth, 0).sum(axis=-1),
        )
        ratio: npt.NDArray[np.float64] = (tokens / time_us).max(axis=-1)
        return ratio

    stop = best(s)
    deeper = np.max([best(d) for d in range(s + 1, int(sched.max(initial=0)) + 1)] or [stop], axis=0)
    result: npt.NDArray[np.bool_] = (deeper > stop) & (sched > s).any(axis=-1)
    return result
