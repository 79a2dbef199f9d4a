#!/usr/bin/env python3
"""The GPU twin's models: recipes/_shared/make_models.py's target and draft, at a shape
whose verify step costs more with every token it verifies.

make_models.py's own shape (4 layers, hidden 128, 8 experts) is so small that a step
costs the same at 1 and at 160 tokens on an H100, so vLLM's adaptive verification
admits every draft there (docs/draft-trunc.md, "GPU twin"). GLM-5.3's verify step grows
with tokens because more tokens route to more of its 256 experts, each read from
memory once per step. This shape keeps that property at a size that generates in about
a minute: 128 experts, top-2, so 5 tokens touch about 10 experts a layer and 160
tokens about 120 (`--shape tiny` keeps make_models.py's own).

The construction (draft = noisy copy of the target's first layer, later layers damped),
the tokenizer and the file layout are make_models.py's, called here; only the sizes
differ. make_models.py's CPU report (HF generate) is skipped: at this size it takes
minutes on one thread, and vLLM's spec-decode counters report the acceptance anyway.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

SHAPES = {
    # name: (hidden, heads, kv_heads, head_dim, layers, experts, top_k, expert_dim)
    "tiny": (128, 4, 2, 32, 4, 8, 2, 64),
    "av-cut": (512, 8, 4, 64, 8, 128, 2, 512),
}


def _make_models(path: Path):
    spec = importlib.util.spec_from_file_location("make_models", path)
    if spec is None or spec.loader is None:
        sys.exit(f"twin_models: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> None:
    here = Path(__file__).resolve().parent
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--shape", choices=sorted(SHAPES), default="av-cut")
    p.add_argument("--make-models", type=Path, default=here.parents[1] / "recipes" / "_shared" / "make_models.py")
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default="float32")
    p.add_argument("--draft-noise", type=float, default=0.05)
    p.add_argument("--expert-spread", type=float, default=0.05)
    p.add_argument("--damp", type=float, default=0.01)
    args = p.parse_args(argv)
    mm = _make_models(args.make_models)
    hidden, heads, kv_heads, head_dim, layers, experts, top_k, expert_dim = SHAPES[args.shape]
    # make_models' helpers read these module globals when called
    mm.HIDDEN, mm.HEADS, mm.KV_HEADS, mm.HEAD_DIM, mm.EXPERT_DIM = hidden, heads, kv_heads, head_dim, expert_dim
    torch, transformers = mm.torch, sys.modules["transformers"]
    os.makedirs(args.out, exist_ok=True)
    tok = mm.tokenizer()
    base = mm.common(tok)
    torch.set_num_threads(1)
    torch.manual_seed(mm.SEED)
    gen = torch.Generator().manual_seed(mm.SEED)
    target = transformers.AutoModelForCausalLM.from_config(
        mm.Qwen3MoeConfig(
            intermediate_size=2 * expert_dim,
            num_hidden_layers=layers,
            moe_intermediate_size=expert_dim,
            num_experts=experts,
            num_experts_per_tok=top_k,
            decoder_sparse_step=1,
            norm_topk_prob=True,
            mlp_only_layers=[],
            **base,
        )
    )
    draft = transformers.AutoModelForCausalLM.from_config(
        mm.Qwen3Config(intermediate_size=expert_dim, num_hidden_layers=1, **base)
    )
    mm.shape_target(target, args.expert_spread, args.damp, gen)
    mm.draft_from(target, draft, args.draft_noise, gen)
    dtype = getattr(torch, args.dtype)
    mm.save(target.to(dtype), tok, f"{args.out}/tiny-qwen3moe", dtype)
    mm.save(draft.to(dtype), tok, f"{args.out}/tiny-qwen3-draft", dtype)
    print(
        f"twin_models: shape {args.shape} (hidden {hidden}, {layers} layers, {experts} experts top-{top_k} "
        f"of {expert_dim}), draft noise {args.draft_noise}, damp {args.damp}"
    )


if __name__ == "__main__":
    main()
