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

The MTP twin (`tiny-glm4moe-mtp`) is the same target written as a GLM-4.5 MoE checkpoint
(vLLM's `Glm4MoeForCausalLM`: standard attention, so Triton attention serves it, unlike
DeepSeek-V3.2's MLA with sparse indexing) plus one multi-token-prediction layer, which
vLLM loads as `Glm4MoeMTP` for `"method": "mtp"`. The MTP layer reads
eh_proj([enorm(embedding of token t+1), hnorm(hidden of t)]); here eh_proj passes the
embedding through (enorm scaled to the embedding's own RMS) with a faint hidden part,
and its block is a noisy copy of the target's layer 0. As the target's later layers are
damped, the head then predicts token t+2 about as well as the draft model does.
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


def _expert_tensors(state: dict, layer: str, experts: int) -> dict:
    """One layer's experts as vLLM's Glm4Moe loader names them (one tensor per expert and
    projection), from either layout transformers writes: per expert, or fused
    (`experts.gate_up_proj` [E, 2I, H] with gate rows first, `experts.down_proj` [E, H, I])."""
    fused = f"{layer}.mlp.experts.gate_up_proj"
    if fused not in state:
        return {k: v for k, v in state.items() if k.startswith(f"{layer}.mlp.experts.")}
    gate_up, down = state[fused], state[f"{layer}.mlp.experts.down_proj"]
    half = gate_up.shape[1] // 2
    out = {}
    for e in range(experts):
        out[f"{layer}.mlp.experts.{e}.gate_proj.weight"] = gate_up[e, :half].clone()
        out[f"{layer}.mlp.experts.{e}.up_proj.weight"] = gate_up[e, half:].clone()
        out[f"{layer}.mlp.experts.{e}.down_proj.weight"] = down[e].clone()
    return out


def mtp_twin(source: Path, out: Path, noise: float, gen, jitter) -> None:
    """source (the saved Qwen3-MoE target) as a Glm4Moe checkpoint with one MTP layer."""
    import json
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    cfg = json.loads((source / "config.json").read_text())
    state: dict = {}
    for part in sorted(source.glob("*.safetensors")):
        state.update(load_file(str(part)))
    layers = cfg["num_hidden_layers"]
    experts = cfg.get("num_experts", cfg.get("num_local_experts"))  # transformers 5 renamed it
    glm: dict = {k: v for k, v in state.items() if ".mlp." not in k}
    for i in range(layers + 1):  # layer `layers` is the MTP block, from layer 0
        src, dst = "model.layers.0" if i == layers else f"model.layers.{i}", f"model.layers.{i}"
        block = {k: v for k, v in state.items() if k.startswith(src + ".") and ".mlp." not in k}
        block[f"{src}.mlp.gate.weight"] = state[f"{src}.mlp.gate.weight"]
        block.update(_expert_tensors(state, src, experts))
        some = state[f"{src}.mlp.gate.weight"]
        block[f"{src}.mlp.gate.e_score_correction_bias"] = torch.zeros(experts, dtype=torch.float32)
        inner = cfg["moe_intermediate_size"]
        # a shared expert of zeros: Glm4Moe has one, the Qwen3-MoE target has none
        for name, shape in (
            ("gate_proj", (inner, cfg["hidden_size"])),
            ("up_proj", (inner, cfg["hidden_size"])),
            ("down_proj", (cfg["hidden_size"], inner)),
        ):
            block[f"{src}.mlp.shared_experts.{name}.weight"] = torch.zeros(shape, dtype=some.dtype)
        for k, v in block.items():
            moved = dst + k[len(src) :]
            glm[moved] = jitter(v, noise, gen) if i == layers and v.dim() > 1 and ".shared_experts." not in k else v
    embed, hidden = state["model.embed_tokens.weight"], cfg["hidden_size"]
    rms = embed.float().pow(2).mean(-1).sqrt().mean().item()
    mtp = f"model.layers.{layers}"
    glm[f"{mtp}.enorm.weight"] = torch.full((hidden,), rms, dtype=embed.dtype)
    glm[f"{mtp}.hnorm.weight"] = torch.ones(hidden, dtype=embed.dtype)
    faint = torch.randn((hidden, hidden), generator=gen) * (1e-3 * rms)
    glm[f"{mtp}.eh_proj.weight"] = torch.cat([torch.eye(hidden), faint], dim=1).to(embed.dtype)
    glm[f"{mtp}.shared_head.norm.weight"] = state["model.norm.weight"].clone()
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.clone().contiguous() for k, v in glm.items()}, str(out / "model.safetensors"), metadata={"format": "pt"}
    )
    for name in source.iterdir():
        if name.suffix != ".safetensors" and name.name not in ("config.json", "model.safetensors.index.json"):
            shutil.copy(name, out / name.name)
    keep = (
        "vocab_size",
        "hidden_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rms_norm_eps",
        "max_position_embeddings",
        "rope_theta",
        "rope_parameters",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "torch_dtype",
        "dtype",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "num_hidden_layers",
        "norm_topk_prob",
    )
    glm_cfg = {k: cfg[k] for k in keep if k in cfg} | {
        "architectures": ["Glm4MoeForCausalLM"],
        "model_type": "glm4_moe",
        "hidden_act": "silu",
        "intermediate_size": 2 * cfg["moe_intermediate_size"],
        "n_routed_experts": experts,
        "n_shared_experts": 1,
        "routed_scaling_factor": 1.0,
        "n_group": 1,
        "topk_group": 1,
        "first_k_dense_replace": 0,
        "num_nextn_predict_layers": 1,
        "attention_bias": False,
        "use_qk_norm": True,
        "tie_word_embeddings": False,
    }
    (out / "config.json").write_text(json.dumps(glm_cfg, indent=1) + "\n")
    for root, _, names in os.walk(out):
        for name in names:
            os.chmod(os.path.join(root, name), 0o644)
    params = sum(v.numel() for v in glm.values())
    print(f"{out}: Glm4MoeForCausalLM + 1 MTP layer, {params / 1e6:.2f}M params, embedding RMS {rms:.4f}")


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
    mtp_twin(Path(args.out) / "tiny-qwen3moe", Path(args.out) / "tiny-glm4moe-mtp", args.draft_noise, gen, mm.jitter)
    print(
        f"twin_models: shape {args.shape} (hidden {hidden}, {layers} layers, {experts} experts top-{top_k} "
        f"of {expert_dim}), draft noise {args.draft_noise}, damp {args.damp}"
    )


if __name__ == "__main__":
    main()
