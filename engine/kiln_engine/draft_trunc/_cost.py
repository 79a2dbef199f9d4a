"""Cost of one verify step, for the cost-aware truncation policy.

Routed-expert time of one MoE layer, fitted to the H200 benchmark
(``benchmarks/draft_trunc/results-2026-11-30-h200.json``, 16 points):

    t_routed(L, N) = t_fixed + t_byte * U(L) * expert_bytes + t_token * N + t_route * L * top_k

L: live tokens (their routes reach the experts), N: all scheduled tokens (the
router, sort and scatter still see dead ones), U(L): experts touched by the live
tokens. The layer streams each touched expert's weights once, so U(L) carries
almost all of it; the fit says what a live route costs beyond that.

U(L) follows from routing: each token picks ``top_k`` distinct experts of
``experts``. With uniform routing an expert is missed by one token with
probability ``1 - top_k / experts``, so ``U = E * (1 - (1 - k/E)^L)``, the upper
bound for a given L. Real routers are skewed; with expert popularity
``w_e ~ (e + 1)^-skew`` (Zipf), expert e is hit by a token with probability
``min(1, k * w_e)`` and ``U = sum_e 1 - (1 - min(1, k w_e))^L``: fewer experts
touched, so more to save at small L. ``skew = 0`` is the uniform case.

The rest of a step (attention, dense layers, shared experts, lm_head, the
drafter, the runner) is not measured here. Dead draft rows still run all of it,
so truncation never changes it: it enters only as a constant in the
denominator, ``other_share`` of the step's time when every draft is verified
(``KILN_DRAFT_TRUNC_OTHER_SHARE``). Only ratios of times matter to the policy,
so the number of MoE layers cancels.

Pure Python (numpy only for the fit): importing it must stay cheap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# The cost-aware policy chooses tau among g / TAU_GRID, g = 0..TAU_GRID-1: a
# power of two, so every candidate is exact in fp32 and tau = 0 is one of them.
TAU_GRID = 32

# Online calibration of the estimator (see ``calibrated_values``). CAL_PRIOR:
# pseudo-drafts that vouch for the prediction itself in a cell with no grades yet
# (a power of two, so an empty cell gives back its bin's middle exactly in fp32).
# CAL_CAP: grades per cell before both counts are halved, so that the
# calibration follows a drifting estimator (a half-life of ~CAL_CAP grades).
CAL_PRIOR = 8.0
CAL_CAP = 4096.0


@dataclass(frozen=True)
class MoELayer:
    """The shape that decides what a routed-expert pass costs."""

    experts: int = 256
    top_k: int = 8
    expert_bytes: float = 3 * 6144 * 2048 * 2  # gate + up + down, bf16 (GLM-5-like)
    skew: float = 0.0  # Zipf exponent of expert popularity; 0 = uniform


@dataclass(frozen=True)
class RoutedCost:
    """Per-layer routed-expert time coefficients, microseconds."""

    t_fixed: float
    t_byte: float  # per byte of touched expert weights
    t_token: float  # per scheduled token (live or dead)
    t_route: float  # per live route (live token x top_k)


# Fitted by ``fit_routed_cost`` to the H200 table (see benchmarks/draft_trunc/
# fit_cost.py, which re-derives and checks these; tests/draft_trunc/test_cost.py
# fails if they drift from the JSON).
H200_FIT = RoutedCost(t_fixed=298.96, t_byte=3.0107e-07, t_token=0.76686, t_route=0.0)


def hit_probabilities(layer: MoELayer) -> list[float]:
    """Probability that one token routes to each expert."""
    e, k = layer.experts, layer.top_k
    if layer.skew <= 0.0:
        return [k / e] * e
    w = [(i + 1) ** -layer.skew for i in range(e)]
    total = sum(w)
    return [min(1.0, k * x / total) for x in w]


def experts_touched(layer: MoELayer, live: float) -> float:
    """Expected number of distinct experts the ``live`` tokens route to."""
    if live <= 0:
        return 0.0
    if layer.skew <= 0.0:
        return layer.experts * -math.expm1(live * math.log1p(-layer.top_k / layer.experts))
    return sum(
        1.0 if p >= 1.0 else -math.expm1(live * math.log1p(-p)) for p in hit_probabilities(layer)
    )


def routed_us(layer: MoELayer, cost: RoutedCost, live: float, tokens: float, touched=None) -> float:
    """Routed-expert time of one layer (us); ``touched`` overrides U(live)."""
    u = experts_touched(layer, live) if touched is None else touched
    return (
        cost.t_fixed
        + cost.t_byte * u * layer.expert_bytes
        + cost.t_token * tokens
        + cost.t_route * live * layer.top_k
    )


def live_table(layer: MoELayer, cost: RoutedCost, max_tokens: int) -> list[float]:
    """The live-token-dependent part of ``routed_us`` for L = 0..max_tokens.

    The policy kernel reads it by index, so any routing model works on device.
    """
    return [
        cost.t_byte * experts_touched(layer, n) * layer.expert_bytes
        + cost.t_route * n * layer.top_k
        for n in range(max_tokens + 1)
    ]


def other_ratio(other_share: float) -> float:
    """Non-routed time per unit of routed time at full verification."""
    return other_share / (1.0 - other_share)


def _live_tokens(row: dict) -> int:
    return row["tokens"] - round(row["dead_frac"] * row["tokens"])


def fit_routed_cost(rows: list[dict], layer: MoELayer) -> RoutedCost:
    """Non-negative least squares of ``routed_us`` on measured rows.

    Each row gives requests/tokens/dead_frac/experts_touched and the measured
    ``routed_skip_us``. Relative residuals are minimised (the table spans 2-8 ms),
    and every coefficient is kept >= 0 by trying each subset of free ones: a
    negative per-token time would be noise, not physics.
    """
    import itertools

    import numpy as np

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
    best, best_err = None, math.inf
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
    return RoutedCost(*(float(c) for c in best))


def fit_errors(rows: list[dict], layer: MoELayer, cost: RoutedCost, expected: bool) -> list[float]:
    """Relative error per row: with the measured experts touched, or (``expected``)
    with U(L) from the routing model instead."""
    out = []
    for r in rows:
        touched = None if expected else r["experts_touched"]
        pred = routed_us(layer, cost, _live_tokens(r), r["tokens"], touched)
        out.append(pred / r["routed_skip_us"] - 1.0)
    return out


def survival_bins(surv):
    """The kernel's bin of each survival: floor(S * TAU_GRID), capped."""
    import numpy as np

    return np.minimum(np.floor(np.asarray(surv) * TAU_GRID), TAU_GRID - 1).astype(int)


def calibrated_values(hits, counts, prior: float = CAL_PRIOR):
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
    import numpy as np

    mids = (np.arange(TAU_GRID) + 0.5) / TAU_GRID
    return (np.asarray(hits, dtype=np.float64) + prior * mids) / (
        np.asarray(counts, dtype=np.float64) + prior
    )


def draft_values(surv, values=None):
    """[..., K] expected survival of each draft: the calibrated value of its
    (position, bin) cell, or the middle of its bin without calibration."""
    import numpy as np

    bins = survival_bins(surv)
    if values is None:
        return (bins + 0.5) / TAU_GRID
    k = np.arange(bins.shape[-1])
    return np.asarray(values)[k, bins]


def calibration_update(hits, counts, surv, kept, accepted, cap: float = CAL_CAP):
    """Grade the verified drafts of a batch into ``hits``/``counts`` [K, TAU_GRID]
    (in place), as ``draft_trunc.graded`` does on the device.

    ``surv`` [..., K] survival at marking time, ``kept`` [...] drafts verified,
    ``accepted`` [...] of them accepted.
    """
    import numpy as np

    surv = np.asarray(surv)
    k = np.arange(surv.shape[-1])
    verified = k < np.asarray(kept)[..., None]
    survived = (k < np.asarray(accepted)[..., None]) & verified
    cells = np.broadcast_to(k, surv.shape)[verified], survival_bins(surv)[verified]
    np.add.at(counts, cells, 1.0)
    np.add.at(hits, cells, survived[verified].astype(float))
    over = counts > cap
    hits[over] *= 0.5
    counts[over] *= 0.5


def cost_aware_tau(
    surv, optional, num_tokens, num_reqs, table, cost: RoutedCost, ratio_other, values=None
):
    """The device policy's choice, in numpy (the simulator replays it)."""
    import numpy as np

    tokens, time_us = candidate_prices(
        surv, optional, num_tokens, num_reqs, table, cost, ratio_other, values
    )
    taus = np.arange(TAU_GRID) / TAU_GRID
    return taus[np.argmax(tokens / time_us, axis=-1)]


def candidate_prices(
    surv, optional, num_tokens, num_reqs, table, cost: RoutedCost, ratio_other, values=None
):
    """Expected tokens and routed+other time (per layer) of each candidate tau.

    ``surv`` [..., R, K]: survival of each draft (0 where there is none);
    ``optional`` [..., R, K]: drafts the policy may cut (past min_keep, in a
    truncatable request); ``num_tokens``/``num_reqs``: scalars or [...];
    ``values`` [K, TAU_GRID]: calibrated survival by (position, bin), see
    ``calibrated_values`` (None: each optional draft counts the middle of its
    bin; drafts no candidate cuts always count their survival). Same
    grid, bins, prices and tie rule (smallest tau) as the kernel: candidate g
    keeps the optional drafts of bins >= g. Returns two arrays [..., TAU_GRID].
    """
    import numpy as np

    surv = np.asarray(surv, dtype=np.float64)
    optional = np.asarray(optional, dtype=bool)
    lead = surv.shape[:-2]
    worth = draft_values(surv, values).reshape(*lead, -1)
    live_draft = surv.reshape(*lead, -1) > 0
    flat = surv.reshape(*lead, -1)
    opt = optional.reshape(*lead, -1)
    bins = np.where(opt, survival_bins(flat), -1)
    hist = np.stack([(bins == g).sum(axis=-1) for g in range(TAU_GRID)], axis=-1)
    weighted = np.stack(
        [np.where(bins == g, worth, 0.0).sum(axis=-1) for g in range(TAU_GRID)], axis=-1
    )
    kept = np.flip(np.cumsum(np.flip(hist, -1), axis=-1), -1)
    gain = np.flip(np.cumsum(np.flip(weighted, -1), axis=-1), -1)
    # drafts no candidate cuts count their raw survival, as in the kernel
    forced = np.where(opt | ~live_draft, 0.0, flat).sum(axis=-1)
    table = np.asarray(table, dtype=np.float64)
    cap = len(table) - 1
    num_tokens = np.asarray(num_tokens)
    live = np.clip(num_tokens[..., None] - opt.sum(axis=-1)[..., None] + kept, 0, cap)
    shared = cost.t_fixed + cost.t_token * num_tokens
    other = ratio_other * (table[np.minimum(num_tokens, cap)] + shared)
    tokens = np.asarray(num_reqs)[..., None] + forced[..., None] + gain
    return tokens, (shared + other)[..., None] + table[live]
