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
from pathlib import Path

import numpy as np
from kiln_testkit.scripts import load_script

costs = load_script("benchmarks/draft_trunc/sim_adaptive_costs.py")
rules = load_script("benchmarks/draft_trunc/sim_adaptive_rules.py")
report = load_script("benchmarks/draft_trunc/sim_adaptive_report.py")
sim_traces = load_script("benchmarks/draft_trunc/sim_trunc_traces.py")
sim_policies = load_script("benchmarks/draft_trunc/sim_trunc_policies.py")
# what benchmarks/gpu_twin/model_check.py reads as this script's
K, Plan, replay, table_drafter = costs.K, rules.Plan, rules.replay, costs.table_drafter


# ----------------------------------------------------------------------------- one load


def upstream_choices(b, model, drafter) -> tuple[dict[int, float], dict[float, float]]:
    """tokens/s of each fixed K and each confidence threshold on these steps."""
    ks = {k: rules.replay(b, rules.fixed_k(b, k), model, drafter).tokens_per_s for k in range(costs.K + 1)}
    th = {t: rules.replay(b, rules.confidence(b, t), model, drafter).tokens_per_s for t in costs.THETAS}
    return ks, th


def _best_over_k(b, model, drafter, plan_at) -> tuple[rules.Plan, int]:
    """The plan of ``plan_at(k)`` at the best K for these steps (k = 0..K), and that K:
    a rule profiled on its own traffic, as ``vllm-best-K``."""
    plans = {k: plan_at(k) for k in range(costs.K + 1)}
    tps = {k: rules.replay(b, p, model, drafter).tokens_per_s for k, p in plans.items()}
    k = max(tps, key=tps.get)
    return plans[k], k


def kiln_av_results(b, model, drafter, prices: dict[str, costs.HookPrice], seed, explore):
    """kiln-av, and kiln-av with draft-trunc's truncation within it (its configuration),
    on the best K for these steps under each hook price (the price moves the best K only
    where K = 0, which records no confidences and so runs no hook, comes close): results
    ``kiln-av@P`` and ``kiln-av+dt@P``, and the K each price chose."""
    plans = {k: rules.calibrated_av(b, model, drafter, rules.fixed_k(b, k)) for k in range(costs.K + 1)}
    with_dt: dict[int, rules.Plan] = {}
    out, ks = {}, {}
    for name, price in prices.items():
        hook_us = price.step_us(model, b.reqs)

        def run(plan, k, hook_us=hook_us):
            return rules.replay(b, plan, model, drafter, extra_us=hook_us if k > 0 else 0.0)

        tps = {k: run(p, k).tokens_per_s for k, p in plans.items()}
        k = ks[name] = max(tps, key=tps.get)
        out[f"kiln-av@{name}"] = run(plans[k], k)
        if k not in with_dt:
            with_dt[k] = rules.dt_plan(b, model, drafter, plans[k], seed=seed, explore=explore)
        out[f"kiln-av+dt@{name}"] = run(with_dt[k], k)
    return out, ks


def run_load(
    records, reqs, model, drafter, table, seed, explore, steps=40_000, prices=None, hook="none", min_batch=1
) -> dict:
    """Every policy on one trace at one load. kiln-av and kiln-av+dt as the engine runs
    them: the hook priced at ``prices[hook]``, adaptive verification alone below
    ``min_batch`` requests (the hook steps aside)."""
    prices = prices or {"none": costs.NO_HOOK_PRICE}
    tune = sim_policies.draw(records, reqs, np.random.default_rng(seed + 10_000 + reqs), steps, explore)
    _, tuned_th = upstream_choices(tune, model, drafter)
    theta = max(tuned_th, key=tuned_th.get)
    b = sim_policies.draw(records, reqs, np.random.default_rng(seed + reqs), steps, explore)
    ks, _ = upstream_choices(b, model, drafter)
    best_k = max(ks, key=ks.get)
    plans = {
        "none": rules.fixed_k(b, costs.K),
        "vllm-schedule": rules.fixed_k(b, rules.schedule_k(table, reqs)),
        "vllm-best-K": rules.fixed_k(b, best_k),
        "confidence": rules.confidence(b, theta),
    }
    plans["vllm-schedule+av"] = rules.adaptive_verification(b, model, drafter, plans["vllm-schedule"])
    plans["vllm-av"], av_k = _best_over_k(
        b, model, drafter, lambda k: rules.adaptive_verification(b, model, drafter, rules.fixed_k(b, k))
    )
    for name in costs.UPSTREAM:
        plans[f"{name}+dt"] = rules.dt_plan(b, model, drafter, plans[name], seed=seed, explore=explore)
    plans["dt"] = rules.dt_plan(b, model, drafter, seed=seed, explore=explore)
    plans["dt-depth"] = rules.dt_plan(b, model, drafter, depth_policy=True, seed=seed, explore=explore)
    for name in ("vllm-schedule", "vllm-best-K"):
        plans[f"{name}+dt-depth"] = rules.dt_plan(
            b, model, drafter, plans[name], depth_policy=True, seed=seed, explore=explore
        )
    out = {name: rules.replay(b, p, model, drafter) for name, p in plans.items()}
    kav, kav_ks = kiln_av_results(b, model, drafter, prices, seed, explore)
    out.update(kav)
    # the engine's configuration: truncation keeps running within what the calibrated
    # budget admits (KILN_DRAFT_TRUNC_WITH_AV=1), on the same calibration; below the
    # minimum batch the hook leaves vLLM's confidences alone
    aside = reqs < min_batch
    out["kiln-av"] = out["vllm-av"] if aside else kav[f"kiln-av@{hook}"]
    out["kiln-av+dt"] = out["vllm-av+dt"] if aside else kav[f"kiln-av+dt@{hook}"]
    out["no-spec"] = rules.replay(
        b, rules.Plan(0 * b.n, 0 * b.n, np.zeros(b.n.shape[0])), model, drafter, draft_free=True
    )
    # vLLM 0.32.0/0.33.0's draft_model drafter drafts all K whatever the schedule
    for name in ("vllm-schedule", "vllm-best-K"):
        p = plans[name]
        out[f"{name}/shipped"] = rules.replay(b, rules.Plan(p.n, p.j, np.full_like(p.depth, costs.K)), model, drafter)
    out["bound"] = rules.bound(b, model, drafter, oracle=False)
    out["oracle"] = rules.bound(b, model, drafter, oracle=True)
    tps = {name: r.tokens_per_s for name, r in out.items()}
    best_up = max(tps[n] for n in costs.UPSTREAM)
    return {
        "batch": reqs,
        "steps": int(b.n.shape[0]),
        "tokens_per_s": tps,
        "drafted": {n: r.drafted for n, r in out.items()},
        "kept_frac": {n: r.kept_frac for n, r in out.items()},
        "schedule_k": rules.schedule_k(table, reqs),
        "best_k": best_k,
        "av_k": av_k,
        "kiln_av_k": av_k if aside else kav_ks[hook],
        "kiln_av_k_by_price": kav_ks,
        "hook_share": {name: p.share(reqs) for name, p in prices.items()},
        "av_stepped_aside": aside,
        "theta": theta,
        "vs_best_upstream": {n: v / best_up for n, v in tps.items()},
        "best_upstream": max(costs.UPSTREAM, key=lambda n: tps[n]),
    }


def profile_schedule(records, model, drafter, seed, explore, steps=40_000) -> dict[int, int]:
    """The operator's batch-size -> K table, profiled on one trace."""
    table = {}
    for reqs in costs.PROFILE_SIZES:
        b = sim_policies.draw(records, reqs, np.random.default_rng(seed + 20_000 + reqs), steps, explore)
        ks, _ = upstream_choices(b, model, drafter)
        table[reqs] = max(ks, key=ks.get)
    return table


def simulate(
    traces, model, drafter, sizes, seed, explore, log=print, steps=40_000, prices=None, hook="none", min_batch=1
) -> tuple[list, dict]:
    prof = next(t for t in traces if t.source == costs.PROFILE_TRACE)
    table = profile_schedule(prof, model, drafter, seed, explore, steps)
    log(f"operator's schedule (profiled on {costs.PROFILE_TRACE}): {table}")
    rows = []
    for records in traces:
        for reqs in sizes:
            row = {
                "trace": records.source,
                **run_load(records, reqs, model, drafter, table, seed, explore, steps, prices, hook, min_batch),
            }
            rows.append(row)
            v = row["vs_best_upstream"]
            hooks = " ".join(f"{p} {r:.3f}" for p, r in report.kiln_av_vs_av(row).items())
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


def drafter_from(args, fit: dict) -> costs.Drafter:
    if args.draft_share is not None:
        return costs.constant_drafter(args.draft_share)
    entry = fit["drafters"][args.drafter_name]
    return costs.table_drafter(args.drafter_name, {int(r): tuple(v) for r, v in entry["points"].items()})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=costs.HERE / "results")
    ap.add_argument("--trace", type=Path, action="append", default=None)
    ap.add_argument(
        "--drafter",
        type=Path,
        default=costs.HERE / "results-draft-fit.json",
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
    ap.add_argument("--sizes", type=int, nargs="*", default=list(sim_traces.BATCH_SIZES))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--request-steps", type=int, default=40_000, help="request records drawn per trace and load")
    ap.add_argument(
        "--av-hook-prices", type=Path, default=costs.HOOK_PRICES, help="bench_av.py's measurement of kiln-av's hook"
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
        default=costs.AV_MIN_BATCH,
        help="kiln-av steps aside below this many requests (KILN_DRAFT_TRUNC_AV_MIN_BATCH)",
    )
    args = ap.parse_args(argv)
    prices = costs.hook_prices(args.av_hook_prices)
    if args.av_hook is None:
        args.av_hook = next(v for v in ("hook", "fused", "compiled") if v in prices)
    if args.av_hook not in prices:
        ap.error(f"--av-hook {args.av_hook}: {args.av_hook_prices} prices {', '.join(prices)}")
    paths = args.trace if args.trace is not None else sorted(costs.HERE.glob(sim_traces.TRACE_GLOB))
    fit = json.loads(args.drafter.read_text()) if args.drafter.is_file() else {}
    half = args.other_half if args.other_half is not None else fit.get("other_half")
    if half is None:
        ap.error(f"--other-half: no fit in {args.drafter} (run fit_draft.py) and none given")
    model = costs.AdaptiveModel(half, other_share=args.other_share)
    drafter = drafter_from(args, fit)
    rng = np.random.default_rng(0)
    traces = sim_traces.load_traces(paths, costs.K, rng, 4_000 if args.quick else 100_000)
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
        "profile_trace": costs.PROFILE_TRACE,
        "schedule": table,
        "av_hook": args.av_hook,
        "av_min_batch": args.av_min_batch,
        "av_hook_prices": str(
            args.av_hook_prices.relative_to(costs.HERE.parents[1])
            if args.av_hook_prices.is_relative_to(costs.HERE.parents[1])
            else args.av_hook_prices
        ),
        "rows": rows,
    }
    meta["summary"] = report.summary(rows)
    (args.out / f"sim-adaptive-{tag}.json").write_text(json.dumps(meta, indent=1))
    (args.out / f"sim-adaptive-{tag}.md").write_text(report.tables(rows))
    report.plot(
        rows,
        args.out / f"sim-adaptive-{tag}.png",
        f"tokens/s vs the best upstream adaptive rule (drafter {drafter.name}; kiln-av's hook "
        f"priced {args.av_hook}, stepping aside below {args.av_min_batch} requests)",
    )
    report.plot_hook(
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
