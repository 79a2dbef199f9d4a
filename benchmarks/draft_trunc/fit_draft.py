"""Drafting prices for sim_adaptive.py (and KILN_DRAFT_TRUNC_DRAFT_COST): what one
drafting position costs as a share of a fully verified step, per drafter and batch.

From bench_draft.py's H200 measurement (``--bench FILE``) when there is one; else
from a roofline (``--roofline``): bytes each piece must stream at the H200's measured
4.40 TB/s (docs/draft-trunc-bench.md), plus, for vLLM's draft_model drafter, which
0.32.0/0.33.0 launch eagerly (no CUDA graph), a launch floor per decode step.
The verify step is sim_trunc's model (the fitted routed experts, other share 0.5) on
one GPU holding every expert: shares are per-GPU work, so they hold for a target and
a drafter sharded alike (tensor parallel over the same GPUs); the eager floor does not
shrink with sharding, so ``-tp8`` variants price it against an 8-way sharded step.

Writes results-draft-fit.json: {"source", "other_half", "drafters": {name:
{"points": {R: [share, first]}, "knob": KILN_DRAFT_TRUNC_DRAFT_COST value}}}.

Usage: python benchmarks/draft_trunc/fit_draft.py [--bench FILE | --roofline] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from kiln_testkit.scripts import load_script

sim_policies = load_script("benchmarks/draft_trunc/sim_trunc_policies.py")

HERE = Path(__file__).resolve().parent
K = 4
SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
STREAM = 4.40e12  # B/s, the H200's measured read ceiling (results-2026-11-30-h200.json)
CONTEXT = 1024
# name: layers, hidden, kv heads, head dim, MLP intermediate (bench_draft.DRAFT_MODELS)
DRAFTS = {"kindling-0.6b": (28, 1024, 8, 128, 3072), "kindling-1.7b": (28, 2048, 8, 128, 6144)}
VOCAB = 154_880
# eager launch floor of one decode step of a 28-layer dense drafter in vLLM (~12 kernels a
# layer at ~6 us of host time each): an estimate, the measurement replaces it
EAGER_FLOOR_US = 2000.0


def full_step_us(model, reqs: int) -> float:
    n = reqs * (1 + K)
    return float(model.step_us(np.array(n), np.array(n)))


def roofline_draft_us(shape, tokens_per_req: int, reqs: int) -> float:
    layers, hidden, kv, hd, inter = shape
    heads_q = 2 * kv  # Qwen3-like: 16 query heads over 8 KV heads
    per_layer = hidden * (heads_q + 2 * kv) * hd + heads_q * hd * hidden + 3 * hidden * inter
    weights = 2 * (layers * per_layer + VOCAB * hidden)
    kv_bytes = reqs * layers * 2 * kv * CONTEXT * hd * 2
    flops = 2 * reqs * tokens_per_req * (layers * per_layer)
    return max((weights + kv_bytes) / STREAM, flops / 700e12) * 1e6


def roofline(model) -> dict:
    drafters = {}
    for name, shape in DRAFTS.items():
        graph, eager8 = {}, {}
        for r in SIZES:
            dec = roofline_draft_us(shape, 1, r)
            first = roofline_draft_us(shape, K + 2, r) / dec
            full = full_step_us(model, r)
            graph[r] = (dec / full, first)
            eager8[r] = (max(dec / 8, EAGER_FLOOR_US) / (full / 8), 1.0)
        drafters[f"{name}-graph"] = graph
        drafters[f"{name}-eager-tp8"] = eager8
    # the MTP head: one MoE layer (routed at R tokens) + as much non-routed work, + lm_head
    mtp = {}
    for r in SIZES:
        routed = float(model.step_us(np.array(r), np.array(r))) / model.moe_layers
        head = 2 * VOCAB * 6144 / STREAM * 1e6
        full = full_step_us(model, r)
        first_routed = float(model.step_us(np.array(r * (1 + K)), np.array(r * (1 + K))))
        mtp[r] = ((routed + head) / full, (first_routed / model.moe_layers + head) / (routed + head))
    drafters["mtp-head"] = mtp
    return {"source": "roofline (no H200 measurement of the drafters)", "other_half": 256.0, "drafters": drafters}


def measured(model, bench: dict) -> dict:
    target = {(t["requests"], t["tokens"]): t for t in bench["target"]}
    drafters: dict[str, dict[int, tuple[float, float]]] = {}
    for row in bench["draft"]:
        r, full = row["requests"], full_step_us(model, row["requests"])
        dec = row["decode_graph_us"]
        drafters.setdefault(f"{row['model']}-graph", {})[r] = (dec / full, row["first_step_graph_us"] / dec)
        drafters.setdefault(f"{row['model']}-eager-tp8", {})[r] = (
            max(row["decode_eager_us"], dec / 8) / (full / 8),
            1.0,
        )
    halves = []
    mtp = {}
    for r in sorted({t["requests"] for t in bench["target"]}):
        one, five = target[(r, r)], target[(r, r * (1 + K))]

        def other(t):
            return t["attn_us"] + t["shared_us"] + t["lm_head_us"] / model.moe_layers

        slope = (other(five) - other(one)) / (4 * r)
        phi = min(max(slope * 5 * r / other(five), 1e-6), 1 - 1e-6)
        halves.append(5 * r * (1 - phi) / phi)
        dec = one["attn_us"] + one["routed_us"] + one["shared_us"] + one["lm_head_us"] + one["eh_proj_us"]
        first = five["attn_us"] + five["routed_us"] + five["shared_us"] + one["lm_head_us"] + five["eh_proj_us"]
        mtp[r] = (dec / full_step_us(model, r), first / dec)
    drafters["mtp-head"] = mtp
    return {
        "source": f"{bench.get('device', 'GPU')} measurement (bench_draft.py) {bench.get('date', '')}",
        "measured": {k: bench.get(k) for k in ("date", "device", "torch", "triton", "context", "drafts_k")},
        "other_half": float(np.median(halves)),
        "other_half_per_batch": halves,
        "drafters": drafters,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", type=Path, default=None, help="bench_draft.py's JSON")
    ap.add_argument("--roofline", action="store_true")
    ap.add_argument("--out", type=Path, default=HERE / "results-draft-fit.json")
    args = ap.parse_args(argv)
    model = sim_policies.Model()
    if args.bench is not None:
        fit = measured(model, json.loads(args.bench.read_text()))
    elif args.roofline:
        fit = roofline(model)
    else:
        ap.error("give --bench FILE (bench_draft.py's output) or --roofline")
    out = {
        "source": fit["source"],
        **({"measured": fit["measured"]} if "measured" in fit else {}),
        "other_half": fit["other_half"],
        "drafters": {},
    }
    for name, pts in fit["drafters"].items():
        knob = ",".join(f"{r}:{s:.4g}:{f:.3g}" for r, (s, f) in sorted(pts.items()))
        out["drafters"][name] = {"points": {str(r): list(v) for r, v in sorted(pts.items())}, "knob": knob}
        print(
            f"{name:<22} share per position at R=1/8/64/512: "
            + " / ".join(f"{pts[r][0]:.4f}" for r in (1, 8, 64, 512) if r in pts)
            + f"; first pass {pts[min(pts)][1]:.2f}..{pts[max(pts)][1]:.2f} positions"
        )
    print(f"other_half (tokens at which the non-routed time is half per-token): {out['other_half']:.0f}")
    args.out.write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
