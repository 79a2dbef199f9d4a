"""sim_adaptive's rules, each a plan of what every request drafts and verifies in each drawn
step: vLLM's fixed K, batch-size schedule, confidence exit and adaptive verification,
draft-trunc's truncation and depth, kiln-av's calibrated verification, and the bounds
above every policy."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from kiln_engine.draft_trunc import _cost
from kiln_testkit import dt_cost
from kiln_testkit.scripts import load_script

costs = load_script("benchmarks/draft_trunc/sim_adaptive_costs.py")
sim_policies = load_script("benchmarks/draft_trunc/sim_trunc_policies.py")

# ----------------------------------------------------------------------------- plans


@dataclass
class Plan:
    """What a policy did on each step: drafts scheduled n [S, R], kept j [S, R],
    positions drafted depth [S] (for the drafting price)."""

    n: np.ndarray
    j: np.ndarray
    depth: np.ndarray


@dataclass
class Result:
    tokens: float
    time_us: float
    drafted: float  # drafting positions per step
    kept_frac: float  # kept / scheduled drafts

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / (self.time_us * 1e-6)


def replay(b, plan: Plan, model, drafter: costs.Drafter, draft_free: bool = False, extra_us: float = 0.0) -> Result:
    """``extra_us``: a price every step pays besides verifying and drafting (kiln-av's hook)."""
    acc = np.minimum(b.accepted, plan.j)
    tokens = (1 + plan.n).sum(axis=1)
    live = tokens - (plan.n - plan.j).sum(axis=1)
    t = model.step_us(live, tokens, b.reqs) + extra_us
    if not draft_free:
        t = t + drafter.step_us(model, b.reqs, plan.depth)
    return Result(
        tokens=float((1 + acc).sum()),
        time_us=float(t.sum()),
        drafted=float(np.mean(plan.depth)),
        kept_frac=float(plan.j.sum() / max(plan.n.sum(), 1)),
    )


def restrict(b, n: np.ndarray):
    """The steps with only the first n[s, r] drafts scheduled (survival 0 past n)."""
    pos = np.arange(b.surv.shape[-1])
    return sim_policies.Batches(np.where(pos < n[..., None], b.surv, 0.0), n, b.accepted, b.explored)


def fixed_k(b, k: int) -> Plan:
    n = np.minimum(b.n, k)
    return Plan(n, n, np.full(b.n.shape[0], k))


def schedule_k(table: dict[int, int], reqs: int) -> int:
    """vLLM's dense lookup: the K of the last profiled size <= reqs."""
    return table[max(r for r in table if r <= reqs)]


def conditional(surv: np.ndarray) -> np.ndarray:
    prev = np.concatenate([np.ones_like(surv[..., :1]), surv[..., :-1]], axis=-1)
    return np.where(prev > 0, surv / np.where(prev > 0, prev, 1.0), 0.0)


def confidence(b, theta: float) -> Plan:
    """Stop a request's drafting at its first draft with probability < theta;
    drafting runs while any request goes on (its low draft was drafted too)."""
    ok = conditional(b.surv) >= theta
    pos = np.arange(b.surv.shape[-1])
    n = np.minimum((np.cumprod(ok, axis=-1) * (pos < b.n[..., None])).sum(axis=-1), b.n)
    depth = np.minimum(n + 1, b.n).max(axis=1)
    return Plan(n, n, depth)


def dt_plan(
    b, model, drafter, base: Plan | None = None, depth_policy=False, seed=0, explore=0.05, chunk_reqs=64
) -> Plan:
    """draft-trunc's cost-aware truncation (and, with ``depth_policy``, its drafting
    depth) replayed in order, calibrating as on the device (sim_trunc.cost_j)."""
    bb = b if base is None else restrict(b, base.n)
    steps, reqs, k = bb.surv.shape
    layers = model.moe_layers
    hits, counts = np.zeros((k, _cost.TAU_GRID)), np.zeros((k, _cost.TAU_GRID))
    chunk = max(1, -(-chunk_reqs // reqs))
    j, depth = np.zeros_like(bb.n), bb.n.max(axis=1) if base is None else base.depth.copy()
    explored = bb.explored if bb.explored is not None else np.zeros(bb.n.shape, bool)
    deep = np.random.default_rng(seed + 7).random(steps) < explore  # steps drafting fully
    if depth_policy:  # ...and verifying fully: deep cells are graded only when verified
        explored = explored | deep[:, None]
    pos = np.arange(k)
    for start in range(0, steps, chunk):
        part = slice(start, start + chunk)
        surv, n = bb.surv[part], bb.n[part]
        opt = sim_policies.optional_drafts(bb, model, surv, n, explored[part])
        values = dt_cost.calibrated_values(hits, counts)
        args = (bb.tokens[part], reqs, model.policy_table, model.cost, model.ratio, values)
        if depth_policy:
            d = n.max(axis=1)
            prices = [drafter.step_us(model, reqs, d) / layers for d in range(k + 1)]
            for s in range(k - 1, 0, -1):
                go = dt_cost.depth_continue(surv, opt, n, s, *args, prices)
                d = np.where(go | (n.max(axis=1) <= s), d, s)
            depth[part] = np.where(deep[part], n.max(axis=1), d)
        made = pos < depth[part, None, None]
        nd = np.minimum(n, depth[part, None])
        tau = dt_cost.cost_aware_tau(
            np.where(made, surv, 0.0),
            opt & made,
            *args,
            drafter.step_us(model, reqs, depth[part]) / layers,
            (n - nd).sum(axis=-1),
        )
        kept = np.where(explored[part], nd, sim_policies.rule_j(np.where(made, surv, 0.0), nd, tau, model.min_keep))
        j[part] = kept
        dt_cost.calibration_update(hits, counts, surv, kept, np.minimum(bb.accepted[part], kept))
    return Plan(bb.n, j, depth)


# ----------------------------------------------------------------------------- variable-length verify


def _budget(worth, n, reqs, model, draft_us, forced=None) -> np.ndarray:
    """Admitted drafts [S, R] under a per-step draft budget B: the B slots of highest
    ``worth`` (a prefix of each request: worth falls along it), B maximising (R + their
    worth) / (drafting + verifying R + B tokens). ``forced`` [S, R]: requests whose
    drafts are all admitted first (exploration)."""
    steps, r, k = worth.shape
    valid = np.arange(k) < n[..., None]
    w = np.where(valid, worth, 0.0)
    key = np.where(valid, w, -1.0)
    nf = np.zeros(steps, int)
    if forced is not None:
        key = np.where(valid & forced[..., None], 2.0 + key, key)
        nf = np.where(forced, n, 0).sum(axis=1)
    order = np.argsort(-key.reshape(steps, -1), axis=1, kind="stable")
    gain = np.concatenate([np.zeros((steps, 1)), np.cumsum(np.take_along_axis(w.reshape(steps, -1), order, 1), 1)], 1)
    x = np.arange(r * k + 1)[None, :]
    ok = (x <= n.sum(axis=1)[:, None]) & (x >= nf[:, None])
    t = model.step_us(r + x, r + x, reqs) + np.asarray(draft_us, dtype=np.float64)[:, None]
    best = np.where(ok, (r + gain) / t, -np.inf).argmax(axis=1)
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.broadcast_to(np.arange(r * k), order.shape), 1)
    return (ranks < best[:, None]).reshape(steps, r, k).sum(axis=-1)


def adaptive_verification(b, model, drafter, base: Plan) -> Plan:
    """vLLM's adaptive verification (``speculative_config.enable_adaptive_verification``,
    shipped in 0.32.0 and 0.33.0: ``vllm/v1/worker/gpu/spec_decode/adaptive_verification.py``).
    Each step it sizes a draft budget from the estimator's survivals and its profiled
    cost curves, admits the best slots and verifies only those: the batch shrinks to
    R + B tokens (variable-length verify, with its own CUDA graphs), so a cut draft
    saves every per-token cost, not only the routed experts. Drafting is unchanged.
    Modelled generously: fresh survivals (vLLM sizes the budget from the previous
    step's) and this model's true prices (vLLM's profile marks its dummy tokens as MoE
    padding, so its verify curve leaves out the routed experts)."""
    bb = restrict(b, base.n)
    adm = _budget(bb.surv, bb.n, b.reqs, model, drafter.step_us(model, b.reqs, base.depth))
    return Plan(adm, adm, base.depth.copy())


def calibrated_av(b, model, drafter, base: Plan, prior=costs.AV_PRIOR, chunk_reqs=64) -> Plan:
    """kiln's rule through the same variable-length verify: adaptive verification fed
    survivals corrected by draft-trunc's calibration, as the engine's
    ``av_confidences`` does. A draft whose predicted survival S falls in cell (position,
    bin) is worth S x the cell's calibrated rate / the bin's middle (the rate shrunk to
    the middle with ``prior`` pseudo-drafts: a calibrated estimator is left nearly as
    it is). Graded as draft-trunc grades under adaptive verification: the verified
    (admitted) drafts only; no exploration of its own."""
    bb = restrict(b, base.n)
    steps, reqs, k = bb.surv.shape
    hits, counts = np.zeros((k, _cost.TAU_GRID)), np.zeros((k, _cost.TAU_GRID))
    pos = np.arange(k)
    mids = (np.arange(_cost.TAU_GRID) + 0.5) / _cost.TAU_GRID
    chunk = max(1, -(-chunk_reqs // reqs))
    adm = np.zeros_like(bb.n)
    for start in range(0, steps, chunk):
        part = slice(start, start + chunk)
        surv, n = bb.surv[part], bb.n[part]
        bins = dt_cost.survival_bins(surv)
        ratio = dt_cost.calibrated_values(hits, counts, prior) / mids
        worth = np.minimum.accumulate(np.clip(surv * ratio[pos, bins], 0.0, 1.0), axis=-1)
        adm[part] = _budget(worth, n, reqs, model, drafter.step_us(model, reqs, base.depth[part]))
        dt_cost.calibration_update(hits, counts, surv, adm[part], np.minimum(bb.accepted[part], adm[part]))
    return Plan(adm, adm, base.depth.copy())


# ----------------------------------------------------------------------------- bounds


def _dinkelbach(tokens: np.ndarray, time_us: np.ndarray, valid: np.ndarray, iters=60):
    """Per-step choice maximising total tokens / total time over the run."""
    rows = np.arange(tokens.shape[0])
    lam = 0.0
    for _ in range(iters):
        pick = np.where(valid, tokens - lam * time_us, -np.inf).reshape(len(rows), -1).argmax(1)
        t, u = tokens.reshape(len(rows), -1), time_us.reshape(len(rows), -1)
        new = float(t[rows, pick].sum() / u[rows, pick].sum())
        if abs(new - lam) <= 1e-12 * new:
            break
        lam = new
    return float(t[rows, pick].sum()), float(u[rows, pick].sum())


def bound(b, model, drafter, oracle: bool) -> Result:
    """Per step, any drafting depth D (0: the first pass only) and any x drafts kept among
    the first D of each request, dead tokens free (scheduled = live). The informed
    bound keeps drafts by their cell's true rate; the oracle keeps accepted ones."""
    steps, reqs, k = b.surv.shape
    pos = np.arange(k)
    worth = (
        (pos < b.accepted[..., None]).astype(float)
        if oracle
        else np.minimum.accumulate(sim_policies.cell_rates(b), axis=-1)
    )
    toks, times, valid = [], [], []
    for d in range(k + 1):
        inside = pos < np.minimum(b.n, d)[..., None]
        best = -np.sort(-np.where(inside, worth, -1.0).reshape(steps, -1), axis=-1)
        gain = np.concatenate([np.zeros((steps, 1)), np.cumsum(np.maximum(best, 0), -1)], -1)
        x = np.arange(gain.shape[1])[None, :]
        live = reqs + x + np.zeros((steps, 1), int)
        # D = 0 still pays the drafter's first pass: without it the draft's KV cache
        # falls behind (vLLM runs it at K = 0 too)
        t = model.step_us(live, live, reqs) + drafter.step_us(model, reqs, d)
        toks.append(reqs + gain)
        times.append(t)
        valid.append(x <= inside.reshape(steps, -1).sum(-1)[:, None])
    tokens, time_us = _dinkelbach(np.stack(toks, 1), np.stack(times, 1), np.stack(valid, 1))
    return Result(tokens, time_us, float("nan"), float("nan"))
