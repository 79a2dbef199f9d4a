"""draft-trunc against the adaptive speculation vLLM ships, in sim_trunc's
trace-driven model, with drafting priced.

A step now costs verification (sim_trunc's routed-expert model, other share of the
verify forward) plus drafting: ``Drafter.step_us``, the first drafting position (the
drafter's pass over the verified window, which vLLM runs even at K = 0 to keep the
draft's KV cache in step) and each further position, as a share of a fully verified
step at the same batch (fitted to an H200: ``bench_draft.py``, ``drafter_fit``; or a
constant for the sensitivity sweep). Every policy replays the same drawn steps:

- none: K = 4 drafted and verified; no-spec: no drafter at all (context);
- K=k: a fixed number of drafts (vLLM's num_speculative_tokens); vllm-best-K: the
  best k for this load in hindsight (the best any batch-size schedule can do);
- vllm-schedule: vLLM's num_speculative_tokens_per_batch_size as an operator would
  profile it: K chosen at batch sizes 1, 4, 16, 64, 256 on a profiling trace, carried
  forward between them (vllm/v1/spec_decode/dynamic/utils.py), applied to every trace;
- vllm-av: vLLM's adaptive verification (``enable_adaptive_verification``, shipped in
  0.32.0/0.33.0) on its best K: a per-step draft budget from the estimator's
  survivals and the step costs, the best slots verified, the batch shrunk to them
  (variable-length verify); vllm-schedule+av: on the operator's schedule;
- kiln-av: the same variable-length verify with draft-trunc's calibration correcting
  each survival before the budget is sized (``calibrated_av``), as the engine runs it:
  its hook priced per step (``--av-hook``: bench_av.py's measurement of the eager,
  compiled or fused hook, or none) and stepping aside below ``--av-min-batch``
  requests (``KILN_DRAFT_TRUNC_AV_MIN_BATCH``, where it is adaptive verification);
  kiln-av@P: the rule at every batch under each price P the measurement holds, and
  none; vllm-av+dt: vLLM's adaptive verification with draft-trunc masking within
  what it admits;
- confidence: vllm#35301's early exit (a request stops drafting at its first draft
  whose probability is below a threshold; drafting runs while any request goes on;
  each request verifies its own drafts), threshold tuned per load on a separate draw;
- dt: draft-trunc's cost-aware truncation (K = 4 drafted, a prefix verified), with
  drafting in its prices; X+dt: on top of upstream rule X;
- dt-depth: draft-trunc deciding how far to draft as well (``dt_cost.depth_continue``
  after each drafted position), shapes unchanged (undrafted tokens are dead);
  schedule+dt-depth: the same within vLLM's schedule;
- bound: the informed bound (each draft worth its (position, bin) cell's true rate,
  any depth, any prefix, dead tokens free, priced at the run's optimal rate);
  oracle: knows the outcomes.

Upstream rules are credited with the drafting they skip ("credited"), as vLLM's MTP
drafter does. vLLM 0.32.0/0.33.0's draft_model drafter (StandaloneARSpeculator) drafts
all K positions whatever the schedule says ("shipped" variants, in the JSON).

Usage: python benchmarks/draft_trunc/sim_adaptive.py [--drafter FIT.json | --draft-share S]
[--av-hook eager|compiled|fused|none] (``nox -s sim_adaptive``). Writes
sim-adaptive-*.json, .md, .png and -avhook.png (kiln-av against adaptive verification
under each hook price), prints ratios and the smallest batch from which kiln-av wins
under each price.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from kiln_engine.draft_trunc import _cost
from kiln_engine.features import DRAFT_TRUNC
from kiln_testkit import dt_cost
from kiln_testkit.scripts import load_script

st = load_script("benchmarks/draft_trunc/sim_trunc.py")

HERE = Path(__file__).resolve().parent
K = 4
PROFILE_SIZES = (1, 4, 16, 64, 256)  # vLLM's generate_config.py default batch sizes
PROFILE_TRACE = "synthetic-a0.7"
# kiln-av: shrinkage of each cell's correction toward none (pseudo-drafts; 8, what
# draft-trunc's truncation uses, lost up to 0.4% to noise on calibrated traffic)
AV_PRIOR = 64.0
THETAS = tuple(round(0.1 * i, 1) for i in range(10))
# the rules vLLM 0.32.0/0.33.0 ship: the batch-size schedule (as profiled, and its
# hindsight best K) and adaptive verification (on the best K, and on the schedule)
SHIPPED = ("vllm-schedule", "vllm-best-K", "vllm-av", "vllm-schedule+av")
UPSTREAM = (*SHIPPED, "confidence")  # and vllm#35301's exit, in no released vLLM
# kiln-av's hook, measured on an H100 (bench_av.py): eager and compiled, and fused once
# a run of the fused kernel is committed; the engine's default for stepping aside
HOOK_PRICES = HERE / "results-2026-12-07-h100-av-hook-fused.json"
AV_MIN_BATCH = next(k.default for k in DRAFT_TRUNC.knobs if k.name == "av_min_batch")


@dataclass(frozen=True)
class Drafter:
    """What drafting costs: ``_cost.DraftCost`` (the engine's own arithmetic, the
    KILN_DRAFT_TRUNC_DRAFT_COST knob), shares of a fully verified step at the same
    batch: one further position costs ``share``, the first pass ``first`` such
    shares; D >= 1 positions cost share x (first + D - 1), D = 0 pays the first pass
    (vLLM keeps the draft's KV cache in step)."""

    name: str
    cost: _cost.DraftCost

    def share(self, reqs: int) -> float:
        return self.cost.at(reqs)[0]

    def first(self, reqs: int) -> float:
        return self.cost.at(reqs)[1]

    def step_us(self, model, reqs: int, depth) -> np.ndarray:
        full = float(model.step_us(reqs * (1 + K), reqs * (1 + K), reqs))
        share, first = self.cost.at(reqs)
        d = np.asarray(depth, dtype=np.float64)
        return full * share * (first + np.maximum(d - 1, 0))

    @property
    def knob(self) -> str:
        """The KILN_DRAFT_TRUNC_DRAFT_COST value that prices drafting as here."""
        return ",".join(f"{r}:{s:.4g}:{f:.3g}" for r, s, f in self.cost.points)


def constant_drafter(share: float) -> Drafter:
    return Drafter(f"share{share:g}", _cost.DraftCost(((1, share, 1.0),)))


def table_drafter(name: str, points: dict[int, tuple[float, float]]) -> Drafter:
    """Shares measured at some batch sizes, interpolated in log(batch)."""
    return Drafter(name, _cost.DraftCost(tuple((r, *points[r]) for r in sorted(points))))


@dataclass(frozen=True)
class HookPrice:
    """What kiln-av's hook costs a step, as a share of a fully verified step at the same
    batch (``bench_av.py``'s ``share_of_step``: the larger of its GPU and host time over
    the TP-8 verify step ``fit_draft.py`` prices), measured at some batch sizes,
    interpolated in log(batch) and held flat past the ends."""

    name: str
    points: tuple[tuple[int, float], ...]

    def share(self, reqs: int) -> float:
        xs = np.log([r for r, _ in self.points])
        return float(np.interp(np.log(reqs), xs, [v for _, v in self.points]))

    def step_us(self, model, reqs: int) -> float:
        return float(model.step_us(reqs * (1 + K), reqs * (1 + K), reqs)) * self.share(reqs)


NO_HOOK_PRICE = HookPrice("none", ((1, 0.0),))


def hook_prices(path: Path) -> dict[str, HookPrice]:
    """Every variant a bench_av.py result prices (``<variant>_share_of_step``), and none."""
    rows = json.loads(path.read_text())["rows"]
    suffix = "_share_of_step"
    names = dict.fromkeys(k[: -len(suffix)] for row in rows for k in row if k.endswith(suffix))
    prices = {"none": NO_HOOK_PRICE}
    for name in names:
        points = tuple(
            (int(row["requests"]), float(row[name + suffix]))
            for row in rows
            if row.get(name + suffix) is not None and np.isfinite(row[name + suffix])
        )
        prices[name] = HookPrice(name, points)
    return prices


class AdaptiveModel(st.Model):
    """sim_trunc's verify-step model, with the non-routed time depending on how many
    tokens are scheduled, which a shorter K changes (truncation never does).

    ``other_share`` still fixes the non-routed time at full verification (N_full = R x
    (1 + K) tokens); a share phi(R) of it grows with the tokens (attention, shared
    expert and lm_head arithmetic), the rest is paid whatever N is (their weights, the
    KV cache reads, the runner): other(N) = other(N_full) x (1 - phi + phi N / N_full),
    phi = N_full / (N_full + other_half), ``other_half`` fitted to the H200
    (``bench_draft.py``: where the measured non-routed time is half per-token)."""

    def __init__(self, other_half: float, **kw):
        super().__init__(**kw)
        self.other_half = other_half

    def phi(self, reqs: int) -> float:
        full = reqs * (1 + K)
        return full / (full + self.other_half)

    def step_us(self, live, tokens, reqs=None):  # type: ignore[override]
        live = np.clip(live, 0, self.max_tokens).astype(int)
        tokens = np.asarray(tokens).astype(int)
        if reqs is None:  # sim_trunc's callers: other at the scheduled tokens
            return super().step_us(live, tokens)
        full = reqs * (1 + K)
        shared = self.cost.t_fixed + self.cost.t_token * tokens
        other_full = self.ratio * (self.table[full] + self.cost.t_fixed + self.cost.t_token * full)
        phi = self.phi(reqs)
        other = other_full * (1 - phi + phi * tokens / full)
        return self.moe_layers * (shared + other + self.table[live])


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


def replay(b, plan: Plan, model, drafter: Drafter, draft_free: bool = False, extra_us: float = 0.0) -> Result:
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
    return st.Batches(np.where(pos < n[..., None], b.surv, 0.0), n, b.accepted, b.explored)


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
        opt = st.optional_drafts(bb, model, surv, n, explored[part])
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
        kept = np.where(explored[part], nd, st.rule_j(np.where(made, surv, 0.0), nd, tau, model.min_keep))
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


def calibrated_av(b, model, drafter, base: Plan, prior=AV_PRIOR, chunk_reqs=64) -> Plan:
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
    worth = (pos < b.accepted[..., None]).astype(float) if oracle else np.minimum.accumulate(st.cell_rates(b), axis=-1)
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


# ----------------------------------------------------------------------------- one load


def upstream_choices(b, model, drafter) -> tuple[dict[int, float], dict[float, float]]:
    """tokens/s of each fixed K and each confidence threshold on these steps."""
    ks = {k: replay(b, fixed_k(b, k), model, drafter).tokens_per_s for k in range(K + 1)}
    th = {t: replay(b, confidence(b, t), model, drafter).tokens_per_s for t in THETAS}
    return ks, th


def _best_over_k(b, model, drafter, plan_at) -> tuple[Plan, int]:
    """The plan of ``plan_at(k)`` at the best K for these steps (k = 0..K), and that K:
    a rule profiled on its own traffic, as ``vllm-best-K``."""
    plans = {k: plan_at(k) for k in range(K + 1)}
    tps = {k: replay(b, p, model, drafter).tokens_per_s for k, p in plans.items()}
    k = max(tps, key=tps.get)
    return plans[k], k


def kiln_av_results(b, model, drafter, prices: dict[str, HookPrice], seed, explore):
    """kiln-av, and kiln-av with draft-trunc's truncation within it (its configuration),
    on the best K for these steps under each hook price (the price moves the best K only
    where K = 0, which records no confidences and so runs no hook, comes close): results
    ``kiln-av@P`` and ``kiln-av+dt@P``, and the K each price chose."""
    plans = {k: calibrated_av(b, model, drafter, fixed_k(b, k)) for k in range(K + 1)}
    with_dt: dict[int, Plan] = {}
    out, ks = {}, {}
    for name, price in prices.items():
        hook_us = price.step_us(model, b.reqs)

        def run(plan, k, hook_us=hook_us):
            return replay(b, plan, model, drafter, extra_us=hook_us if k > 0 else 0.0)

        tps = {k: run(p, k).tokens_per_s for k, p in plans.items()}
        k = ks[name] = max(tps, key=tps.get)
        out[f"kiln-av@{name}"] = run(plans[k], k)
        if k not in with_dt:
            with_dt[k] = dt_plan(b, model, drafter, plans[k], seed=seed, explore=explore)
        out[f"kiln-av+dt@{name}"] = run(with_dt[k], k)
    return out, ks


def run_load(
    records, reqs, model, drafter, table, seed, explore, steps=40_000, prices=None, hook="none", min_batch=1
) -> dict:
    """Every policy on one trace at one load. kiln-av and kiln-av+dt as the engine runs
    them: the hook priced at ``prices[hook]``, adaptive verification alone below
    ``min_batch`` requests (the hook steps aside)."""
    prices = prices or {"none": NO_HOOK_PRICE}
    tune = st.draw(records, reqs, np.random.default_rng(seed + 10_000 + reqs), steps, explore)
    _, tuned_th = upstream_choices(tune, model, drafter)
    theta = max(tuned_th, key=tuned_th.get)
    b = st.draw(records, reqs, np.random.default_rng(seed + reqs), steps, explore)
    ks, _ = upstream_choices(b, model, drafter)
    best_k = max(ks, key=ks.get)
    plans = {
        "none": fixed_k(b, K),
        "vllm-schedule": fixed_k(b, schedule_k(table, reqs)),
        "vllm-best-K": fixed_k(b, best_k),
        "confidence": confidence(b, theta),
    }
    plans["vllm-schedule+av"] = adaptive_verification(b, model, drafter, plans["vllm-schedule"])
    plans["vllm-av"], av_k = _best_over_k(
        b, model, drafter, lambda k: adaptive_verification(b, model, drafter, fixed_k(b, k))
    )
    for name in UPSTREAM:
        plans[f"{name}+dt"] = dt_plan(b, model, drafter, plans[name], seed=seed, explore=explore)
    plans["dt"] = dt_plan(b, model, drafter, seed=seed, explore=explore)
    plans["dt-depth"] = dt_plan(b, model, drafter, depth_policy=True, seed=seed, explore=explore)
    for name in ("vllm-schedule", "vllm-best-K"):
        plans[f"{name}+dt-depth"] = dt_plan(
            b, model, drafter, plans[name], depth_policy=True, seed=seed, explore=explore
        )
    out = {name: replay(b, p, model, drafter) for name, p in plans.items()}
    kav, kav_ks = kiln_av_results(b, model, drafter, prices, seed, explore)
    out.update(kav)
    # the engine's configuration: truncation keeps running within what the calibrated
    # budget admits (KILN_DRAFT_TRUNC_WITH_AV=1), on the same calibration; below the
    # minimum batch the hook leaves vLLM's confidences alone
    aside = reqs < min_batch
    out["kiln-av"] = out["vllm-av"] if aside else kav[f"kiln-av@{hook}"]
    out["kiln-av+dt"] = out["vllm-av+dt"] if aside else kav[f"kiln-av+dt@{hook}"]
    out["no-spec"] = replay(b, Plan(0 * b.n, 0 * b.n, np.zeros(b.n.shape[0])), model, drafter, draft_free=True)
    # vLLM 0.32.0/0.33.0's draft_model drafter drafts all K whatever the schedule
    for name in ("vllm-schedule", "vllm-best-K"):
        p = plans[name]
        out[f"{name}/shipped"] = replay(b, Plan(p.n, p.j, np.full_like(p.depth, K)), model, drafter)
    out["bound"] = bound(b, model, drafter, oracle=False)
    out["oracle"] = bound(b, model, drafter, oracle=True)
    tps = {name: r.tokens_per_s for name, r in out.items()}
    best_up = max(tps[n] for n in UPSTREAM)
    return {
        "batch": reqs,
        "steps": int(b.n.shape[0]),
        "tokens_per_s": tps,
        "drafted": {n: r.drafted for n, r in out.items()},
        "kept_frac": {n: r.kept_frac for n, r in out.items()},
        "schedule_k": schedule_k(table, reqs),
        "best_k": best_k,
        "av_k": av_k,
        "kiln_av_k": av_k if aside else kav_ks[hook],
        "kiln_av_k_by_price": kav_ks,
        "hook_share": {name: p.share(reqs) for name, p in prices.items()},
        "av_stepped_aside": aside,
        "theta": theta,
        "vs_best_upstream": {n: v / best_up for n, v in tps.items()},
        "best_upstream": max(UPSTREAM, key=lambda n: tps[n]),
    }


# kiln's configurations a recipe can set, each profiled on the recipe's own traffic
# (the best K at each load, as ``vllm-best-K``), simplest first:
CONFIGS = {
    "schedule+dt": "vllm-best-K+dt",  # vLLM's schedule, draft-trunc masking on top
    "schedule+dt-depth": "vllm-best-K+dt-depth",  # ... and deciding how far to draft
    "av+dt": "vllm-av+dt",  # vLLM's adaptive verification, draft-trunc masking within
    # adaptive verification's budget from draft-trunc's calibration, truncation within
    # it (KILN_DRAFT_TRUNC_AV_CALIBRATE=1)
    "kiln-av": "kiln-av+dt",
}


def kiln_config(row: dict, config: str) -> dict[str, float]:
    """kiln's configuration ``config`` (a CONFIGS key) in one case: its ratio to the
    best rule vLLM ships, and to the best upstream rule including the confidence exit
    (vllm#35301, in no released vLLM)."""
    t = row["tokens_per_s"]
    mine = t[CONFIGS[config]]
    return {"vs_shipped": mine / max(t[n] for n in SHIPPED), "vs_upstream": mine / max(t[n] for n in UPSTREAM)}


def recipe_config(rows: list[dict]) -> str:
    """One configuration per recipe, not per case: the one with the best worst case
    against every upstream rule (a simpler one on a tie within 0.1%)."""
    worst = {c: min(kiln_config(r, c)["vs_upstream"] for r in rows) for c in CONFIGS}
    top = max(worst.values())
    return next(c for c in CONFIGS if worst[c] >= top - 1e-3)


def _tag(row: dict) -> str:
    best = row["best_upstream"]
    return {
        "vllm-best-K": f"K{row['best_k']}",
        "vllm-schedule": f"S{row['schedule_k']}",
        "vllm-av": f"AV{row['av_k']}",
        "vllm-schedule+av": f"SAV{row['schedule_k']}",
    }.get(best, f"C{row['theta']:.1f}")


def tables(rows: list[dict]) -> str:
    """The markdown tables of docs/draft-trunc-policy.md section 4, from one run."""
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    sizes = sorted({r["batch"] for r in rows})
    config = recipe_config(rows)
    head = "| trace | " + " | ".join(f"R={s}" for s in sizes) + " |\n|---|" + "---|" * len(sizes)
    at = {(r["trace"], r["batch"]): r for r in rows}

    def table(cell) -> list[str]:
        return [head] + [f"| {tr} | " + " | ".join(cell(at[tr, s]) for s in sizes) + " |" for tr in traces]

    def main(r):
        return f"{_tag(r)}: {kiln_config(r, config)['vs_upstream']:.3f}"

    def configs(r):
        return " / ".join(f"{kiln_config(r, c)['vs_upstream']:.3f}" for c in CONFIGS)

    def more(r):
        v = r["vs_best_upstream"]
        return f"{v['vllm-best-K']:.3f} / {v['confidence']:.3f} / {v['bound']:.3f} / {v['no-spec']:.2f}"

    out = [
        (
            f"kiln's configuration ({config}, profiled on the traffic) against the best "
            "upstream rule (Kk: fixed k, Sk: the operator's schedule, AVk: adaptive "
            "verification on k drafts, SAVk: on the schedule, Cθ: the confidence exit)"
        ),
        "",
    ]
    out += [*table(main), ""]
    out += [" / ".join(CONFIGS) + " against the best upstream rule", ""]
    out += [*table(configs), ""]
    out += ["best fixed K / confidence exit / informed bound / no speculation, against the best upstream rule", ""]
    out += [*table(more), ""]
    prices = list(rows[0]["hook_share"])
    out += [
        "kiln-av against vLLM's adaptive verification (each on its best K, kiln-av at every "
        "batch), its hook priced: " + " / ".join(prices),
        "",
    ]
    out += table(lambda r: " / ".join(f"{v:.3f}" for v in kiln_av_vs_av(r).values()))
    return "\n".join(out) + "\n"


def _span(values) -> list[float]:
    values = list(values)
    return [min(values, default=float("nan")), max(values, default=float("nan"))]


def summary(rows: list[dict]) -> dict:
    """The goal checks over one run: draft-trunc on top of each of vLLM's rules, and drafting priced."""
    config = recipe_config(rows)
    k = [kiln_config(r, config) for r in rows]
    real = [(r, c) for r, c in zip(rows, k, strict=True) if not r["trace"].startswith("synthetic") and r["batch"] <= 4]
    return {
        "config": config,
        "configs_worst": {c: min(kiln_config(r, c)["vs_upstream"] for r in rows) for c in CONFIGS},
        "kiln_vs_shipped": _span(c["vs_shipped"] for c in k),
        "kiln_vs_upstream": _span(c["vs_upstream"] for c in k),
        "below_1": sum(c["vs_upstream"] < 0.9995 for c in k),
        "real_small_kiln": _span(c["vs_upstream"] for _, c in real),
        "real_small_bound": _span(r["vs_best_upstream"]["bound"] for r, _ in real),
        "av_vs_schedule": _span(r["tokens_per_s"]["vllm-av"] / r["tokens_per_s"]["vllm-best-K"] for r in rows),
        "sched_dtd_vs_sched": _span(
            r["tokens_per_s"]["vllm-schedule+dt-depth"] / r["tokens_per_s"]["vllm-schedule"] for r in rows
        ),
        "dt_depth_alone": _span(r["vs_best_upstream"]["dt-depth"] for r in rows),
        "av_hook": hook_summary(rows),
    }


def kiln_av_vs_av(row: dict, with_dt: bool = False) -> dict[str, float]:
    """kiln-av (the rule at this batch, no stepping aside) against vLLM's adaptive
    verification, each on its best K, under each hook price; ``with_dt``: both with
    draft-trunc's truncation within."""
    t = row["tokens_per_s"]
    suffix = "+dt" if with_dt else ""
    return {p: t[f"kiln-av{suffix}@{p}"] / t[f"vllm-av{suffix}"] for p in row["hook_share"]}


def min_batch(rows: list[dict], price: str) -> int:
    """The batch below which kiln-av should step aside, its hook priced at ``price``: the
    threshold T that maximises kiln-av's configuration (with draft-trunc within) against
    adaptive verification's (with draft-trunc within) summed over the batches from T up
    (log of the geometric mean over the real traces at each batch; below T the two are
    the same rule). Real traces only: there the estimator is wrong, which is where
    kiln-av is for; on calibrated traffic it ties and its hook only costs, at any batch,
    which no threshold on the batch can tell apart. The smallest T on a tie."""
    real = [r for r in rows if not r["trace"].startswith("synthetic")]
    sizes = sorted({r["batch"] for r in real})
    gain = [
        float(np.mean([np.log(kiln_av_vs_av(r, with_dt=True)[price]) for r in real if r["batch"] == s])) for s in sizes
    ]
    # on from sizes[i]: the gains from i on; past every size (T above them all): 0
    totals = [sum(gain[i:]) for i in range(len(sizes))] + [0.0]
    best = int(np.argmax(totals))
    return sizes[best] if best < len(sizes) else sizes[-1] * 2


def hook_summary(rows: list[dict]) -> dict:
    """Per hook price: kiln-av against adaptive verification (the span over every case, and
    over the real traces at 1-2 requests) and the minimum batch the model names."""
    out = {}
    for price in rows[0]["hook_share"]:
        real_small = [
            kiln_av_vs_av(r)[price] for r in rows if not r["trace"].startswith("synthetic") and r["batch"] <= 2
        ]
        out[price] = {
            "kiln_av_vs_av": _span(kiln_av_vs_av(r)[price] for r in rows),
            "real_small": _span(real_small),
            "min_batch": min_batch(rows, price),
        }
    return out


def profile_schedule(records, model, drafter, seed, explore, steps=40_000) -> dict[int, int]:
    """The operator's batch-size -> K table, profiled on one trace."""
    table = {}
    for reqs in PROFILE_SIZES:
        b = st.draw(records, reqs, np.random.default_rng(seed + 20_000 + reqs), steps, explore)
        ks, _ = upstream_choices(b, model, drafter)
        table[reqs] = max(ks, key=ks.get)
    return table


# ----------------------------------------------------------------------------- output


def plot(rows: list[dict], path: Path, title: str) -> None:
    fig, panels = st.trace_grid(rows, 4, (4.6, 3.4))
    lines = [
        ("bound", "k:", "informed bound"),
        (
            "kiln-av+dt",
            "C3-o",
            (
                "kiln: AV budget from draft-trunc's calibration + draft-trunc "
                "(hook priced, steps aside below the minimum batch)"
            ),
        ),
        ("kiln-av+dt@none", "C3:", "kiln, its hook free"),
        ("vllm-av+dt", "C1-", "adaptive verification + draft-trunc"),
        ("vllm-best-K+dt", "C2--", "best K + draft-trunc"),
        ("vllm-av", "C4-.", "vLLM adaptive verification (best K)"),
        ("vllm-best-K", "C0:", "vLLM best K (hindsight)"),
        ("vllm-schedule", "C0-.", "vLLM schedule (profiled)"),
        ("confidence", "C5-.", "confidence exit (tuned)"),
        ("none", "C7-", "K=4, no truncation"),
    ]
    for ax, name, rs in panels:
        x = [r["batch"] for r in rs]
        for key, style, label in lines:
            ax.plot(x, [r["vs_best_upstream"][key] for r in rs], style, ms=3, label=label)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(name, fontsize=8)
        ax.set_xlabel("verifying requests")
        ax.set_ylabel("tokens/s vs best upstream rule")
    st.save_grid(fig, path, title, 9)


def plot_hook(rows: list[dict], path: Path, title: str) -> None:
    """kiln-av against adaptive verification by batch, one curve per hook price."""
    fig, panels = st.trace_grid(rows, 4, (4.6, 3.4))
    styles = {"none": "k:", "eager": "C3-o", "compiled": "C1-s", "fused": "C2-^", "hook": "C0-v", "hook_timed": "C4-x"}
    for ax, name, rs in panels:
        x = [r["batch"] for r in rs]
        for price in rs[0]["hook_share"]:
            ax.plot(
                x,
                [kiln_av_vs_av(r)[price] for r in rs],
                styles.get(price, "C7-"),
                ms=3,
                label=f"hook: {price}" if price != "none" else "hook free",
            )
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(name, fontsize=8)
        ax.set_xlabel("verifying requests")
        ax.set_ylabel("kiln-av tokens/s vs adaptive verification")
    st.save_grid(fig, path, title, 9)


def simulate(
    traces, model, drafter, sizes, seed, explore, log=print, steps=40_000, prices=None, hook="none", min_batch=1
) -> tuple[list, dict]:
    prof = next(t for t in traces if t.source == PROFILE_TRACE)
    table = profile_schedule(prof, model, drafter, seed, explore, steps)
    log(f"operator's schedule (profiled on {PROFILE_TRACE}): {table}")
    rows = []
    for records in traces:
        for reqs in sizes:
            row = {
                "trace": records.source,
                **run_load(records, reqs, model, drafter, table, seed, explore, steps, prices, hook, min_batch),
            }
            rows.append(row)
            v = row["vs_best_upstream"]
            hooks = " ".join(f"{p} {r:.3f}" for p, r in kiln_av_vs_av(row).items())
            log(
                f"{records.source:<20} R={reqs:<4} best upstream={row['best_upstream']:<13} "
                f"K*={row['best_k']} sched={row['schedule_k']} th={row['theta']:.1f} | "
                f"AV*={row['av_k']} | kiln-av+dt {v['kiln-av+dt']:.3f} kiln-av {v['kiln-av']:.3f} "
                f"av+dt {v['vllm-av+dt']:.3f} "
                f"bestK+dt {v['vllm-best-K+dt']:.3f} bestK+dtd {v['vllm-best-K+dt-depth']:.3f} "
                f"av {v['vllm-av']:.3f} sched+av {v['vllm-schedule+av']:.3f} "
                f"bestK {v['vllm-best-K']:.3f} sched {v['vllm-schedule']:.3f} "
                f"conf {v['confidence']:.3f} bound {v['bound']:.3f} | kiln-av/av by hook price: {hooks}"
            )
    return rows, table


def drafter_from(args, fit: dict) -> Drafter:
    if args.draft_share is not None:
        return constant_drafter(args.draft_share)
    entry = fit["drafters"][args.drafter_name]
    return table_drafter(args.drafter_name, {int(r): tuple(v) for r, v in entry["points"].items()})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--trace", type=Path, action="append", default=None)
    ap.add_argument(
        "--drafter",
        type=Path,
        default=HERE / "results-draft-fit.json",
        help="drafter shares fitted to the H200 (fit_draft.py)",
    )
    ap.add_argument("--drafter-name", default="kindling-0.6b-eager-tp8")
    ap.add_argument(
        "--draft-share", type=float, default=None, help="a constant drafting share per position instead of the fit"
    )
    ap.add_argument("--other-share", type=float, default=0.5)
    ap.add_argument(
        "--other-half",
        type=float,
        default=None,
        help="tokens at which the non-routed time is half per-token (default: the fit)",
    )
    ap.add_argument("--explore", type=float, default=0.05)
    ap.add_argument("--sizes", type=int, nargs="*", default=list(st.BATCH_SIZES))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--request-steps", type=int, default=40_000, help="request records drawn per trace and load")
    ap.add_argument(
        "--av-hook-prices", type=Path, default=HOOK_PRICES, help="bench_av.py's measurement of kiln-av's hook"
    )
    ap.add_argument(
        "--av-hook",
        default=None,
        help="the hook price kiln-av pays: a variant the measurement holds (eager, "
        "compiled, fused, hook, hook_timed) or none (default: hook, the engine's hook as "
        "it runs, where measured, else fused, else compiled)",
    )
    ap.add_argument(
        "--av-min-batch",
        type=int,
        default=AV_MIN_BATCH,
        help="kiln-av steps aside below this many requests (KILN_DRAFT_TRUNC_AV_MIN_BATCH)",
    )
    args = ap.parse_args(argv)
    prices = hook_prices(args.av_hook_prices)
    if args.av_hook is None:
        args.av_hook = next(v for v in ("hook", "fused", "compiled") if v in prices)
    if args.av_hook not in prices:
        ap.error(f"--av-hook {args.av_hook}: {args.av_hook_prices} prices {', '.join(prices)}")
    paths = args.trace if args.trace is not None else sorted(HERE.glob(st.TRACE_GLOB))
    fit = json.loads(args.drafter.read_text()) if args.drafter.is_file() else {}
    half = args.other_half if args.other_half is not None else fit.get("other_half")
    if half is None:
        ap.error(f"--other-half: no fit in {args.drafter} (run fit_draft.py) and none given")
    model = AdaptiveModel(half, other_share=args.other_share)
    drafter = drafter_from(args, fit)
    rng = np.random.default_rng(0)
    traces = st.load_traces(paths, K, rng, 4_000 if args.quick else 100_000)
    start = time.monotonic()
    print(
        f"sim_adaptive: {len(traces)} traces x {len(args.sizes)} loads; drafter {drafter.name}, "
        f"other_share {args.other_share}; kiln-av's hook priced {args.av_hook} "
        f"({args.av_hook_prices.name}), stepping aside below {args.av_min_batch} requests",
        flush=True,
    )
    rows, table = simulate(
        traces,
        model,
        drafter,
        args.sizes,
        0,
        args.explore,
        log=lambda s: print(s, flush=True),
        steps=args.request_steps,
        prices=prices,
        hook=args.av_hook,
        min_batch=args.av_min_batch,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    tag = f"{drafter.name}-os{args.other_share:g}-half{half:g}"
    meta = {
        "drafter": drafter.name,
        "drafter_share": {r: drafter.share(r) for r in args.sizes},
        "drafter_first": {r: drafter.first(r) for r in args.sizes},
        "other_share": args.other_share,
        "other_half": half,
        "explore": args.explore,
        "profile_trace": PROFILE_TRACE,
        "schedule": table,
        "av_hook": args.av_hook,
        "av_min_batch": args.av_min_batch,
        "av_hook_prices": str(
            args.av_hook_prices.relative_to(HERE.parents[1])
            if args.av_hook_prices.is_relative_to(HERE.parents[1])
            else args.av_hook_prices
        ),
        "rows": rows,
    }
    meta["summary"] = summary(rows)
    (args.out / f"sim-adaptive-{tag}.json").write_text(json.dumps(meta, indent=1))
    (args.out / f"sim-adaptive-{tag}.md").write_text(tables(rows))
    plot(
        rows,
        args.out / f"sim-adaptive-{tag}.png",
        f"tokens/s vs the best upstream adaptive rule (drafter {drafter.name}; kiln-av's hook "
        f"priced {args.av_hook}, stepping aside below {args.av_min_batch} requests)",
    )
    plot_hook(
        rows,
        args.out / f"sim-adaptive-{tag}-avhook.png",
        f"kiln-av vs vLLM's adaptive verification by the price of its hook (drafter {drafter.name})",
    )
    print(f"summary ({time.monotonic() - start:.0f} s)")
    summ = meta["summary"]
    print(
        "worst case against every upstream rule, per configuration: "
        + ", ".join(f"{c} {w:.3f}" for c, w in summ["configs_worst"].items())
    )
    print(
        f"kiln's configuration ({summ['config']}, profiled on the traffic): "
        f"{summ['kiln_vs_upstream'][0]:.3f}-"
        f"{summ['kiln_vs_upstream'][1]:.3f}x of the best upstream rule ({summ['below_1']} cases "
        f"below 1.000; goal >= 1.00), {summ['kiln_vs_shipped'][0]:.3f}-{summ['kiln_vs_shipped'][1]:.3f}x "
        f"of the best shipped one; real traces R<=4: {summ['real_small_kiln'][0]:.3f}-"
        f"{summ['real_small_kiln'][1]:.3f}x (goal >= 1.03; informed bound "
        f"{summ['real_small_bound'][0]:.3f}-{summ['real_small_bound'][1]:.3f}x)"
    )
    for price, h in summ["av_hook"].items():
        print(
            f"kiln-av vs adaptive verification, hook {price}: {h['kiln_av_vs_av'][0]:.3f}-"
            f"{h['kiln_av_vs_av'][1]:.3f}x (real traces, 1-2 requests: {h['real_small'][0]:.3f}-"
            f"{h['real_small'][1]:.3f}x); on the real traces it gains most stepping aside below "
            f"{h['min_batch']} requests (KILN_DRAFT_TRUNC_AV_MIN_BATCH)"
        )
    print(f"wrote {args.out}/sim-adaptive-{tag}.json, .md, .png and -avhook.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
