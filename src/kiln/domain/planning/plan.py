"""`kiln plan`: does a recipe fit the GPUs it is meant for, before anyone rents them?

Per GPU, as vLLM lays the model out (tensor, pipeline, data and expert parallelism):

  weights        parameters x bytes per parameter (the checkpoint's dtype and quantization:
                 bf16, FP8 with its block scales, MXFP4 experts), split the way vLLM
                 shards them: attention, dense MLPs and the vocabulary over tensor-parallel
                 ranks; routed experts over TP x DP ranks with expert parallelism, else
                 over TP; layers over pipeline stages. Plus the draft model or the MTP
                 layers speculative decoding loads.
  KV cache       bytes per token per layer (2 x KV heads per rank x head size x KV dtype;
                 for MLA the compressed latent + RoPE part, which every TP rank holds
                 whole; DeepSeek-V3.2's indexer keys on top) x layers on the GPU x tokens,
                 sliding-window layers capped at their window; at max-model-len for one
                 request (the least vLLM starts with) and at max-model-len x max-num-seqs
                 (every request at full length).
  engine reserve what vLLM holds besides weights and KV: the activation peak of its
                 profiling run (max-num-batched-tokens tokens, plus the sampler over
                 max-num-seqs rows), CUDA graphs and the CUDA/NCCL context. vLLM measures
                 these at start (gpu_worker.determine_available_memory); the plan
                 estimates them (ENGINE_RESERVE below says how).

and compares them with capacity x gpu-memory-utilization, the memory vLLM allows itself.
It does not fit when even one request at max-model-len cannot be cached next to the
weights and the reserve: vLLM refuses to start then ("... KV cache is needed, which is
larger than the available KV cache memory"). Every request at full length is the
stricter test (`strict`), reported either way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kiln.domain.planning.model_config import (
    DTYPE_BYTES,
    LayerParams,
    ModelShape,
    layer_params,
    total_params,
)
from kiln.domain.recipes.accelerators import GIB, Accelerator
from kiln.domain.recipes.topology import Topology

# -- vLLM's defaults (each read from the pinned engine's sources) -------------------------
# vllm/config/cache.py CacheConfig.gpu_memory_utilization: 0.92 in 0.32.0 and 0.33.0
_DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
# vllm/engine/arg_utils.py EngineArgs.get_batch_defaults (0.33.0), OpenAI API server:
# >= 160 GiB devices 16384 batched tokens / 1024 seqs; >= 70 GiB (not A100) 8192 / 1024;
# smaller 2048 / 256; CPU 2048 x world / 128 x world
_BATCH_DEFAULTS = ((160, 16384, 1024), (70, 8192, 1024), (0, 2048, 256))
_CPU_BLOCK = 128  # vllm/platforms/cpu.py: block_size 128 unless MLA or the user sets one
_GPU_BLOCK = 16  # vllm/config/cache.py: CUDA's default block size
# the engine reserve besides the profiled activations: CUDA graphs (vLLM has measured and
# logged "CUDA graph pool memory" since v0.21.0) and the CUDA context, cuBLAS workspaces
# and NCCL buffers outside torch's allocator: estimates, not measurements
_CUDA_GRAPHS_GIB = 1.5
_CUDA_CONTEXT_GIB = 1.0
_NCCL_GIB = 0.5  # with more than one rank
_MXFP4_BYTES = 4.25 / 8  # 4-bit values + one 8-bit scale per 32 (OCP MX spec)


# -- bytes per parameter -------------------------------------------------------------------
@dataclass(frozen=True)
class _Precision:
    linear: float  # attention and MLP projections
    experts: float
    embed: float  # embeddings, lm_head, router
    label: str


def _precision(shape: ModelShape, args: Mapping[str, Any]) -> _Precision:
    dtype = args.get("dtype")
    base = (
        float(DTYPE_BYTES.get(str(dtype), shape.dtype_bytes))
        if dtype not in (None, "auto")
        else float(shape.dtype_bytes)
    )
    quant = str(args.get("quantization") or shape.quant)
    name = {2: "bf16", 4: "fp32"}.get(int(base), f"{base:g} B")
    if quant == "fp8":
        b0, b1 = shape.fp8_block
        fp8 = 1 + 4 / (b0 * b1)  # e4m3 + one fp32 scale per block
        return _Precision(fp8, fp8, base, f"fp8 (block {b0}x{b1} scales), embeddings {name}")
    if quant == "mxfp4":
        return _Precision(base, _MXFP4_BYTES, base, f"mxfp4 experts, rest {name}")
    return _Precision(base, base, base, name)


# -- layout --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    """How a recipe spreads over GPUs: tensor, pipeline and data parallel sizes, and expert parallelism."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: bool = False

    @property
    def gpus(self) -> int:
        """The number of GPUs the layout takes."""
        return self.tp * self.pp * self.dp

    def label(self) -> str:
        """The layout as people write it: `TP4 x PP2, EP8`."""
        parts = [f"TP{self.tp}"] + ([f"PP{self.pp}"] if self.pp > 1 else []) + ([f"DP{self.dp}"] if self.dp > 1 else [])
        return " x ".join(parts) + (f", EP{self.tp * self.dp}" if self.ep else "")

    @classmethod
    def of(cls, topo: Topology) -> Layout:
        """The layout a recipe's topology section asks for."""
        return cls(tp=topo.tensor_parallel, pp=topo.pipeline_parallel, dp=topo.data_parallel, ep=topo.expert_parallel)

    def over(self, gpus: int) -> Layout:
        """This layout stretched or shrunk to `gpus` (`kiln plan --gpus N`): more
        data-parallel replicas of the same TP x PP group when N divides evenly, else one
        tensor-parallel group over all N (per pipeline stage)."""
        group = self.tp * self.pp
        if gpus % group == 0:
            return Layout(self.tp, self.pp, gpus // group, self.ep)
        if gpus % self.pp == 0:
            return Layout(gpus // self.pp, self.pp, 1, self.ep)
        return Layout(gpus, 1, 1, self.ep)


def _stage_layers(layers: int, pp: int) -> int:
    return math.ceil(layers / pp)


def _weight_bytes(shape: ModelShape, prec: _Precision, lay: Layout, *, mtp: bool = False) -> float:
    """Bytes of one model's weights on the busiest GPU."""
    moe, dense = layer_params(shape, moe=True), layer_params(shape, moe=False)
    expert_ranks = lay.tp * lay.dp if lay.ep else lay.tp

    def layer(params: LayerParams) -> float:
        return (
            prec.linear * (params.attn_split / lay.tp + params.attn_whole + (params.dense_mlp + params.shared) / lay.tp)
            + prec.experts * params.experts / expert_ranks
            + prec.embed * params.router
        )

    share = _stage_layers(shape.layers, lay.pp) / shape.layers
    body = share * (shape.moe_layers * layer(moe) + (shape.layers - shape.moe_layers) * layer(dense))
    vocab = shape.vocab * shape.hidden * prec.embed / lay.tp
    ends = vocab * (1 if shape.tied or lay.pp > 1 else 2)
    extra = 0.0
    if mtp and shape.mtp_layers:
        extra = shape.mtp_layers * (
            layer(moe if shape.experts else dense) + prec.linear * 2 * shape.hidden * shape.hidden / lay.tp
        )
    return body + ends + extra


def _kv_bytes_per_token(shape: ModelShape, lay: Layout, kv_dtype: str) -> tuple[float, float]:
    """(full-attention bytes, sliding-window bytes) per token for the layers of one GPU."""
    fp8 = kv_dtype.startswith("fp8")
    per_layer: float
    if shape.mla:
        latent = shape.mla.kv_lora_rank + shape.mla.qk_rope_head_dim
        if fp8 and shape.indexer_head_dim:
            # FlashMLA-sparse "fp8_ds_mla": 512 fp8 + 4 fp32 scales + 64 bf16 RoPE = 656 B
            # (vllm/v1/attention/backends/mla/flashmla_sparse.py, 0.33.0)
            per_layer = shape.mla.kv_lora_rank + 4 * (shape.mla.kv_lora_rank // 128) + 2 * shape.mla.qk_rope_head_dim
        else:
            per_layer = latent * (1 if fp8 else shape.dtype_bytes)
        if shape.indexer_head_dim:  # fp8 keys + one fp32 scale per 128 (models/deepseek_v32/attention.py)
            per_layer += shape.indexer_head_dim + 4 * (shape.indexer_head_dim // 128)
    else:
        per_rank = max(1, shape.kv_heads // lay.tp)
        per_layer = 2 * per_rank * shape.head_dim * (1 if fp8 else shape.dtype_bytes)
    share = _stage_layers(shape.layers, lay.pp) / shape.layers
    full_layers = (shape.layers - shape.sliding_layers) * share
    return per_layer * full_layers, per_layer * shape.sliding_layers * share


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _kv_bytes(
    shape: ModelShape,
    lay: Layout,
    kv_dtype: str,
    *,
    tokens: int,
    seqs: int,
    block: int,
    batched: int,
    extra_layers: int = 0,
) -> float:
    """KV bytes on one GPU for `seqs` requests of `tokens` each (whole blocks, as vLLM
    allocates them; a sliding-window layer keeps min(window - 1 + batched, tokens) per
    request: SlidingWindowSpec.max_memory_usage_bytes)."""
    full, sliding = _kv_bytes_per_token(shape, lay, kv_dtype)
    if extra_layers:  # MTP layers: full-attention layers of the same kind
        full += (
            full
            / max(1, (shape.layers - shape.sliding_layers) * _stage_layers(shape.layers, lay.pp) / shape.layers)
            * extra_layers
        )
    per_seq = full * _cdiv(tokens, block) * block
    if sliding:
        kept = min(shape.sliding_window - 1 + batched, tokens)
        per_seq += sliding * (_cdiv(kept, block) + 1) * block
    return per_seq * seqs


# -- the plan ------------------------------------------------------------------------------
@dataclass(frozen=True)
class _ModelPart:
    role: str  # target, draft, mtp
    shape: ModelShape
    params: int
    weights: float
    precision: str


@dataclass(frozen=True)
class _Reserve:
    activations: float
    sampler: float
    cuda_graphs: float
    context: float

    @property
    def total(self) -> float:
        return self.activations + self.sampler + self.cuda_graphs + self.context


@dataclass(frozen=True)
class Plan:
    """A recipe's memory plan: what weights, KV cache and vLLM's reserve take on each GPU, and whether it fits."""

    recipe: str
    accelerator: Accelerator | None  # None: a CPU recipe (KV space from VLLM_CPU_KVCACHE_SPACE)
    layout: Layout
    nodes: int
    utilization: float
    max_model_len: int
    max_num_seqs: int
    batched_tokens: int
    kv_dtype: str
    block: int
    parts: tuple[_ModelPart, ...]
    kv_one: float  # one request at max-model-len
    kv_full: float  # max-num-seqs requests at max-model-len
    kv_per_seq: float
    reserve: _Reserve
    cpu_kv_space: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def weights(self) -> float:
        """The weight bytes on one GPU, summed over the model's parts."""
        return sum(p.weights for p in self.parts)

    @property
    def capacity(self) -> float:
        """The memory of one GPU, or the CPU KV space of a CPU recipe."""
        return float(self.accelerator.memory_bytes) if self.accelerator else self.cpu_kv_space

    @property
    def usable(self) -> float:
        """The memory vLLM may use: the capacity times the utilization on a GPU."""
        return self.capacity * self.utilization if self.accelerator else self.cpu_kv_space

    @property
    def kv_room(self) -> float:
        """What vLLM can give the KV cache on the busiest GPU (or the CPU KV space)."""
        if self.accelerator is None:
            return self.cpu_kv_space
        return self.usable - self.weights - self.reserve.total

    @property
    def fits(self) -> bool:
        """Whether the KV room holds one sequence of max_model_len."""
        return self.kv_room >= self.kv_one

    @property
    def fits_full(self) -> bool:
        """Whether the KV room holds max_num_seqs sequences of max_model_len."""
        return self.kv_room >= self.kv_full

    @property
    def full_length_requests(self) -> int:
        """Requests at max-model-len the KV room holds at once (vLLM's 'Maximum
        concurrency' at start)."""
        return max(0, math.floor(self.kv_room / self.kv_per_seq)) if self.kv_per_seq else 0

    @property
    def kv_tokens(self) -> int:
        """vLLM's 'KV cache size: N tokens': whole blocks of the KV room, as requests at
        max-model-len (get_kv_cache_capacity: concurrency x max_model_len)."""
        if self.kv_per_seq <= 0 or self.kv_room <= 0:
            return 0
        per_block = self.kv_per_seq / _cdiv(self.max_model_len, self.block)
        blocks = math.floor(self.kv_room / per_block)
        return int(blocks / _cdiv(self.max_model_len, self.block) * self.max_model_len)


@dataclass(frozen=True)
class PlanInput:
    """What a plan is computed from: the recipe's launch args and the models' shapes."""

    recipe: str
    flavour: str
    engine_version: str
    args: dict[str, Any]
    env: dict[str, str]
    speculative: dict[str, Any] | None
    target: ModelShape
    draft: ModelShape | None
    topology: Topology | None
    notes: tuple[str, ...] = ()


def _arg(args: Mapping[str, Any], name: str) -> Any:
    return args.get(name, args.get(name.replace("-", "_")))


def _num(value: Any, default: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return float(value)


def _batch_defaults(acc: Accelerator | None, world: int) -> tuple[int, int]:
    """(max-num-batched-tokens, max-num-seqs) vLLM picks when the recipe sets neither."""
    if acc is None:
        return 2048 * world, 128 * world
    gib = acc.memory_bytes / GIB
    for floor_gib, tokens, seqs in _BATCH_DEFAULTS:
        if gib >= floor_gib and not (floor_gib == 70 and acc.name == "a100"):
            return tokens, seqs
    return 2048, 256


def compute(inp: PlanInput, acc: Accelerator | None, lay: Layout, *, nodes: int = 1) -> Plan:
    """The plan for `inp` on `lay.gpus` GPUs `acc` (None: CPU)."""
    args, t = inp.args, inp.target
    default_tokens, default_seqs = _batch_defaults(acc, lay.gpus)
    max_len = int(_num(_arg(args, "max-model-len"), t.max_position or 8192))
    seqs = int(_num(_arg(args, "max-num-seqs"), default_seqs))
    batched = int(_num(_arg(args, "max-num-batched-tokens"), max(default_tokens, max_len if acc is None else 0)))
    util = _num(_arg(args, "gpu-memory-utilization"), _DEFAULT_GPU_MEMORY_UTILIZATION)
    kv_dtype = str(_arg(args, "kv-cache-dtype") or "auto")
    block = int(_num(_arg(args, "block-size"), _CPU_BLOCK if acc is None else _GPU_BLOCK))
    notes: list[str] = list(inp.notes)
    prec = _precision(t, args)
    spec = inp.speculative or {}
    method = str(spec.get("method") or "")
    mtp = method in ("mtp", "deepseek_mtp") or method.endswith("_mtp")
    parts = [_ModelPart("target", t, total_params(t), _weight_bytes(t, prec, lay), prec.label)]
    if mtp:
        if not t.mtp_layers:
            notes.append("speculative method mtp, but the config has no num_nextn_predict_layers")
        mtp_bytes = _weight_bytes(t, prec, lay, mtp=True) - parts[0].weights
        parts.append(
            _ModelPart(
                "mtp",
                t,
                total_params(t, with_mtp=True) - parts[0].params,
                mtp_bytes,
                f"{t.mtp_layers} MTP layer(s), {prec.label}",
            )
        )
    draft_kv = 0.0
    if inp.draft is not None and method in ("draft_model", ""):
        d = inp.draft
        dlay = Layout(tp=int(_num(spec.get("draft_tensor_parallel_size"), lay.tp)), pp=1, dp=lay.dp)
        dprec = _precision(d, {})
        parts.append(_ModelPart("draft", d, total_params(d), _weight_bytes(d, dprec, dlay), dprec.label))
        draft_kv = _kv_bytes(d, dlay, kv_dtype, tokens=max_len, seqs=1, block=block, batched=batched)
    extra = t.mtp_layers if mtp else 0
    per_seq = (
        _kv_bytes(t, lay, kv_dtype, tokens=max_len, seqs=1, block=block, batched=batched, extra_layers=extra) + draft_kv
    )
    reserve = _reserve(t, lay, acc, args, batched=batched, seqs=seqs)
    cpu_space = 0.0
    if acc is None:  # VLLM_CPU_KVCACHE_SPACE GiB (vllm/platforms/cpu.py sets kv_cache_memory_bytes from it)
        space = inp.env.get("VLLM_CPU_KVCACHE_SPACE", "")
        if not space.isdigit() or int(space) == 0:
            notes.append(
                "VLLM_CPU_KVCACHE_SPACE is not set: vLLM sizes the CPU KV cache from host memory; "
                "the plan assumes 4 GiB"
            )
            space = "4"
        cpu_space = int(space) * GIB
    return Plan(
        recipe=inp.recipe,
        accelerator=acc,
        layout=lay,
        nodes=nodes,
        utilization=util,
        max_model_len=max_len,
        max_num_seqs=seqs,
        batched_tokens=batched,
        kv_dtype=kv_dtype,
        block=block,
        parts=tuple(parts),
        kv_one=per_seq,
        kv_full=per_seq * seqs,
        kv_per_seq=per_seq,
        reserve=reserve,
        cpu_kv_space=cpu_space,
        notes=tuple(notes),
    )


def _reserve(
    shape: ModelShape, lay: Layout, acc: Accelerator | None, args: Mapping[str, Any], *, batched: int, seqs: int
) -> _Reserve:
    """The estimate of what vLLM holds besides weights and KV (see the module docstring)."""
    if acc is None:
        return _Reserve(0.0, 0.0, 0.0, 0.0)  # the CPU KV cache is a fixed space of its own
    act_bytes = 2
    expert_tp = 1 if lay.ep else lay.tp
    moe_ws = batched * shape.top_k * (2 * shape.expert_intermediate / expert_tp + shape.hidden) * act_bytes
    dense_ws = batched * 2 * shape.intermediate / lay.tp * act_bytes
    activations = batched * shape.hidden * act_bytes * 6 + max(moe_ws, dense_ws)
    sampler = seqs * shape.vocab * 4 * 2  # fp32 logits and probabilities of the dummy sampler run
    eager = args.get("enforce-eager") is True
    graphs = 0.0 if eager else _CUDA_GRAPHS_GIB * GIB
    context = (_CUDA_CONTEXT_GIB + (_NCCL_GIB if lay.gpus > 1 else 0.0)) * GIB
    return _Reserve(activations, sampler, graphs, context)


def gib(num_bytes: float) -> str:
    """A byte count in GiB with one decimal."""
    return f"{num_bytes / GIB:,.1f} GiB"


def verdict(plan: Plan) -> str:
    """One line: fits or not, and why."""
    where = f"{plan.layout.gpus} x {plan.accelerator.name}" if plan.accelerator else "CPU"
    if not plan.fits:
        short = plan.kv_one - plan.kv_room
        return (
            f"{plan.recipe} does not fit {where} ({plan.layout.label()}): weights {gib(plan.weights)} + engine "
            f"reserve {gib(plan.reserve.total)} leave {gib(max(plan.kv_room, 0))} of {gib(plan.usable)} for the KV "
            f"cache, one request at max-model-len {plan.max_model_len:,} needs {gib(plan.kv_one)} "
            f"({gib(short)} short)"
        )
    return (
        f"{plan.recipe} fits {where} ({plan.layout.label()}): {plan.full_length_requests:,} requests at "
        f"max-model-len {plan.max_model_len:,} fit at once (max-num-seqs {plan.max_num_seqs:,})"
    )
