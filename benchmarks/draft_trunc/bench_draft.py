"""What drafting costs next to verifying, on one GPU: the numbers behind the
drafter prices of sim_trunc.py.

Measured, bf16, random weights, CUDA-graph replay unless said otherwise:

- the GLM-5-like target layer's pieces at N scheduled tokens (N = R x 1 and R x 5 for R
  verifying requests): routed experts (bench_moe.py's layer, every token live),
  the shared expert, an MLA-like attention block over a latent KV cache of
  CONTEXT tokens per request (the projections' weights and one pass over the
  cache; no DSA indexer: at this context it would attend densely), the lm_head
  (154,880 x 6144) and an MTP-style eh_proj (12,288 -> 6144);
- two "kindling-class" dense draft models (Qwen3-like, GLM's vocabulary): one
  decode step for R requests (1 token each) replayed from a graph and launched
  eagerly (vLLM 0.32.0/0.33.0 run the draft_model drafter eagerly: its
  StandaloneARSpeculator captures no graph), and the first drafting step, which
  runs over R x (1 + K + 1) tokens (accepted tokens, the correction token and the
  rejected slots: standalone_ar/speculator.py);
- what a host sync between draft steps costs (an early exit decided on the
  device and read by the host), eager, wall clock.

The MTP head of DeepSeek/GLM is one decoder layer (attention + MoE) plus eh_proj
and the lm_head: its time is composed from the pieces above (same kernels).

Usage: python benchmarks/draft_trunc/bench_draft.py [--out FILE] [--quick]
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import torch
import torch.nn.functional as F
from bench_moe import TOPK, E, H, Layer
from kiln_testkit.gpubench import timed_eager, timed_graph, write_result

SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
CONTEXT = 1024
DRAFTS = 4
VOCAB = 154_880
# MLA-like attention (GLM-5: 64 heads, q_lora 2048, kv_lora 512 + rope 64,
# qk_nope 192, v 256)
HEADS, Q_LORA, KV_LORA, ROPE, NOPE, VDIM = 64, 2048, 512, 64, 192, 256
# name: layers, hidden, heads, kv heads, head dim, MLP intermediate
DRAFT_MODELS = {
    "kindling-0.6b": (28, 1024, 16, 8, 128, 3072),
    "kindling-1.7b": (28, 2048, 16, 8, 128, 6144),
}


def rand(*shape, scale=0.02):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * scale


class MLA:
    """Weights and latent cache of one MLA-like attention block."""

    def __init__(self, max_reqs: int):
        self.q_a, self.q_b = rand(Q_LORA, H), rand(HEADS * (NOPE + ROPE), Q_LORA)
        self.kv_a = rand(KV_LORA + ROPE, H)
        self.w_uk, self.w_uv = rand(HEADS, NOPE, KV_LORA), rand(HEADS, KV_LORA, VDIM)
        self.o = rand(H, HEADS * VDIM)
        self.cache = rand(max_reqs, CONTEXT, KV_LORA + ROPE, scale=1.0)

    def __call__(self, x: torch.Tensor, reqs: int) -> torch.Tensor:
        t = x.shape[0]
        q = F.rms_norm(x @ self.q_a.T, (Q_LORA,)) @ self.q_b.T
        q = q.view(t, HEADS, NOPE + ROPE)
        _ = x @ self.kv_a.T  # the new tokens' latent (written to the cache in vLLM)
        q_lat = torch.bmm(q[..., :NOPE].transpose(0, 1), self.w_uk)  # [heads, t, 512]
        q_full = torch.cat([q_lat, q[..., NOPE:].transpose(0, 1)], dim=-1)
        q_req = q_full.transpose(0, 1).reshape(reqs, -1, KV_LORA + ROPE)
        cache = self.cache[:reqs]
        probs = torch.softmax(q_req @ cache.transpose(1, 2), dim=-1)
        out = (probs @ cache[..., :KV_LORA]).view(t, HEADS, KV_LORA).transpose(0, 1)
        return torch.bmm(out, self.w_uv).transpose(0, 1).reshape(t, -1) @ self.o.T


class DenseDraft:
    """A Qwen3-like dense decoder with GLM's vocabulary (tied lm_head)."""

    def __init__(self, layers, hidden, heads, kv_heads, head_dim, inter, max_reqs):
        self.hidden, self.heads, self.kv, self.hd = hidden, heads, kv_heads, head_dim
        qkv = (heads + 2 * kv_heads) * head_dim
        self.layers = [
            (rand(qkv, hidden), rand(hidden, heads * head_dim), rand(2 * inter, hidden), rand(hidden, inter))
            for _ in range(layers)
        ]
        self.embed = rand(VOCAB, hidden)
        # one K/V buffer read by every layer: the bytes each layer streams are real
        self.k = rand(max_reqs, kv_heads, CONTEXT, head_dim, scale=1.0)
        self.v = rand(max_reqs, kv_heads, CONTEXT, head_dim, scale=1.0)

    def params(self) -> int:
        return sum(w.numel() for layer in self.layers for w in layer) + self.embed.numel()

    def __call__(self, x: torch.Tensor, reqs: int) -> torch.Tensor:
        t, q_dim = x.shape[0], self.heads * self.hd
        group = self.heads // self.kv
        for wqkv, wo, wgu, wd in self.layers:
            qkv = F.rms_norm(x, (self.hidden,)) @ wqkv.T
            q = qkv[:, :q_dim].reshape(reqs, t // reqs, self.kv, group, self.hd)
            q = q.permute(0, 2, 1, 3, 4).reshape(reqs, self.kv, -1, self.hd)
            probs = torch.softmax(q @ self.k[:reqs].transpose(-1, -2), dim=-1)
            att = (probs @ self.v[:reqs]).view(reqs, self.kv, t // reqs, group, self.hd)
            x = x + att.permute(0, 2, 1, 3, 4).reshape(t, q_dim) @ wo.T
            gate, up = (F.rms_norm(x, (self.hidden,)) @ wgu.T).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ wd.T
        last = x.view(reqs, t // reqs, -1)[:, -1]  # the drafter samples one token per request
        return (F.rms_norm(last, (self.hidden,)) @ self.embed.T).argmax(-1)


def routing(tokens: int, g: torch.Generator):
    logits = torch.rand(tokens, E, device="cuda", generator=g)
    return torch.softmax(logits, -1).topk(TOPK, dim=-1)


def bench_target(layer: Layer, mla: MLA, lm_head, eh_proj, sizes, iters) -> list[dict]:
    """Per-piece time of the GLM-5-like layer at N = R x m tokens, m = 1 and 5."""
    rows = []
    g = torch.Generator("cuda").manual_seed(1)
    for reqs in sizes:
        for per in (1, DRAFTS + 1):  # K = 0 and K = 4 windows
            n = reqs * per
            x = torch.randn(n, H, device="cuda", dtype=torch.bfloat16, generator=g)
            weights, ids = routing(n, g)
            live = torch.ones(n, dtype=torch.bool, device="cuda")
            timed = functools.partial(timed_graph, iters=iters)
            row = {
                "requests": reqs,
                "tokens": n,
                "experts_touched": int(torch.unique(ids).numel()),
                "routed_us": timed(functools.partial(layer.routed, x, ids, weights, live)) * 1e6,
                "shared_us": timed(functools.partial(layer.shared, x)) * 1e6,
                "attn_us": timed(functools.partial(mla, x, reqs)) * 1e6,
                "lm_head_us": timed(lambda x=x: (x @ lm_head.T).argmax(-1)) * 1e6,
                "eh_proj_us": timed(lambda x=x: torch.cat([x, x], -1) @ eh_proj.T) * 1e6,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def bench_drafts(sizes, iters) -> list[dict]:
    rows = []
    for name, shape in DRAFT_MODELS.items():
        model = DenseDraft(*shape, max_reqs=max(sizes))
        hidden = shape[1]
        for reqs in sizes:
            dec = rand(reqs, hidden, scale=1.0)
            pre = rand(reqs * (DRAFTS + 2), hidden, scale=1.0)
            row = {
                "model": name,
                "params": model.params(),
                "requests": reqs,
                "decode_graph_us": timed_graph(functools.partial(model, dec, reqs), iters=iters) * 1e6,
                "decode_eager_us": timed_eager(functools.partial(model, dec, reqs)) * 1e6,
                "first_step_graph_us": timed_graph(functools.partial(model, pre, reqs), iters=iters) * 1e6,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
        del model
        torch.cuda.empty_cache()
    return rows


def bench_sync(sizes=(1, 8, 64), steps=DRAFTS - 1, reps=10) -> list[dict]:
    """Eager decode steps back to back, without and with a host read of a device
    flag after each (what a drafting early exit decided on the device costs)."""
    model = DenseDraft(*DRAFT_MODELS["kindling-0.6b"], max_reqs=max(sizes))
    rows = []
    for reqs in sizes:
        x = rand(reqs, model.hidden, scale=1.0)

        def run(sync: bool, x=x, reqs=reqs) -> float:
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(steps):
                ids = model(x, reqs)
                if sync:
                    bool((ids >= 0).all())  # the host reads a device decision
            torch.cuda.synchronize()
            return time.perf_counter() - start

        run(False), run(True)
        plain = sorted(run(False) for _ in range(reps))[reps // 2]
        synced = sorted(run(True) for _ in range(reps))[reps // 2]
        row = {
            "requests": reqs,
            "steps": steps,
            "plain_us": plain * 1e6,
            "synced_us": synced * 1e6,
            "per_sync_us": (synced - plain) * 1e6 / steps,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="draft-cost.json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to benchmark")
        return
    sizes = (1, 8, 64) if args.quick else tuple(args.sizes)
    iters = 5 if args.quick else 10
    start = time.monotonic()
    print(f"bench_draft: sizes {sizes}, context {CONTEXT}, K={DRAFTS}", flush=True)
    sync = bench_sync()
    drafts = bench_drafts(sizes, iters)
    print(f"drafts done ({time.monotonic() - start:.0f} s)", flush=True)
    layer = Layer()
    mla = MLA(max(sizes) * 1)
    lm_head, eh_proj = rand(VOCAB, H), rand(H, 2 * H)
    target = bench_target(layer, mla, lm_head, eh_proj, sizes, iters)
    print(f"target done ({time.monotonic() - start:.0f} s)", flush=True)
    write_result(
        args.out,
        context=CONTEXT,
        drafts_k=DRAFTS,
        vocab=VOCAB,
        draft_models={k: list(v) for k, v in DRAFT_MODELS.items()},
        sync=sync,
        draft=drafts,
        target=target,
    )


if __name__ == "__main__":
    main()
