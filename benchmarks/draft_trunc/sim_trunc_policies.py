"""sim_trunc's step model and policies: the routed-expert cost of a verify step, batches drawn
from the traces, what each policy verifies (fixed tau, the cost policy, calibrated or not)
and the bounds above them (the informed bound, the oracle), replayed to tokens/s."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from kiln_engine.draft_trunc import _cost
from kiln_testkit import dt_cost
from kiln_testkit.scripts import load_script

sim_traces = load_script("benchmarks/draft_trunc/sim_trunc_traces.py")

TAUS = tuple(round(0.1 * i, 1) for i in range(10))


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


def draw(records: sim_traces.Records, batch: int, rng, target_records: int = 40_000, explore: float = 0.0) -> Batches:
    steps = max(64, target_records // batch)
    idx = rng.integers(0, len(records.n), size=(steps, batch))
    n = records.n[idx]
    explored = rng.random((steps, batch)) < explore
    return Batches(sim_traces.survival(records.p[idx], n), n, records.accepted[idx], explored)


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
