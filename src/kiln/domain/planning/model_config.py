"""A model's shape as its config.json states it (`parse_config`: layers, heads, experts,
MLA, sliding windows, MTP layers) and the parameters that shape holds per layer: the
plan's inputs about the model itself (kiln.domain.planning.plan does the arithmetic)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kiln.basics.errors import ModelShapeUnknown

# A Hugging Face config.json as read: its keys differ per model family (and nest a
# text_config, a quantization_config...), so the parser reads it field by field with
# checks rather than through one TypedDict that every family would break.
HfConfig = dict[str, Any]
_FP8_BLOCK = (128, 128)  # DeepSeek's block-scaled FP8 (weight_block_size), one fp32 scale per block
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}


# -- the model's shape, read from its config.json ----------------------------------------
@dataclass(frozen=True)
class _Mla:
    kv_lora_rank: int
    q_lora_rank: int  # 0: no low-rank q projection
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class ModelShape:
    """What sizing needs of a model's config.json: layers, widths, heads, experts, MLA and MTP shape."""

    arch: str
    layers: int
    hidden: int
    vocab: int
    tied: bool
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # a dense layer's MLP
    experts: int  # routed experts per MoE layer; 0: dense model
    top_k: int
    expert_intermediate: int
    shared_intermediate: int  # shared experts of one MoE layer, together
    dense_layers: int  # layers with a dense MLP in a MoE model
    mla: _Mla | None
    indexer_head_dim: int  # DeepSeek-V3.2's sparse-attention indexer (0: none)
    indexer_heads: int
    mtp_layers: int
    sliding_layers: int
    sliding_window: int
    quant: str  # "", "fp8", "mxfp4"
    fp8_block: tuple[int, int]
    dtype_bytes: float
    max_position: int
    source: str = ""

    @property
    def moe_layers(self) -> int:
        """How many layers hold experts; 0 for a dense model."""
        return self.layers - self.dense_layers if self.experts else 0


def _text(config: HfConfig) -> HfConfig:
    """The language model's part of a multimodal config (text_config), merged over the top."""
    inner = config.get("text_config")
    return {**config, **inner} if isinstance(inner, dict) else config


def _int(cfg: HfConfig, *names: str, default: int | None = None, what: str = "") -> int:
    for name in names:
        value = cfg.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    if default is not None:
        return default
    raise ModelShapeUnknown(f"{what}config has no {' / '.join(names)}")


def parse_config(config: HfConfig, *, what: str = "", source: str = "") -> ModelShape:
    """The numbers the plan needs from a config.json (or a recipe's `shape:` block)."""
    cfg = _text(config)
    arch = (cfg.get("architectures") or [cfg.get("model_type") or "?"])[0]
    hidden = _int(cfg, "hidden_size", what=what)
    layers = _int(cfg, "num_hidden_layers", what=what)
    heads = _int(cfg, "num_attention_heads", what=what)
    kv_heads = _int(cfg, "num_key_value_heads", default=heads)
    head_dim = _int(cfg, "head_dim", default=hidden // heads)
    experts = _int(cfg, "n_routed_experts", "num_experts", "num_local_experts", default=0)
    mla = None
    if _int(cfg, "kv_lora_rank", default=0):
        mla = _Mla(
            kv_lora_rank=_int(cfg, "kv_lora_rank"),
            q_lora_rank=_int(cfg, "q_lora_rank", default=0),
            qk_nope_head_dim=_int(cfg, "qk_nope_head_dim", what=what),
            qk_rope_head_dim=_int(cfg, "qk_rope_head_dim", what=what),
            v_head_dim=_int(cfg, "v_head_dim", what=what),
        )
    dense_layers = 0
    if experts:
        dense_layers = _int(cfg, "first_k_dense_replace", default=0)
        only = cfg.get("mlp_only_layers") or []
        step = _int(cfg, "decoder_sparse_step", default=1)
        if isinstance(only, list) and only:
            dense_layers = max(dense_layers, len(only))
        if step > 1:
            dense_layers = max(dense_layers, layers - layers // step)
    expert_inter = _int(cfg, "moe_intermediate_size", "intermediate_size", default=0) if experts else 0
    shared = 0
    if experts:
        n_shared = _int(cfg, "n_shared_experts", "num_shared_experts", default=0)
        shared = n_shared * expert_inter or _int(cfg, "shared_expert_intermediate_size", default=0)
    types = cfg.get("layer_types")
    layer_types: list[Any] = types if isinstance(types, list) else []
    sliding = sum(1 for t in layer_types if t == "sliding_attention")
    window = _int(cfg, "sliding_window", default=0) if sliding else 0
    qc = cfg.get("quantization_config")
    quant_cfg: HfConfig = qc if isinstance(qc, dict) else {}
    method = str(quant_cfg.get("quant_method", "")).lower()
    quant = "fp8" if method == "fp8" else "mxfp4" if method == "mxfp4" else ""
    block = quant_cfg.get("weight_block_size") or list(_FP8_BLOCK)
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    return ModelShape(
        arch=str(arch),
        layers=layers,
        hidden=hidden,
        vocab=_int(cfg, "vocab_size", what=what),
        tied=bool(cfg.get("tie_word_embeddings", False)),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=_int(cfg, "intermediate_size", default=0),
        experts=experts,
        top_k=_int(cfg, "num_experts_per_tok", "experts_per_token", "moe_topk", default=0) if experts else 0,
        expert_intermediate=expert_inter,
        shared_intermediate=shared,
        dense_layers=dense_layers,
        mla=mla,
        indexer_head_dim=_int(cfg, "index_head_dim", default=0),
        indexer_heads=_int(cfg, "index_n_heads", default=0),
        mtp_layers=_int(cfg, "num_nextn_predict_layers", default=0),
        sliding_layers=sliding,
        sliding_window=window,
        quant=quant,
        fp8_block=(int(block[0]), int(block[1])),
        dtype_bytes=DTYPE_BYTES.get(dtype, 2),
        max_position=_int(cfg, "max_position_embeddings", default=0),
        source=source,
    )


# -- parameters ---------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerParams:
    """Parameters of one decoder layer by how vLLM shards them."""

    attn_split: int  # split over TP ranks (q/k/v/o, MLA's q and kv_b and o, the indexer's q)
    attn_whole: int  # on every TP rank (MLA's kv_a, the indexer's k and weights)
    dense_mlp: int  # gate, up, down of a dense MLP (split over TP)
    experts: int  # all routed experts of a MoE layer
    shared: int  # shared experts (split over TP)
    router: int  # on every rank


def layer_params(shape: ModelShape, *, moe: bool) -> LayerParams:
    """The parameter counts of one decoder layer, dense or MoE, by how vLLM shards them."""
    h = shape.hidden
    if shape.mla:
        m = shape.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        q = h * m.q_lora_rank + m.q_lora_rank * shape.heads * qk if m.q_lora_rank else h * shape.heads * qk
        kv_b = m.kv_lora_rank * shape.heads * (m.qk_nope_head_dim + m.v_head_dim)
        o = shape.heads * m.v_head_dim * h
        split, whole = q + kv_b + o, h * (m.kv_lora_rank + m.qk_rope_head_dim)
        if shape.indexer_head_dim:
            split += (m.q_lora_rank or h) * shape.indexer_heads * shape.indexer_head_dim
            whole += h * shape.indexer_head_dim + h * shape.indexer_heads
    else:
        split, whole = 2 * h * shape.heads * shape.head_dim + 2 * h * shape.kv_heads * shape.head_dim, 0
    if moe:
        return LayerParams(
            split,
            whole,
            0,
            shape.experts * 3 * h * shape.expert_intermediate,
            3 * h * shape.shared_intermediate,
            h * shape.experts,
        )
    return LayerParams(split, whole, 3 * h * shape.intermediate, 0, 0, 0)


def total_params(shape: ModelShape, *, with_mtp: bool = False) -> int:
    """Every parameter of the checkpoint's language model (norms and biases left out:
    under 0.01% for the models here), to check against the publisher's count."""
    embed = shape.vocab * shape.hidden * (1 if shape.tied else 2)
    moe, dense = layer_params(shape, moe=True), layer_params(shape, moe=False)
    n_moe = shape.moe_layers
    n_dense = shape.layers - n_moe

    def total(params: LayerParams) -> int:
        return params.attn_split + params.attn_whole + params.dense_mlp + params.experts + params.shared + params.router

    out = embed + n_moe * total(moe) + n_dense * total(dense)
    if with_mtp and shape.mtp_layers:
        out += shape.mtp_layers * (total(moe if shape.experts else dense) + 2 * shape.hidden * shape.hidden)
    return out
