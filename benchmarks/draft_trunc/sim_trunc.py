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
from pathlib import Path

import numpy as np
from kiln_engine.draft_trunc import _cost
from kiln_testkit.scripts import load_script

sim_traces = load_script("benchmarks/draft_trunc/sim_trunc_traces.py")
sim_policies = load_script("benchmarks/draft_trunc/sim_trunc_policies.py")


def best_fixed_tau(results: dict[str, sim_policies.Outcome]) -> float:
    return max(sim_policies.TAUS, key=lambda t: results[f"tau={t:.1f}"].tokens_per_s)


def summarise(results: dict[str, sim_policies.Outcome], tuned_tau: float) -> dict:
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


def simulate(
    traces: list[sim_traces.Records],
    model: sim_policies.Model,
    sizes=sim_traces.BATCH_SIZES,
    seed=0,
    log=print,
    explore=0.05,
) -> list[dict]:
    rows = []
    for records in traces:
        for size in sizes:
            tune = sim_policies.draw(records, size, np.random.default_rng(seed + 10_000 + size), explore=explore)
            tuned = best_fixed_tau(sim_policies.run_policies(tune, model, fixed_only=True))
            b = sim_policies.draw(records, size, np.random.default_rng(seed + size), explore=explore)
            row = {
                "trace": records.source,
                "acceptance": records.acceptance,
                "conditional_acceptance": records.conditional_acceptance,
                "batch": size,
                "steps": int(b.n.shape[0]),
                **summarise(sim_policies.run_policies(b, model), tuned),
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=sim_traces.HERE / "results")
    ap.add_argument(
        "--trace",
        type=Path,
        action="append",
        default=None,
        help=f"JSONL trace(s); default: {sim_traces.TRACE_GLOB} next to this script",
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
    ap.add_argument("--sizes", type=int, nargs="*", default=list(sim_traces.BATCH_SIZES))
    ap.add_argument("--quick", action="store_true", help="fewer records (a smoke run)")
    args = ap.parse_args(argv)
    paths = args.trace if args.trace is not None else sorted(sim_traces.HERE.glob(sim_traces.TRACE_GLOB))
    base = _cost.MoELayer()
    layer = _cost.MoELayer(base.experts, base.top_k, base.expert_bytes / args.ep, args.skew)
    believed = None
    if args.policy_skew is not None:
        believed = _cost.MoELayer(layer.experts, layer.top_k, layer.expert_bytes, args.policy_skew)
    model = sim_policies.Model(
        layer=layer, other_share=args.other_share, moe_layers=args.moe_layers, policy_layer=believed
    )
    rng = np.random.default_rng(0)
    traces = sim_traces.load_traces(paths, args.k, rng, 4_000 if args.quick else 100_000)
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
