#!/usr/bin/env python3
"""sim_adaptive's step accounting checked against what the GPU twin served: the twin's
own step costs, fitted from two of its configurations, priced through
``sim_adaptive.replay`` for every other configuration's measured shape, and the
prediction compared with the tokens/s served (`nox -s gpu_twin_model -- RESULTS`).

RESULTS is runner.py's document (gpu-twin-results.json, or a committed
``-raw.json.xz``). Per load b (concurrent requests), from the counters' deltas of the
timed pass:

- served step (ms) = b x (1 + accepted per window) / tokens/s: one engine step verifies
  one window per request and yields its accepted drafts plus one token;
- t1(b): spec-off's step (one token per request, no drafter) = b / tokens/s;
- spec (fixed K, every draft verified): its step less t1 is K drafting positions plus
  K x b more verified tokens: E(b) = K d + K b c(b). One equation, two unknowns, so
  the split is an assumption (``SPLITS``): "launch-bound" (the default) takes the
  drafting price d flat in b (the eager drafter's step is host launch time: the
  H200-measured eager kindling drafter held 5.8-6.8 ms a position from 1 to 64
  requests, results-2026-12-05-h200-draft-cost.json) and as large as c(b) >= 0 allows,
  so c = 0 at the load where spec's step exceeds spec-off's least (one request on the
  twin, where a launch-bound verify costs the same for 1 and 5 tokens); "all-verify"
  puts all of E in the verify (d = 0). Predictions for a configuration that drafts
  more than it verifies (adaptive verification) are highest with all-verify, so
  the two bracket what any split predicts.

Each other configuration is replayed as one mean step of its own measured shape:
accepted per window (vLLM's counters), drafts verified per window (scheduled, or what
adaptive verification admitted), kept (draft-trunc's counters: dead tokens skip their
routed experts), positions drafted. The step is linear in all of them, so the mean
step prices the mean shape exactly. The model knows no host-side cost beyond these:
draft-trunc's hook, adaptive verification's budget and kiln-av's correction are what
a disagreement measures; the "hook" variant prices draft-trunc's hook as measured by
dt-cost (served step less predicted, dt-cost keeping every draft on the twin).

Also assumed: the batch is the load (the runner keeps `load` requests in flight, all
64 tokens long); what a request costs outside the decode steps (its prefill, the HTTP
round trip) is spread over its steps, as it is in spec-off's t1; the server logs carry
no step timing (vLLM's 10-second throughput lines, draft-trunc's 20-step counter
lines), so tokens/s and the counters are all there is to fit.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from kiln_testkit.scripts import load_script
from kiln_testkit.twinserve import SpecDecodeStats, parse_spec_decode

analyse = load_script("benchmarks/gpu_twin/analyse.py")
sa = load_script("benchmarks/draft_trunc/sim_adaptive.py")
twin_models = load_script("benchmarks/gpu_twin/twin_models.py")

REFERENCE = analyse.REFERENCE  # spec-off: t1(b)
FIT = "spec"  # fixed K, all verified, no draft-trunc: E(b)
HOOK = "dt-cost"  # draft-trunc on the fit's shape: its hook's price
SPLITS = ("launch-bound", "all-verify")
SCHEDULE = "num_speculative_tokens_per_batch_size"
AV = "enable_adaptive_verification"


# ----------------------------------------------------------------------------- served


@dataclass(frozen=True)
class Traits:
    """What a configuration's launch says about its step's shape."""

    k: int  # num_speculative_tokens (0: no speculation)
    av: bool  # adaptive verification: a per-step budget cuts drafts after drafting
    schedule: bool  # vLLM's batch-size schedule
    dt: bool  # draft-trunc (KILN_DRAFT_TRUNC=1): its hook runs every step

    def drafts_scheduled_only(self, engine: str) -> bool:
        """Whether the drafter stops at the scheduled K: draft-trunc's hook breaks
        0.32.0/0.33.0's draft_model loop there (patch 0010), 0.34.0 stops there itself.
        Adaptive verification cuts after drafting: every position is drafted."""
        newer = tuple(int(p) for p in engine.split(".")[:2] if p.isdigit()) >= (0, 34)
        return not self.av and (self.dt or newer)


def traits(plan_config: dict) -> Traits:
    spec = plan_config.get("speculative_config") or {}
    return Traits(
        int(spec.get("num_speculative_tokens", 0)),
        bool(spec.get(AV)),
        bool(spec.get(SCHEDULE)),
        plan_config.get("env", {}).get("KILN_DRAFT_TRUNC") == "1",
    )


@dataclass(frozen=True)
class Served:
    """One configuration at one load, per verify window (the counters' deltas)."""

    config: str
    load: int
    tokens_per_s: float
    accepted: float = 0.0  # accepted drafts
    scheduled: float = 0.0  # drafts vLLM scheduled (it counts them before any cut)
    per_pos: tuple[float, ...] = ()  # accepted at each position
    proposed: float | None = None  # drafts draft-trunc's hook saw (None: no counter moved)
    kept: float | None = None  # of those, kept (not marked dead)

    @property
    def step_ms(self) -> float:
        return 1e3 * self.load * (1 + self.accepted) / self.tokens_per_s


def _delta(row: dict) -> SpecDecodeStats | None:
    after = parse_spec_decode(row["metrics_after"])
    before = parse_spec_decode(row["metrics_before"])
    if after is None:
        return None
    return after - before if before is not None else after


def served(name: str, rows: list[dict]) -> list[Served]:
    out = []
    for r in rows:
        spec = _delta(r)
        if spec is None or not spec.drafts:
            out.append(Served(name, int(r["load"]), float(r["tokens_per_s"])))
            continue
        kb, ka = analyse._kiln(r["metrics_before"]), analyse._kiln(r["metrics_after"])
        prop = ka.get("proposed", 0.0) - kb.get("proposed", 0.0)
        kept = ka.get("kept", 0.0) - kb.get("kept", 0.0)
        # draft-trunc publishes its counters every KILN_DRAFT_TRUNC_LOG_INTERVAL steps, so a
        # short load can show no delta at all: None, and the caller falls back
        out.append(
            Served(
                name,
                int(r["load"]),
                float(r["tokens_per_s"]),
                spec.accepted / spec.drafts,
                spec.draft_tokens / spec.drafts,
                tuple(a / spec.drafts for a in spec.accepted_per_pos),
                prop / spec.drafts if prop > 0 else None,
                kept / prop if prop > 0 else None,
            )
        )
    return out


# ----------------------------------------------------------------------------- costs


@dataclass(frozen=True)
class Costs:
    """The twin's step, in ms: t1[b] + c[b] x (verified tokens past one a request, a
    dead one paying 1 - routed of it) + d x positions drafted."""

    split: str
    t1: dict[int, float]
    c: dict[int, float]
    d: float
    routed: float
    pinned_at: int | None  # the load where the launch-bound split sets c = 0


def routed_share(shape: str | None) -> float:
    """The routed experts' share of one of the twin's layers' weights: what a dead token
    (routed experts skipped) saves of a verified token's price. A token's marginal cost
    on the twin is the experts it routes to; 1.0 for an unknown shape."""
    if shape not in twin_models.SHAPES:
        return 1.0
    hidden, heads, kv_heads, head_dim, _layers, experts, _top_k, expert_dim = twin_models.SHAPES[shape]
    routed = experts * 3 * hidden * expert_dim
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    return routed / (routed + attention + hidden * experts)


def fit(off: dict[int, Served], spec: dict[int, Served], depth: dict[int, float], split: str, routed: float) -> Costs:
    """The costs that price spec-off and spec (per load, exactly where c >= 0 allows);
    ``depth``: positions spec drafted at each load."""
    loads = sorted(set(off) & set(spec) & set(depth))
    t1 = {b: off[b].step_ms for b in loads}
    extra = {b: spec[b].step_ms - t1[b] for b in loads}
    pinned = None
    if split == "launch-bound":
        pinned = min(loads, key=lambda b: extra[b] / depth[b])
        d = max(0.0, extra[pinned] / depth[pinned])
    elif split == "all-verify":
        d = 0.0
    else:
        raise ValueError(f"split: {split!r} (one of {', '.join(SPLITS)})")
    c = {b: max(0.0, (extra[b] - depth[b] * d) / (b * spec[b].scheduled)) for b in loads}
    return Costs(split, t1, c, d, routed, pinned)


class TwinModel:
    """sim_adaptive's verify-model interface (``step_us(live, tokens, reqs)``, in us)
    over the fitted costs."""

    def __init__(self, costs: Costs):
        self.costs = costs

    def step_us(self, live, tokens, reqs=None):
        c, r = self.costs, int(reqs)
        live, tokens = np.asarray(live, dtype=float), np.asarray(tokens, dtype=float)
        per_token = c.routed * (live - r) + (1 - c.routed) * (tokens - r)
        return 1e3 * (c.t1[r] + c.c[r] * per_token)


def drafter(costs: Costs, model: TwinModel):
    """The drafting price as sim_adaptive's Drafter: d as a share of a fully verified
    step at each load, the first pass one position (eager kindling on the H200: 1.00)."""
    points = {}
    for b in costs.t1:
        full = float(model.step_us(b * (1 + sa.K), b * (1 + sa.K), b)) / 1e3
        points[b] = (costs.d / full if full > 0 else 0.0, 1.0)
    return sa.table_drafter(f"gpu-twin-{costs.split}", points)


# ----------------------------------------------------------------------------- shapes


@dataclass(frozen=True)
class Shape:
    """A configuration's mean step at one load, per request: drafts verified (in the
    batch), kept (not dead), positions drafted; ``verified_from`` says where the verified
    count came from."""

    verified: float
    kept: float
    depth: float
    verified_from: str


def admitted_estimate(row: Served, fixed: Served) -> float:
    """Drafts adaptive verification admitted per window, from its accepted drafts at each
    position against the fixed-K run's at the same load: a window reaches position i with
    probability accepted_i / fixed_i when the budget's cut is independent of whether the
    draft would be accepted (the twin's flat draft distributions give the budget little
    to go on). A prefix: the reach never grows along it."""
    reach, prev = [], 1.0
    for mine, full in zip(row.per_pos, fixed.per_pos, strict=False):
        prev = min(prev, mine / full) if full > 0 else prev
        reach.append(prev)
    return float(sum(reach))


def shape(row: Served, t: Traits, engine: str, fixed: Served | None, kept_fallback: float) -> Shape:
    """What ``row`` verified, kept and drafted, per window."""
    source = "scheduled"
    verified = row.scheduled
    if t.av:
        # draft-trunc's hook sees the drafts adaptive verification admitted; trust its
        # count only where it covers what was accepted (a lagging counter may not)
        if row.proposed is not None and row.proposed >= row.accepted:
            verified, source = row.proposed, "counted"
        elif fixed is not None and fixed.per_pos:
            verified, source = admitted_estimate(row, fixed), "estimated"
        verified = max(verified, row.accepted)
    share = row.kept if row.kept is not None else kept_fallback
    # a draft accepted was verified and kept, whatever a lagging counter says
    kept = min(verified, max(verified * share if t.dt else verified, row.accepted))
    depth = row.scheduled if t.drafts_scheduled_only(engine) else float(t.k)
    return Shape(verified, kept, depth, source)


def timed_kept_share(rows: list[dict]) -> float:
    """draft-trunc's kept / proposed over the whole timed pass: the fallback for a load
    whose counters did not move."""
    first, last = analyse._kiln(rows[0]["metrics_before"]), analyse._kiln(rows[-1]["metrics_after"])
    prop = last.get("proposed", 0.0) - first.get("proposed", 0.0)
    return (last.get("kept", 0.0) - first.get("kept", 0.0)) / prop if prop > 0 else 1.0


def predict(costs: Costs, row: Served, s: Shape, hook_ms: float = 0.0) -> tuple[float, float]:
    """(tokens/s, step ms) of ``row``'s shape, through sim_adaptive.replay on one mean
    step of ``row.load`` requests; ``hook_ms`` added to the step."""
    model = TwinModel(costs)
    r = row.load
    steps = SimpleNamespace(accepted=np.full((1, r), row.accepted), reqs=r)
    plan = sa.Plan(np.full((1, r), s.verified), np.full((1, r), s.kept), np.array([s.depth]))
    res = sa.replay(steps, plan, model, drafter(costs, model))
    step_us = res.time_us + 1e3 * hook_ms
    return res.tokens / (step_us * 1e-6), step_us / 1e3


# ----------------------------------------------------------------------------- the check


def _largest(rows: list[dict], key: str) -> dict | None:
    """The row whose ``key`` ratio is furthest from 1 (in log: 0.5 and 2 are as far)."""
    rated = [r for r in rows if r["role"] == "predicted" and r.get(key)]
    if not rated:
        return None
    top = max(rated, key=lambda r: abs(math.log(r[key])))
    return {
        "config": top["config"],
        "load": top["load"],
        "ratio": top[key],
        "predicted_tokens_per_s": top["served_tokens_per_s"] * top[key],
        "served_tokens_per_s": top["served_tokens_per_s"],
    }


def _runs(doc: dict, path: Path) -> dict[str, dict[int, Served]]:
    runs = {n: {s.load: s for s in served(n, r["timed"])} for n, r in doc["configs"].items() if r.get("timed")}
    for need in (REFERENCE, FIT):
        if need not in runs:
            sys.exit(f"gpu-twin model: {path}: configs: no timed {need!r} run to fit the step costs to")
    return runs


def check(doc: dict, path: Path) -> dict:
    """Fit, predict, compare: the report main() writes."""
    plan, engine = doc["plan"], doc["plan"]["engine"]
    tr = {n: traits(c) for n, c in plan["configs"].items()}
    runs = _runs(doc, path)
    fixed = runs[FIT]
    kept_fb = {n: timed_kept_share(doc["configs"][n]["timed"]) for n in runs}
    # in the plan's order (prepare.py's: each configuration one change from the last)
    shapes = {
        n: {b: shape(row, tr[n], engine, fixed.get(b), kept_fb[n]) for b, row in runs[n].items()}
        for n in tr
        if n in runs and tr[n].k > 0
    }
    routed = plan.get("routed_share") or routed_share(plan.get("shape"))  # the scale twin's plan states it
    depth = {b: s.depth for b, s in shapes[FIT].items()}
    costs = {split: fit(runs[REFERENCE], fixed, depth, split, routed) for split in SPLITS}
    main_costs = costs[SPLITS[0]]
    hook: dict[int, float] = {}
    if HOOK in shapes:
        for b, s in shapes[HOOK].items():
            if b in main_costs.t1:
                hook[b] = runs[HOOK][b].step_ms - predict(main_costs, runs[HOOK][b], s)[1]
    rows = []
    for name, by in shapes.items():
        for b, s in sorted(by.items()):
            if b not in main_costs.t1:
                continue
            row = runs[name][b]
            pred, step = predict(main_costs, row, s)
            alt, _ = predict(costs["all-verify"], row, s)
            out = {
                "config": name,
                "load": b,
                "role": "fit" if name == FIT else "predicted",
                "served_tokens_per_s": row.tokens_per_s,
                "predicted_tokens_per_s": pred,
                "ratio": pred / row.tokens_per_s,
                "ratio_all_verify": alt / row.tokens_per_s,
                "served_step_ms": row.step_ms,
                "predicted_step_ms": step,
                "unpriced_ms": row.step_ms - step,
                "accepted_per_window": row.accepted,
                "scheduled_per_window": row.scheduled,
                "verified_per_window": s.verified,
                "kept_per_window": s.kept,
                "drafted": s.depth,
                "verified_from": s.verified_from,
            }
            if tr[name].av and b in fixed:  # the estimate beside a count, to judge it by
                out["admitted_estimate"] = admitted_estimate(row, fixed[b])
            # the hook variant prices draft-trunc's hook where it runs and is the model
            # elsewhere; dt-cost is the hook's own measure, so it has none
            if hook and name != HOOK and (not tr[name].dt or b in hook):
                priced = hook[b] if tr[name].dt else 0.0
                out["ratio_hook"] = predict(main_costs, row, s, priced)[0] / row.tokens_per_s
            rows.append(out)
    return {
        "source": path.name,
        "date": doc["date"],
        "engine": engine,
        "recipe": plan["recipe"],
        "commit": plan["commit"],
        "device": doc.get("preflight", "").split(" gpu ")[-1].split("\n")[0],
        "costs": _costs_report(costs, runs, hook, shapes[FIT]),
        "rows": rows,
        "largest": _largest(rows, "ratio"),
        "largest_all_verify": _largest(rows, "ratio_all_verify"),
        "largest_hook": _largest(rows, "ratio_hook"),
    }


def _costs_report(costs: dict[str, Costs], runs: dict, hook: dict[int, float], fit_shapes: dict) -> dict:
    main = costs[SPLITS[0]]
    model = TwinModel(main)
    dr = drafter(main, model)
    loads = {}
    for b in sorted(main.t1):
        loads[str(b)] = {
            "t1_ms": main.t1[b],
            "spec_step_ms": runs[FIT][b].step_ms,
            "spec_drafted": fit_shapes[b].depth,
            "spec_verified": fit_shapes[b].verified,
            **{f"c_ms_{s}": costs[s].c[b] for s in SPLITS},
            "draft_share": dr.share(b),
            "dt_hook_ms": hook.get(b),
        }
    return {
        "draft_position_ms": {s: costs[s].d for s in SPLITS},
        "pinned_at": main.pinned_at,
        "routed_share": main.routed,
        "knob": dr.knob,
        "loads": loads,
    }


# ----------------------------------------------------------------------------- output: model_report.py
report_out = load_script("benchmarks/gpu_twin/model_report.py")
markdown, plot = report_out.markdown, report_out.plot


def stem(path: Path, doc: dict) -> str:
    """The results file's own name (less -raw and its suffixes) with -model; runner.py's
    gpu-twin-results.json gets the date and recipe, as analyse.py names it."""
    name = path.name.split(".json")[0].removesuffix("-raw")
    if name.startswith("gpu-twin-") and name != "gpu-twin-results":
        return f"{name}-model"
    return f"gpu-twin-{doc['date'][:10]}-{doc['plan']['recipe']}-model"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path, help="runner.py's results document (.json or .json.xz)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/gpu_twin/results"))
    p.add_argument("--name", help="file stem (default: the results file's, with -model)")
    args = p.parse_args(argv)
    doc = analyse.read_results(args.results)
    report = check(doc, args.results)
    args.out.mkdir(parents=True, exist_ok=True)
    name = args.name or stem(args.results, doc)
    (args.out / f"{name}.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / f"{name}.md").write_text(markdown(report))
    plot(report, args.out / f"{name}.png")
    print(markdown(report))
    print(f"wrote {args.out}/{name}.json, .md and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
