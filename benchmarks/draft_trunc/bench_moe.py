"""draft_trunc benchmark on one GPU: what skipping dead draft tokens saves in a
GLM-5-like MoE layer, against the ideal, and what mark_dead itself costs.

Layer: hidden 6144, 256 routed experts (top-8, intermediate 2048), one shared
expert, bf16, all experts resident; grouped GEMMs via torch._grouped_mm. Verify
batches of R requests x (1 + 4) tokens; at dead fraction f, round(f * tokens)
draft-tail tokens are dead (never t0). "skip" drops dead tokens' routes before
the grouped GEMMs (what expert id -1 does in vLLM); "keep" routes every token.

Ideal time of a variant = max(bytes of the weights it must read / measured copy
bandwidth, its FLOPs / measured bf16 matmul rate). Saving ratio = measured
saving / ideal saving; it is only meaningful where the ideal saving is not ~0.

Usage: python benchmarks/draft_trunc/bench_moe.py [--out results.json] [--quick]
"""

from __future__ import annotations

import argparse
import functools
import json
import os

import torch
from kiln_testkit.gpubench import timed_eager, timed_graph, write_result

H, E, TOPK, INTER = 6144, 256, 8, 2048
DRAFTS = 4
SIZES = (8, 32, 128, 512)
DEAD = (0.0, 0.25, 0.5, 0.75)


def ceilings() -> dict:
    """Measured ceilings. Timed eagerly: a D2D copy captured in a CUDA graph
    becomes a memcpy node that ran at ~2.7 TB/s here, well under what kernels
    stream. The weight-streaming ceiling is the better of a copy kernel
    (bytes read + written) and a read-only reduction (bytes read)."""
    src = torch.empty(1024**3, dtype=torch.float32, device="cuda").normal_()
    dst = torch.empty_like(src)
    copy_bw = 2 * src.numel() * 4 / timed_eager(functools.partial(dst.copy_, src))
    read_bw = src.numel() * 4 / timed_eager(src.sum)
    del src, dst
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    t = timed_graph(lambda: a @ b, iters=10)
    return {
        "copy_bytes_per_s": copy_bw,
        "read_bytes_per_s": read_bw,
        "stream_bytes_per_s": max(copy_bw, read_bw),
        "bf16_flops_per_s": 2 * 8192**3 / t,
    }


class Layer:
    def __init__(self):
        g = torch.Generator("cuda").manual_seed(0)
        scale = 0.02
        self.w13 = torch.randn(E, 2 * INTER, H, generator=g, device="cuda", dtype=torch.bfloat16) * scale
        self.w2 = torch.randn(E, H, INTER, generator=g, device="cuda", dtype=torch.bfloat16) * scale
        self.s13 = torch.randn(2 * INTER, H, generator=g, device="cuda", dtype=torch.bfloat16) * scale
        self.s2 = torch.randn(H, INTER, generator=g, device="cuda", dtype=torch.bfloat16) * scale
        self.expert_ids = torch.arange(E, device="cuda")
        self.expert_bytes = (self.w13[0].numel() + self.w2[0].numel()) * 2
        self.shared_bytes = (self.s13.numel() + self.s2.numel()) * 2

    def routed(self, x, ids, weights, live):
        """Routed experts; routes of dead tokens (live False) go to a sentinel
        group past the last expert and are never multiplied."""
        num_tokens = x.shape[0]
        flat = torch.where(live[:, None], ids, E).flatten()
        order = torch.argsort(flat, stable=True)
        # Group ends without a host sync (bincount would sync, breaking capture).
        offs = torch.searchsorted(flat[order], self.expert_ids, right=True).to(torch.int32)
        token = order // TOPK
        a = x[token]
        h = torch._grouped_mm(a, self.w13.transpose(-2, -1), offs=offs)
        gate, up = h.chunk(2, dim=-1)
        act = torch.nn.functional.silu(gate) * up
        y = torch._grouped_mm(act, self.w2.transpose(-2, -1), offs=offs)
        w = torch.where(live[:, None], weights, 0.0).flatten()[order]
        out = torch.zeros(num_tokens, H, device="cuda", dtype=torch.float32)
        # Rows past offs[-1] (dead routes) are zero-weighted; nan_to_num keeps
        # their unwritten output rows from poisoning the sum.
        out.index_add_(0, token, torch.nan_to_num(y.float()) * w[:, None])
        return out

    def shared(self, x):
        gate, up = (x @ self.s13.T).chunk(2, dim=-1)
        return (torch.nn.functional.silu(gate) * up) @ self.s2.T


def check_skip_path(layer: Layer) -> float:
    """Max relative error of the skip path's live rows against a per-expert
    loop, so that the timing below measures a correct computation."""
    g = torch.Generator("cuda").manual_seed(2)
    x = torch.randn(40, H, device="cuda", dtype=torch.bfloat16, generator=g)
    weights, ids = torch.softmax(torch.rand(40, E, device="cuda", generator=g), -1).topk(TOPK, -1)
    live = dead_mask(8, 0.5)
    got = layer.routed(x, ids, weights, live)
    ref = torch.zeros_like(got)
    for t in range(40):
        if not bool(live[t]):
            continue
        for s in range(TOPK):
            e = int(ids[t, s])
            gate, up = (x[t] @ layer.w13[e].T).float().chunk(2)
            act = (torch.nn.functional.silu(gate) * up).to(torch.bfloat16)
            ref[t] += (act @ layer.w2[e].T).float() * weights[t, s]
    assert not got[~live].any(), "dead rows must stay zero"
    return float((got - ref).abs().max() / ref.abs().max())


def dead_mask(num_reqs: int, frac: float) -> torch.Tensor:
    """True for live tokens; round(frac * tokens) draft-tail tokens are dead."""
    per = 1 + DRAFTS
    total_dead = round(frac * num_reqs * per)
    dead = torch.full((num_reqs,), total_dead // num_reqs)
    dead[: total_dead % num_reqs] += 1
    assert int(dead.max()) <= DRAFTS
    pos = torch.arange(per).repeat(num_reqs)
    return (pos < per - dead.repeat_interleave(per)).cuda()


# every bench_* takes the same arguments
def bench_moe(layer: Layer, ceil: dict, quick: bool) -> list[dict]:  # noqa: ARG001
    rows = []
    g = torch.Generator("cuda").manual_seed(1)
    for num_reqs in SIZES:
        tokens = num_reqs * (1 + DRAFTS)
        x = torch.randn(tokens, H, device="cuda", dtype=torch.bfloat16, generator=g)
        logits = torch.rand(tokens, E, device="cuda", generator=g)
        weights, ids = torch.softmax(logits, -1).topk(TOPK, dim=-1)
        all_live = torch.ones(tokens, dtype=torch.bool, device="cuda")
        t_keep = timed_graph(functools.partial(layer.routed, x, ids, weights, all_live))
        t_shared = timed_graph(functools.partial(layer.shared, x))
        ideal_keep = ideal(layer, ceil, ids, all_live)
        for frac in DEAD:
            live = dead_mask(num_reqs, frac)
            t_skip = timed_graph(functools.partial(layer.routed, x, ids, weights, live))
            ideal_skip = ideal(layer, ceil, ids, live)
            saved, ideal_saved = t_keep - t_skip, ideal_keep - ideal_skip
            rows.append(
                {
                    "requests": num_reqs,
                    "tokens": tokens,
                    "dead_frac": frac,
                    "experts_touched": int(torch.unique(ids[live]).numel()),
                    "routed_keep_us": t_keep * 1e6,
                    "routed_skip_us": t_skip * 1e6,
                    "shared_us": t_shared * 1e6,
                    "ideal_keep_us": ideal_keep * 1e6,
                    "ideal_skip_us": ideal_skip * 1e6,
                    "saved_frac": saved / t_keep,
                    "ideal_saved_frac": ideal_saved / ideal_keep,
                    # Share of the ideal relative saving reached (None where the
                    # ideal saving is under 2%, i.e. there is nothing to reach).
                    "saving_ratio": (
                        (saved / t_keep) / (ideal_saved / ideal_keep) if ideal_saved > 0.02 * ideal_keep else None
                    ),
                    "saved_us": saved * 1e6,
                    "ideal_saved_us": ideal_saved * 1e6,
                    "keep_vs_ideal": t_keep / ideal_keep,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def ideal(layer: Layer, ceil: dict, ids: torch.Tensor, live: torch.Tensor) -> float:
    touched = int(torch.unique(ids[live]).numel())
    routes = int(live.sum()) * TOPK
    t_bytes = touched * layer.expert_bytes / ceil["stream_bytes_per_s"]
    t_flops = routes * 2 * 3 * H * INTER / ceil["bf16_flops_per_s"]
    return max(t_bytes, t_flops)


def bench_mark_dead() -> list[dict]:
    os.environ["KILN_DRAFT_TRUNC"] = "1"
    import kiln_engine.draft_trunc as dtm
    import numpy as np
    from kiln_testkit.dt_batches import random_batch

    dtm.reload({"KILN_DRAFT_TRUNC": "1", "KILN_DRAFT_TRUNC_TAU": "0.3"})
    rows = []
    for num_reqs in (*SIZES, 1024):
        b = random_batch(np.random.default_rng(0), num_reqs, DRAFTS, mixed=False).to("cuda")
        dtm.prepare(b.predictions.shape[0], "cuda")

        call = functools.partial(b.mark_dead, dtm)
        device_s = timed_graph(call, iters=200)
        call()
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(200):
            call()
        end.record()
        end.synchronize()
        rows.append(
            {
                "requests": num_reqs,
                "graph_us": device_s * 1e6,
                "eager_us": start.elapsed_time(end) * 1e3 / 200,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="draft-trunc-bench.json")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to benchmark")
        return
    ceil = ceilings()
    print(json.dumps(ceil), flush=True)
    md = bench_mark_dead()
    layer = Layer()
    rel_err = check_skip_path(layer)
    print(json.dumps({"skip_path_rel_err": rel_err}), flush=True)
    moe = bench_moe(layer, ceil, args.quick)
    write_result(args.out, ceilings=ceil, skip_path_rel_err=rel_err, mark_dead=md, moe=moe)


if __name__ == "__main__":
    main()
