"""One accelerator's slice of a recipe's model, as the scale twin serves it.

A CUDA recipe states its model's geometry (`model.*.shape`) and topology. One rank of a
TP-N deployment holds 1/N of every attention head group, dense and expert intermediate
and vocabulary; with expert parallelism it holds its share of the experts whole. The
scale twin serves that slice on one lent GPU with dummy weights, cut in depth to fit
(`depth`, decided on the device), the drafter cut by the same factor so drafting keeps
its share of a step. Every way the slice differs from the rank it stands for is listed
in `substitutions`, so a figure is never read for more than it is.

Pure arithmetic over dicts: the host builds the plan with it, the unit tests check it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# kernels a rank of these architectures needs that do not travel to the lent GPU, and
# what serves in their place (the twin's patch 0007 lets Triton MLA prefill on torch)
MLA_FAMILY = {"Glm5NextForCausalLM", "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM"}
NATIVE = {"Qwen3MoeForCausalLM": "qwen3_moe", "GptOssForCausalLM": "gpt_oss", "Qwen3ForCausalLM": "qwen3"}
BF16 = 2  # bytes a parameter of the dummy weights


class ShapeProblem(Exception):
    """A recipe shape the scale twin cannot slice (one line)."""


@dataclass(frozen=True)
class Topology:
    """How many ways the recipe splits its model (vLLM's sizes)."""

    tensor_parallel: int = 1
    data_parallel: int = 1
    expert_parallel: bool = False
    pipeline_parallel: int = 1

    @property
    def expert_ways(self) -> int:
        """vLLM's expert-parallel size: TP x DP when EP is on, else none."""
        return self.tensor_parallel * self.data_parallel if self.expert_parallel else 1


@dataclass
class RankSlice:
    """The target and drafter configs of one rank at full depth, and what they stand for."""

    target: dict[str, object]
    draft: dict[str, object] | None
    full_layers: int
    draft_layers: int
    layer_bytes: int  # one MoE (or dense) decoder layer of the slice, bf16
    fixed_bytes: int  # embeddings, head and the drafter at full depth, bf16
    attention: str  # "gqa", "mla" or "native"
    substitutions: list[str] = field(default_factory=list)


def _divide(value: int, ways: int, what: str) -> int:
    if ways <= 0 or value % ways:
        raise ShapeProblem(f"{what} {value} does not divide by {ways}")
    return value // ways


def _int(config: dict[str, object], key: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ShapeProblem(f"model shape: {key} is {value!r}, not an integer")
    return value


def _experts(config: dict[str, object]) -> tuple[str, int]:
    for key in ("n_routed_experts", "num_experts", "num_local_experts"):
        if key in config:
            return key, _int(config, key)
    return "", 0


def _moe_slice(config: dict[str, object], topo: Topology, notes: list[str]) -> dict[str, object]:
    """Experts and their width for one rank: EP keeps experts whole and shares them out,
    TP keeps every expert and cuts its width."""
    key, experts = _experts(config)
    if not key:
        return {}
    top_k = _int(config, "num_experts_per_tok")
    width_key = "moe_intermediate_size" if "moe_intermediate_size" in config else "intermediate_size"
    width = _int(config, width_key)
    if topo.expert_ways > 1:
        ways = topo.expert_ways
        local = _divide(experts, ways, f"{key}")
        # a rank computes its experts for the tokens of all DP ranks: per own token about
        # top_k * local / experts * DP expert-token pairs
        share = max(1, round(top_k * local / experts * topo.data_parallel))
        notes.append(
            f"expert parallel over {ways}: {local} of {experts} experts, top-{share} "
            f"(a rank's share of top-{top_k} routing for the {topo.data_parallel} DP ranks' tokens)"
        )
        return {key: local, "num_experts_per_tok": min(share, local), width_key: width}
    return {key: experts, "num_experts_per_tok": top_k, width_key: _divide(width, topo.tensor_parallel, width_key)}


def _attention_slice(config: dict[str, object], tp: int, mla: bool) -> dict[str, object]:
    heads = _divide(_int(config, "num_attention_heads"), tp, "num_attention_heads")
    if mla:
        return {"num_attention_heads": heads, "num_key_value_heads": heads}
    kv = _int(config, "num_key_value_heads", _int(config, "num_attention_heads"))
    return {"num_attention_heads": heads, "num_key_value_heads": max(1, kv // tp)}


def _layer_params(config: dict[str, object]) -> int:
    """Parameters of one decoder layer of a sliced config (MoE layer where it has experts)."""
    hidden = _int(config, "hidden_size")
    heads = _int(config, "num_attention_heads")
    if "kv_lora_rank" in config:
        q_rank, kv_rank = _int(config, "q_lora_rank"), _int(config, "kv_lora_rank")
        nope, rope, v = (_int(config, k) for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
        attn = hidden * q_rank + q_rank * heads * (nope + rope) + hidden * (kv_rank + rope)
        attn += kv_rank * heads * (nope + v) + heads * v * hidden
    else:
        head_dim = _int(config, "head_dim", hidden // heads)
        kv = _int(config, "num_key_value_heads")
        attn = hidden * head_dim * (2 * heads + 2 * kv)
    key, experts = _experts(config)
    if key:
        width = _int(config, "moe_intermediate_size", _int(config, "intermediate_size"))
        shared = _int(config, "n_shared_experts", 0)
        mlp = 3 * hidden * width * (experts + shared) + hidden * experts
    else:
        mlp = 3 * hidden * _int(config, "intermediate_size")
    return attn + mlp


def _embedding_params(config: dict[str, object]) -> int:
    vocab, hidden = _int(config, "vocab_size"), _int(config, "hidden_size")
    return vocab * hidden * (1 if config.get("tie_word_embeddings") else 2)


def _gqa_stand_in(config: dict[str, object], tp: int) -> dict[str, object]:
    """GLM-5.3 / DeepSeek-V3.2's rank as a Glm4Moe checkpoint: GQA of the rank's query
    heads over one KV head of 128 (the probe of shared/notes/scale-twin.md)."""
    return {
        "architectures": ["Glm4MoeForCausalLM"],
        "model_type": "glm4_moe",
        "num_attention_heads": _divide(_int(config, "num_attention_heads"), tp, "num_attention_heads"),
        "num_key_value_heads": 1,
        "head_dim": 128,
        "partial_rotary_factor": 0.5,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "use_qk_norm": False,
        "attention_bias": False,
    }


def _mla_stand_in(config: dict[str, object], tp: int) -> dict[str, object]:
    """The rank as a DeepseekV3 checkpoint: MLA at the model's dimensions, no DSA indexer."""
    keys = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        **{k: _int(config, k) for k in keys},
        **_attention_slice(config, tp, mla=True),
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "rope_scaling": None,
    }


_COMMON = ("hidden_size", "first_k_dense_replace", "n_shared_experts", "num_nextn_predict_layers")
_TOKENS = {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}
POSITIONS = 8192  # the twin's context: short prompts, long decodes


def target_slice(config: dict[str, object], topo: Topology, attention: str) -> tuple[dict[str, object], list[str]]:
    """One rank's target config at full depth, and its substitutions."""
    arch = str((config.get("architectures") or ["?"])[0])
    tp = topo.tensor_parallel
    notes: list[str] = []
    if arch in MLA_FAMILY:
        base = _mla_stand_in(config, tp) if attention == "mla" else _gqa_stand_in(config, tp)
        notes.append(
            f"{arch}'s MLA + DSA attention: "
            + (
                "Triton MLA at the model's dimensions (DeepseekV3, no DSA indexer), prefill on torch (patch 0007)"
                if attention == "mla"
                else f"GQA, {base['num_attention_heads']} query heads over 1 KV head of 128 (Glm4Moe), Triton attention"
            )
        )
    elif arch in NATIVE:
        base = {"architectures": [arch], "model_type": NATIVE[arch], **_attention_slice(config, tp, mla=False)}
        for key in (
            "model_type",
            "head_dim",
            "sliding_window",
            "layer_types",
            "decoder_sparse_step",
            "mlp_only_layers",
        ):
            if key in config:
                base[key] = config[key]
    else:
        raise ShapeProblem(f"model.target.shape: architecture {arch} has no scale-twin slice")
    out: dict[str, object] = {k: config[k] for k in _COMMON if k in config}
    out.update(base)
    out.update(_moe_slice(config, topo, notes))
    if "intermediate_size" in config and "moe_intermediate_size" in out:
        out["intermediate_size"] = _divide(_int(config, "intermediate_size"), tp, "intermediate_size")
    out["vocab_size"] = _divide(_int(config, "vocab_size"), tp, "vocab_size") if tp > 1 else _int(config, "vocab_size")
    layers = _divide(_int(config, "num_hidden_layers"), topo.pipeline_parallel, "num_hidden_layers")
    if topo.pipeline_parallel > 1:
        notes.append(f"one of {topo.pipeline_parallel} pipeline stages: {layers} layers")
    out.update(num_hidden_layers=layers, max_position_embeddings=POSITIONS)
    out.update(torch_dtype="bfloat16", tie_word_embeddings=bool(config.get("tie_word_embeddings")), **_TOKENS)
    if "quantization_config" in config:
        notes.append(f"weights bf16, not {config['quantization_config']} (dummy weights; the kernels differ)")
    if tp > 1:
        notes.append(f"one of {tp} TP ranks: no all-reduce between ranks (one GPU)")
    return out, notes


def draft_slice(config: dict[str, object], topo: Topology, vocab: int) -> dict[str, object]:
    """The draft model's rank at full depth (vLLM shards the drafter as the target)."""
    tp = topo.tensor_parallel
    out = {"architectures": config.get("architectures"), **_attention_slice(config, tp, mla=False)}
    for key in ("hidden_size", "head_dim", "num_hidden_layers"):
        out[key] = _int(config, key) if key != "head_dim" else _int(config, key, 128)
    out["intermediate_size"] = _divide(_int(config, "intermediate_size"), tp, "intermediate_size")
    out.update(vocab_size=vocab, max_position_embeddings=POSITIONS, torch_dtype="bfloat16")
    out.update(tie_word_embeddings=bool(config.get("tie_word_embeddings")), model_type="qwen3", **_TOKENS)
    return out


def rank_slice(
    target: dict[str, object], draft: dict[str, object] | None, topo: Topology, attention: str = "gqa"
) -> RankSlice:
    """The whole slice: configs, sizes for the depth arithmetic, substitutions."""
    sliced, notes = target_slice(target, topo, attention)
    drafter = draft_slice(draft, topo, int(str(sliced["vocab_size"]))) if draft else None
    layer = _layer_params(sliced)
    fixed = _embedding_params(sliced)
    if drafter:
        fixed += _embedding_params(drafter) + _layer_params(drafter) * _int(drafter, "num_hidden_layers")
    return RankSlice(
        target=sliced,
        draft=drafter,
        full_layers=_int(sliced, "num_hidden_layers"),
        draft_layers=_int(drafter, "num_hidden_layers") if drafter else 0,
        layer_bytes=layer * BF16,
        fixed_bytes=fixed * BF16,
        attention="mla"
        if "kv_lora_rank" in sliced
        else "gqa"
        if "Glm4Moe" in str(sliced["architectures"])
        else "native",
        substitutions=notes,
    )


def depth(
    full_layers: int, draft_layers: int, layer_bytes: int, fixed_bytes: int, budget_bytes: int
) -> tuple[int, int]:
    """(target layers, draft layers) that fit `budget_bytes` of weights: full depth where
    it fits, else cut, the drafter by the same factor (at least one layer each)."""
    if fixed_bytes + layer_bytes > budget_bytes:
        raise ShapeProblem(
            f"one layer ({layer_bytes / 2**30:.1f} GiB) and the embeddings ({fixed_bytes / 2**30:.1f} GiB) "
            f"do not fit the {budget_bytes / 2**30:.1f} GiB weight budget"
        )
    layers = min(full_layers, (budget_bytes - fixed_bytes) // layer_bytes)
    drafted = max(1, round(draft_layers * layers / full_layers)) if draft_layers else 0
    return int(layers), drafted


def routed_share(config: dict[str, object]) -> float:
    """The routed experts' share of one MoE layer's weights: what a token whose routed
    experts are skipped saves of a verified token's price (model_check.py's `routed`)."""
    key, experts = _experts(config)
    if not key:
        return 0.0
    hidden = _int(config, "hidden_size")
    width = _int(config, "moe_intermediate_size", _int(config, "intermediate_size"))
    return 3 * hidden * width * experts / _layer_params(config)


def scale_factor(full_layers: int, layers: int) -> float:
    """How many times longer the rank's full-depth step is than the twin's (layers only)."""
    return full_layers / layers if layers else math.inf


def distinct_experts(tokens: int, experts: int, top_k: int, rho: float, trials: int = 4000, seed: int = 0) -> float:
    """Mean distinct experts a window of `tokens` consecutive tokens loads under the twin's
    routing simulation: rho 0 is vLLM's uniform_random (each token's top-k drawn afresh),
    rho > 0 is patch 0006's kiln_correlated (each slot keeps the previous token's expert
    with probability rho). The same draws as the patch, in plain Python."""
    import random

    rng = random.Random(seed)  # a simulation, not a secret  # noqa: S311
    total = 0
    for _ in range(trials):
        slots = rng.sample(range(experts), top_k)
        seen = set(slots)
        for _ in range(tokens - 1):
            fresh = rng.sample(range(experts), top_k)
            slots = [old if rng.random() < rho else new for old, new in zip(slots, fresh, strict=True)]
            seen.update(slots)
        total += len(seen)
    return total / trials
