"""Trace-driven model of decoding speed under draft-truncation policies.

Replays acceptance traces (per verify step and request: the estimator's
conditional acceptance predictions p_1..p_K and how many drafts the target
accepted) through each policy, for verify batches of 1-512 requests, and prices
every step with the routed-expert cost model fitted to the H200 benchmark
(kiln_engine.draft_trunc._cost). Policies:

- none: verify every draft;
- tau=t: the fixed rule, keep draft m while S_m = p_1...p_m >= t (min_keep 1);
- cost: the cost-aware rule the device kernel runs (same grid, same prices,
  and the same online calibration of the estimator from the drafts it verified,
  learnt as the replay goes: see ``cost_j``);
- cost_uncalibrated: the same rule trusting the raw predictions;
- informed_bound: the best any policy can do knowing only what the policy
  knows about each draft (its position and predicted-survival bin), with each
  such cell's true acceptance rate (see ``informed_bound``);
- oracle: knows which drafts will be accepted and keeps the best number of
  them for the whole run (an upper bound on any policy, see ``oracle``).

Truncating policies explore as on the device: a share ``explore`` of (step,
request) pairs verifies every draft (the estimator and the calibration need
labels for deep drafts); the bounds do not.

A request keeping j drafts yields 1 + min(a, j) tokens, a = drafts the full
window accepted: truncation is exact (outputs equal a batch truly truncated to
j), so a shorter window accepts its prefix of the same outcome. That needs
uncensored records: traces recorded with tau = 0 (kept == n), or windows that
ended in a rejection. A step costs

    moe_layers * (routed(live, tokens) + other),

routed from the fitted model (live = tokens minus dead drafts), other = the
non-routed time, ``other_share`` of a fully verified step (an assumption, the
same knob as KILN_DRAFT_TRUNC_OTHER_SHARE). Steps are drawn with replacement
from the trace's request records, so a batch of R requests mixes records of
different requests; batch composition does not react to the policy (the model
ignores that a faster policy changes who is in the next batch).

Traces: synthetic (stated mean acceptance alpha: p_i ~ Beta(alpha c, (1-alpha) c),
draft i accepted with probability p_i given the ones before it, so predictions
are calibrated), and JSONL files recorded by KILN_DRAFT_TRUNC_TRACE, one verify
step per line: {"step", "k", "reqs": [{"p": [...], "kept", "accepted", "n"?}]}.

Usage: python benchmarks/draft_trunc/sim_trunc.py [--out DIR] [--trace FILE ...]
(``nox -s sim_trunc``). Writes sim-trunc.json and sim-trunc.png, prints ratios.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from kiln_engine.draft_trunc import _cost
from kiln_testkit import dt_cost

HERE = Path(__file__).resolve().parent

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
ALPHAS = (0.3, 0.5, 0.7, 0.9)
TAUS = tuple(round(0.1 * i, 1) for i in range(10))
TRACE_GLOB = "traces/*.jsonl"


class TraceError(ValueError):
    """A trace line that cannot be replayed: 'file:line: field: problem'."""


@dataclass
class Records:
    """Request-step records: predictions, drafts proposed, drafts accepted."""

    p: np.ndarray  # [M, K] fp64, NaN where the estimator had none
    n: np.ndarray  # [M] drafts proposed
    accepted: np.ndarray  # [M]
    source: str
    censored: int = 0  # records dropped: all kept drafts accepted with kept < n

    @property
    def k(self) -> int:
        return self.p.shape[1]

    @property
    def acceptance(self) -> float:
        """Accepted drafts per proposed draft."""
        return float(self.accepted.sum() / max(self.n.sum(), 1))

    @property
    def conditional_acceptance(self) -> float:
        """Accepted share of the drafts actually tested: a window accepting a of
        n tested a + 1 (a if it accepted all); the synthetic traces' alpha."""
        tested = np.minimum(self.accepted + 1, self.n)
        return float(self.accepted.sum() / max(tested.sum(), 1))


def _field(where: str, obj: dict, name: str, kind):
    if not isinstance(obj, dict) or name not in obj:
        raise TraceError(f"{where}: {name}: missing")
    value = obj[name]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise TraceError(f"{where}: {name}: expected an integer, got {value!r}")
    if kind is list and not isinstance(value, list):
        raise TraceError(f"{where}: {name}: expected a list, got {type(value).__name__}")
    return value


def read_trace(path: Path) -> Records:
    """Request records of a KILN_DRAFT_TRUNC_TRACE file (TraceError on bad lines).

    Records whose window was cut before its first rejection (accepted == kept <
    n) are censored: how far it would have gone is unknown, so they are
    dropped and counted.
    """
    ps, ns, accs, k, censored = [], [], [], None, 0
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            step = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{where}: not JSON ({exc.msg})") from None
        step_k = _field(where, step, "k", int)
        if step_k < 1 or (k is not None and step_k != k):
            raise TraceError(f"{where}: k: {step_k} (expected {k or 'a positive integer'})")
        k = step_k
        for i, req in enumerate(_field(where, step, "reqs", list)):
            at = f"{where}: reqs[{i}]"
            p = _field(at, req, "p", list)
            if len(p) != k or not all(x is None or isinstance(x, (int, float)) for x in p):
                raise TraceError(f"{at}: p: expected {k} numbers or nulls")
            kept = _field(at, req, "kept", int)
            acc = _field(at, req, "accepted", int)
            n = req.get("n", k)
            if not isinstance(n, int) or not 0 <= n <= k:
                raise TraceError(f"{at}: n: {n!r} not in [0, {k}]")
            if not 0 <= kept <= n:
                raise TraceError(f"{at}: kept: {kept} not in [0, n={n}]")
            if not 0 <= acc <= kept:
                raise TraceError(f"{at}: accepted: {acc} not in [0, kept={kept}]")
            if n == 0:
                continue
            if acc == kept < n:
                censored += 1
                continue
            ps.append([math.nan if x is None else float(x) for x in p])
            ns.append(n)
            accs.append(acc)
    if not ps:
        raise TraceError(f"{path}: no uncensored verify records")
    return Records(np.array(ps), np.array(ns), np.array(accs), Path(path).stem, censored)


def synthetic(alpha: float, count: int, k: int, rng, concentration: float = 3.0) -> Records:
    """Calibrated predictions with mean conditional acceptance ``alpha``."""
    p = rng.beta(alpha * concentration, (1 - alpha) * concentration, size=(count, k))
    accept = rng.random((count, k)) < p
    accepted = np.cumprod(accept, axis=1).sum(axis=1)
    return Records(p, np.full(count, k), accepted, f"synthetic-a{alpha:.1f}")


def survival(p: np.ndarray, n: np.ndarray) -> np.ndarray:
    """S_m per draft as the kernel computes it (NaN -> 1, clamped), 0 past n."""
    k = p.shape[-1]
    q = np.where(np.isnan(p), 1.0, np.clip(p, 0.0, 1.0))
    s = np.cumprod(q.astype(np.float32), axis=-1).astype(np.float64)
    return np.where(np.arange(k) < n[..., None], s, 0.0)


@dataclass
class Model:
    """Prices a verify step; the policy and the replay use the same prices."""

    layer: _cost.MoELayer = field(default_factory=_cost.MoELayer)
    cost: _cost.RoutedCost = _cost.H200_FIT
    other_share: float = 0.5
    moe_layers: int = 58
    min_keep: int = 1
    max_tokens: int = 512 * 9
    # The routing the policy assumes, if not the one the replay prices with
    # (a mismatch check: e.g. skewed real routing, uniform policy).
    policy_layer: _cost.MoELayer | None = None

    def __post_init__(self):
        self.table = np.array(_cost.live_table(self.layer, self.cost, self.max_tokens))
        self.ratio = _cost.other_ratio(self.other_share)
        believed = self.policy_layer or self.layer
        self.policy_table = np.array(_cost.live_table(believed, self.cost, self.max_tokens))

    def step_us(self, live, tokens):
        live = np.clip(live, 0, self.max_tokens).astype(int)
        tokens = np.asarray(tokens).astype(int)
        shared = self.cost.t_fixed + self.cost.t_token * tokens
        other = self.ratio * (self.table[np.minimum(tokens, self.max_tokens)] + shared)
        return self.moe_layers * (shared + other + self.table[live])


@dataclass
class Batches:
    """S verify steps of R requests each, drawn from a trace's records."""

    surv: np.ndarray  # [S, R, K]
    n: np.ndarray  # [S, R]
    accepted: np.ndarray  # [S, R]
    explored: np.ndarray | None = None  # [S, R]: verifies every draft (None: none do)

    @property
    def tokens(self) -> np.ndarray:  # scheduled tokens per step: t0 + drafts
        return (1 + self.n).sum(axis=1)

    @property
    def reqs(self) -> int:
        return self.n.shape[1]


def draw(records: Records, batch: int, rng, target_records: int = 40_000, explore: float = 0.0) -> Batches:
    steps = max(64, target_records // batch)
    idx = rng.integers(0, len(records.n), size=(steps, batch))
    n = records.n[idx]
    explored = rng.random((steps, batch)) < explore
    return Batches(survival(records.p[idx], n), n, records.accepted[idx], explored)


def explored_keep_all(b: Batches, j: np.ndarray) -> np.ndarray:
    return j if b.explored is None else np.where(b.explored, b.n, j)


def optional_drafts(b: Batches, model: Model, surv=None, n=None, explored=None):
    """Drafts a policy may cut: past min_keep, in a request not exploring."""
    surv = b.surv if surv is None else surv
    n = b.n if n is None else n
    explored = b.explored if explored is None else explored
    pos = np.arange(surv.shape[-1])
    optional = (pos < n[..., None]) & (pos >= np.minimum(n, model.min_keep)[..., None])
    if explored is not None:
        optional &= ~explored[..., None]
    return optional


def rule_j(surv, n, tau, min_keep):
    """Kept drafts under the survival threshold ``tau`` (scalar or per step)."""
    tau = np.asarray(tau, dtype=np.float32)
    tau = tau.reshape((*tau.shape, 1, 1)) if tau.ndim else tau
    keep = (surv.astype(np.float32) >= tau) & (np.arange(surv.shape[-1]) < n[..., None])
    return np.maximum(keep.sum(axis=-1), np.minimum(n, min_keep))


def tau_j(b: Batches, tau: float, model: Model) -> np.ndarray:
    """The fixed rule, exploring as on the device."""
    return explored_keep_all(b, rule_j(b.surv, b.n, tau, model.min_keep))


def cost_j(b: Batches, model: Model, calibrate: bool = True, chunk_reqs: int = 64):
    """The cost-aware kernel's choices, replayed in order.

    With ``calibrate`` the policy prices drafts with ``dt_cost.calibrated_values``
    learnt from the drafts it verified so far (censored grading, as
    ``draft_trunc.graded`` feeds the device), starting from nothing. The device
    grades after every step; here after every ``chunk_reqs`` request-steps
    (one step from 64 requests up), a lag that only slows learning.
    """
    k = b.surv.shape[-1]
    hits = np.zeros((k, _cost.TAU_GRID))
    counts = np.zeros((k, _cost.TAU_GRID))
    steps = b.n.shape[0]
    chunk = max(1, -(-chunk_reqs // b.reqs))
    j = np.zeros_like(b.n)
    taus = np.zeros(steps)
    explored = b.explored if b.explored is not None else np.zeros(b.n.shape, bool)
    for start in range(0, steps, chunk):
        part = slice(start, start + chunk)
        surv, n = b.surv[part], b.n[part]
        optional = optional_drafts(b, model, surv, n, explored[part])
        values = dt_cost.calibrated_values(hits, counts) if calibrate else None
        tau = dt_cost.cost_aware_tau(
            surv,
            optional,
            b.tokens[part],
            b.reqs,
            model.policy_table,
            model.cost,
            model.ratio,
            values,
        )
        kept = np.where(explored[part], n, rule_j(surv, n, tau, model.min_keep))
        j[part], taus[part] = kept, tau
        if calibrate:
            accepted = np.minimum(b.accepted[part], kept)
            dt_cost.calibration_update(hits, counts, surv, kept, accepted)
    return j, taus


@dataclass
class Outcome:
    tokens: float  # tokens produced (accepted drafts + one per request-step)
    time_us: float
    accepted_per_req_step: float
    kept_frac: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / (self.time_us * 1e-6)


def replay(b: Batches, j: np.ndarray, model: Model) -> Outcome:
    acc = np.minimum(b.accepted, j)
    live = b.tokens - (b.n - j).sum(axis=1)
    return Outcome(
        tokens=float((1 + acc).sum()),
        time_us=float(model.step_us(live, b.tokens).sum()),
        accepted_per_req_step=float(acc.mean()),
        kept_frac=float(j.sum() / max(b.n.sum(), 1)),
    )


def oracle(b: Batches, model: Model, iters: int = 50) -> Outcome:
    """The best any policy can do on these steps, knowing the outcomes.

    Only accepted drafts are worth keeping, and which of them are kept does not
    change the price, so a step is described by x, the number kept (0..sum a).
    Maximising total tokens / total time over every step's x is a fractional
    program: Dinkelbach's iteration (choose each x to maximise tokens -
    lam * time, set lam to the resulting ratio) reaches its optimum. Any policy
    keeping j drafts yields sum min(a, j) tokens at a price no lower than
    keeping just those, so none can beat this.
    """
    useful = b.accepted.sum(axis=1)  # [S]
    x = np.arange(useful.max() + 1)[None, :]  # [1, X]
    valid = x <= useful[:, None]
    tokens = b.reqs + x  # [S, X] (broadcast)
    live = (b.tokens - b.n.sum(axis=1))[:, None] + x
    time_us = model.step_us(live, np.broadcast_to(b.tokens[:, None], live.shape))
    lam = 0.0
    for _ in range(iters):
        value = np.where(valid, tokens - lam * time_us, -np.inf)
        pick = value.argmax(axis=1)
        rows = np.arange(len(pick))
        tot_tokens = float((b.reqs + pick).sum())
        tot_time = float(time_us[rows, pick].sum())
        new = tot_tokens / tot_time
        if abs(new - lam) <= 1e-15 * new:
            break
        lam = new
    return Outcome(
        tokens=tot_tokens,
        time_us=tot_time,
        accepted_per_req_step=float(pick.sum() / b.n.size),
        kept_frac=float(pick.sum() / max(b.n.sum(), 1)),
    )


def cell_rates(b: Batches) -> np.ndarray:
    """[S, R, K] each draft's (position, survival bin) cell's acceptance rate over
    these steps: what a perfectly calibrated estimator would say, in hindsight."""
    k = b.surv.shape[-1]
    pos = np.broadcast_to(np.arange(k), b.surv.shape)
    valid = pos < b.n[..., None]
    survived = pos < b.accepted[..., None]
    bins = dt_cost.survival_bins(b.surv)
    counts = np.zeros((k, _cost.TAU_GRID))
    hits = np.zeros((k, _cost.TAU_GRID))
    np.add.at(counts, (pos[valid], bins[valid]), 1.0)
    np.add.at(hits, (pos[valid], bins[valid]), survived[valid].astype(float))
    rates = (hits / np.maximum(counts, 1.0))[pos, bins]
    return np.where(valid, rates, 0.0)


def informed_bound(b: Batches, model: Model, iters: int = 60) -> Outcome:
    """The best a policy can do knowing what the cost-aware policy knows.

    Each draft is described by its position and predicted-survival bin, and
    its worth is that cell's true acceptance rate on these very steps (the
    limit of the policy's calibration). Within a step any prefix of each
    request may be kept: survival cannot grow with depth (worths are made
    non-increasing along a request), so for x optional drafts kept the best are
    the x worth most, and they form prefixes. Across steps the run's own
    optimal rate prices a draft (Dinkelbach over every step's x), not each
    step's ratio; nothing explores. So it bounds the policy's threshold search,
    its per-step pricing, its learning and its exploration, but not its
    information: the gap from here to ``oracle`` is what knowing the outcomes
    is worth.
    """
    steps, reqs, k = b.surv.shape
    pos = np.arange(k)
    worth = np.minimum.accumulate(cell_rates(b), axis=-1)
    valid = pos < b.n[..., None]
    forced = valid & (pos < np.minimum(b.n, model.min_keep)[..., None])
    optional = valid & ~forced
    base = reqs + np.where(forced, worth, 0.0).sum(axis=(1, 2))
    flat = np.where(optional, worth, -1.0).reshape(steps, -1)
    order = np.argsort(-flat, axis=-1, kind="stable")
    best = np.take_along_axis(flat, order, axis=-1)
    gain = np.concatenate([np.zeros((steps, 1)), np.cumsum(np.maximum(best, 0), -1)], -1)
    n_opt = optional.reshape(steps, -1).sum(axis=-1)
    x = np.arange(gain.shape[1])[None, :]
    allowed = x <= n_opt[:, None]
    live = (b.tokens - n_opt)[:, None] + x
    time_us = model.step_us(live, np.broadcast_to(b.tokens[:, None], live.shape))
    tokens = base[:, None] + gain
    rows = np.arange(steps)
    lam = 0.0
    for _ in range(iters):
        pick = np.where(allowed, tokens - lam * time_us, -np.inf).argmax(axis=1)
        new = float(tokens[rows, pick].sum() / time_us[rows, pick].sum())
        if abs(new - lam) <= 1e-12 * new:
            break
        lam = new
    # Keep each step's `pick` most worth drafts; the kept count of a request is
    # its kept drafts (a prefix, as worths do not grow with depth; a tie broken
    # against the prefix only moves a draft of equal worth).
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(order.shape[1]), order.shape), -1)
    keep = optional & (rank.reshape(steps, reqs, k) < pick[:, None, None])
    return replay(b, (keep | forced).sum(axis=-1), model)


def run_policies(b: Batches, model: Model, fixed_only: bool = False) -> dict[str, Outcome]:
    out = {"none": replay(b, b.n, model)}
    for t in TAUS:
        out[f"tau={t:.1f}"] = replay(b, tau_j(b, t, model), model)
    if not fixed_only:
        out["cost"] = replay(b, cost_j(b, model)[0], model)
        out["cost_uncalibrated"] = replay(b, cost_j(b, model, calibrate=False)[0], model)
        out["informed_bound"] = informed_bound(b, model)
        out["oracle"] = oracle(b, model)
    return out


def best_fixed_tau(results: dict[str, Outcome]) -> float:
    return max(TAUS, key=lambda t: results[f"tau={t:.1f}"].tokens_per_s)


def summarise(results: dict[str, Outcome], tuned_tau: float) -> dict:
    """``tuned_tau``: the fixed tau an operator would pick for this load, tuned
    on a separate draw of the same trace (the hindsight best is also given)."""
    hindsight = best_fixed_tau(results)
    tps = {name: o.tokens_per_s for name, o in results.items()}
    cost = tps["cost"]
    return {
        "tokens_per_s": tps,
        "accepted_per_req_step": {n: o.accepted_per_req_step for n, o in results.items()},
        "kept_frac": {n: o.kept_frac for n, o in results.items()},
        "best_tau": tuned_tau,
        "hindsight_tau": hindsight,
        "cost_vs_oracle": cost / tps["oracle"],
        "cost_vs_informed_bound": cost / tps["informed_bound"],
        "bound_vs_oracle": tps["informed_bound"] / tps["oracle"],
        "uncalibrated_vs_none": tps["cost_uncalibrated"] / tps["none"],
        "cost_vs_best_tau": cost / tps[f"tau={tuned_tau:.1f}"],
        "cost_vs_hindsight_tau": cost / tps[f"tau={hindsight:.1f}"],
        "cost_vs_none": cost / tps["none"],
        "oracle_vs_none": tps["oracle"] / tps["none"],
    }


def goals(row: dict) -> dict[str, bool]:
    """draft-trunc's goals (tokens/s and accepted tokens per step against off), in this model."""
    return {
        "within_5pct_of_oracle": row["cost_vs_oracle"] >= 0.95,
        "at_least_best_tau": row["cost_vs_best_tau"] >= 1.0 - 1e-9,
        "never_1pct_slower_than_none": row["cost_vs_none"] >= 0.99,
    }


def simulate(traces: list[Records], model: Model, sizes=BATCH_SIZES, seed=0, log=print, explore=0.05) -> list[dict]:
    rows = []
    for records in traces:
        for size in sizes:
            tune = draw(records, size, np.random.default_rng(seed + 10_000 + size), explore=explore)
            tuned = best_fixed_tau(run_policies(tune, model, fixed_only=True))
            b = draw(records, size, np.random.default_rng(seed + size), explore=explore)
            row = {
                "trace": records.source,
                "acceptance": records.acceptance,
                "conditional_acceptance": records.conditional_acceptance,
                "batch": size,
                "steps": int(b.n.shape[0]),
                **summarise(run_policies(b, model), tuned),
            }
            row["goals"] = goals(row)
            rows.append(row)
            log(
                f"{records.source:<24} R={size:<4} cost/oracle={row['cost_vs_oracle']:.3f} "
                f"cost/bound={row['cost_vs_informed_bound']:.3f} "
                f"bound/oracle={row['bound_vs_oracle']:.3f} "
                f"cost/tuned-tau({row['best_tau']:.1f})={row['cost_vs_best_tau']:.3f} "
                f"cost/hindsight-tau({row['hindsight_tau']:.1f})={row['cost_vs_hindsight_tau']:.3f} "
                f"cost/none={row['cost_vs_none']:.3f} "
                f"uncalibrated/none={row['uncalibrated_vs_none']:.3f} "
                f"oracle/none={row['oracle_vs_none']:.3f} | "
                f"tok/s cost {row['tokens_per_s']['cost']:.0f} none {row['tokens_per_s']['none']:.0f}, "
                f"accepted/req-step cost {row['accepted_per_req_step']['cost']:.2f} "
                f"none {row['accepted_per_req_step']['none']:.2f}"
            )
    return rows


def trace_grid(rows: list[dict], max_cols: int, cell: tuple[float, float]):
    """A matplotlib figure (Agg) with one panel per trace of ``rows``, in first-seen
    order: (figure, [(axes, trace name, that trace's rows)]). The panels a row of the
    grid leaves over are switched off; ``save_grid`` finishes the figure."""
    import matplotlib  # heavy: only when writing a plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = list(dict.fromkeys(r["trace"] for r in rows))
    cols = min(max_cols, len(traces))
    nrows = math.ceil(len(traces) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(cell[0] * cols, cell[1] * nrows), squeeze=False)
    for ax in list(axes.flat)[len(traces) :]:
        ax.axis("off")
    panels = [(ax, name, [r for r in rows if r["trace"] == name]) for ax, name in zip(axes.flat, traces, strict=False)]
    return fig, panels


def save_grid(fig, path: Path, title: str, fontsize: int) -> None:
    """The legend on the first panel, the title, and the PNG at ``path``."""
    import matplotlib.pyplot as plt

    fig.axes[0].legend(fontsize=fontsize - 3)
    fig.suptitle(title, fontsize=fontsize)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot(rows: list[dict], path: Path, title: str) -> None:
    fig, panels = trace_grid(rows, 3, (5, 3.6))
    for ax, name, rs in panels:
        x = [r["batch"] for r in rs]

        def rel(key, rs=rs):
            return [r["tokens_per_s"][key] / r["tokens_per_s"]["none"] for r in rs]

        ax.plot(x, rel("oracle"), "k--", label="oracle (knows outcomes)")
        ax.plot(x, rel("informed_bound"), "k:", label="informed bound (same information)")
        ax.plot(x, rel("cost"), "C3-o", ms=3, label="cost-aware (calibrated)")
        ax.plot(x, rel("cost_uncalibrated"), "C4-", alpha=0.6, label="cost-aware, raw predictions")
        best = [r["tokens_per_s"][f"tau={r['best_tau']:.1f}"] / r["tokens_per_s"]["none"] for r in rs]
        ax.plot(x, best, "C0-.", label="fixed tau tuned per load")
        ax.plot(x, rel("tau=0.3"), "C2-", alpha=0.6, label="tau=0.3")
        ax.plot(x, rel("tau=0.6"), "C1-", alpha=0.6, label="tau=0.6")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(
            f"{name}: per-draft acceptance {rs[0]['conditional_acceptance']:.2f}, "
            f"accepted/proposed {rs[0]['acceptance']:.2f}",
            fontsize=8,
        )
        ax.set_xlabel("verifying requests")
        ax.set_ylabel("tokens/s vs no truncation")
    save_grid(fig, path, title, 10)


def load_traces(paths: list[Path], k: int, rng, synthetic_records: int) -> list[Records]:
    traces = [synthetic(a, synthetic_records, k, rng) for a in ALPHAS]
    for path in paths:
        traces.append(read_trace(path))
    return traces


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument(
        "--trace",
        type=Path,
        action="append",
        default=None,
        help=f"JSONL trace(s); default: {TRACE_GLOB} next to this script",
    )
    ap.add_argument("--k", type=int, default=4, help="drafts per step of the synthetic traces")
    ap.add_argument(
        "--other-share",
        type=float,
        default=0.5,
        help="non-routed share of a fully verified step (assumption)",
    )
    ap.add_argument("--skew", type=float, default=0.0, help="Zipf skew of expert popularity")
    ap.add_argument(
        "--policy-skew",
        type=float,
        default=None,
        help="skew the policy assumes (default: --skew; differ to test a mismatch)",
    )
    ap.add_argument("--ep", type=int, default=1, help="expert-parallel ranks (1/ep of expert bytes)")
    ap.add_argument("--moe-layers", type=int, default=58)
    ap.add_argument(
        "--explore",
        type=float,
        default=0.05,
        help="share of request-steps verifying every draft (KILN_DRAFT_TRUNC_EXPLORE)",
    )
    ap.add_argument("--sizes", type=int, nargs="*", default=list(BATCH_SIZES))
    ap.add_argument("--quick", action="store_true", help="fewer records (a smoke run)")
    args = ap.parse_args(argv)
    paths = args.trace if args.trace is not None else sorted(HERE.glob(TRACE_GLOB))
    base = _cost.MoELayer()
    layer = _cost.MoELayer(base.experts, base.top_k, base.expert_bytes / args.ep, args.skew)
    believed = None
    if args.policy_skew is not None:
        believed = _cost.MoELayer(layer.experts, layer.top_k, layer.expert_bytes, args.policy_skew)
    model = Model(layer=layer, other_share=args.other_share, moe_layers=args.moe_layers, policy_layer=believed)
    rng = np.random.default_rng(0)
    traces = load_traces(paths, args.k, rng, 4_000 if args.quick else 100_000)
    start = time.monotonic()
    print(
        f"sim_trunc: {len(traces)} traces x {len(args.sizes)} batch sizes; "
        f"other_share={args.other_share} skew={args.skew} ep={args.ep}",
        flush=True,
    )
    rows = simulate(traces, model, args.sizes, log=lambda s: print(s, flush=True), explore=args.explore)
    args.out.mkdir(parents=True, exist_ok=True)
    tag = f"os{args.other_share:g}-skew{args.skew:g}-ep{args.ep}"
    if args.policy_skew is not None:
        tag += f"-policyskew{args.policy_skew:g}"
    meta = {
        "model": {
            "layer": vars(layer),
            "cost": vars(model.cost),
            "other_share": args.other_share,
            "moe_layers": args.moe_layers,
            "min_keep": model.min_keep,
            "explore": args.explore,
            "tau_grid": _cost.TAU_GRID,
        },
        "traces": [
            {
                "source": t.source,
                "records": len(t.n),
                "k": t.k,
                "acceptance": t.acceptance,
                "censored_dropped": t.censored,
            }
            for t in traces
        ],
        "rows": rows,
    }
    json_path = args.out / f"sim-trunc-{tag}.json"
    json_path.write_text(json.dumps(meta, indent=1))
    png_path = args.out / f"sim-trunc-{tag}.png"
    plot(rows, png_path, f"draft-trunc policies, H200 cost model ({tag})")
    met = {g: sum(r["goals"][g] for r in rows) for g in rows[0]["goals"]}
    worst = {
        "cost/oracle": min(r["cost_vs_oracle"] for r in rows),
        "cost/bound": min(r["cost_vs_informed_bound"] for r in rows),
        "cost/tuned-tau": min(r["cost_vs_best_tau"] for r in rows),
        "cost/hindsight-tau": min(r["cost_vs_hindsight_tau"] for r in rows),
        "cost/none": min(r["cost_vs_none"] for r in rows),
    }
    print(
        f"summary ({time.monotonic() - start:.0f} s): goals met over {len(rows)} cases: {met}; "
        f"worst ratios: " + ", ".join(f"{k}={v:.3f}" for k, v in worst.items())
    )
    print(f"wrote {json_path} and {png_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
