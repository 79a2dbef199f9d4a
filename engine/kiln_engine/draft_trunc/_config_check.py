"""Start-up checks: which vLLM configurations draft_trunc refuses, and why."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._cost import MoELayer

# vLLM's VllmConfig (and its parts), read by attribute only: vLLM is never imported here
# and its configs change between versions, so every read has a default.
VllmConfig = Any


def _get(obj: object, *path: str, default: Any = None) -> Any:
    for name in path:
        obj = getattr(obj, name, None)
        if obj is None:
            return default
    return obj


def problems(vllm_config: VllmConfig) -> list[str]:
    """One-line reasons this configuration is unsafe; empty when it is fine."""
    found = []
    if importlib.util.find_spec("triton") is None:
        found.append("triton is not installed (mark_dead is a Triton kernel)")
    parallel = _get(vllm_config, "parallel_config")
    if (_get(parallel, "pipeline_parallel_size", default=1) or 1) > 1:
        found.append(
            "pipeline parallelism keeps several microbatches in flight, "
            "so the dead-token marks would not match the batch being verified"
        )
    if (_get(parallel, "prefill_context_parallel_size", default=1) or 1) > 1:
        found.append("prefill context parallelism repartitions the batch and overwrites the marks")
    dp = _get(parallel, "data_parallel_size", default=1) or 1
    backend = _get(parallel, "all2all_backend", default="")
    if dp > 1 and backend in ("naive", "allgather_reducescatter"):
        found.append(
            f"all2all_backend={backend!r} with data parallelism gathers every rank's "
            "tokens, and this rank's padding mask no longer lines up with them"
        )
    if _get(parallel, "use_sequence_parallel_moe", default=False):
        found.append(
            "sequence-parallel MoE (data + tensor + expert parallelism) gives each TP rank "
            "a slice of the batch, but GLM-5's router reads the padding mask of the whole "
            "batch, so live tokens would skip their experts; use tensor_parallel_size=1 "
            "per DP rank or turn draft-trunc off"
        )
    spec = _get(vllm_config, "speculative_config")
    if _get(spec, "use_local_argmax_reduction", default=False):
        found.append(
            "speculative use_local_argmax_reduction never materializes the draft logits "
            "the acceptance estimator reads, and draft-trunc needs that estimator; turn "
            "one of them off"
        )
    # Rejection modes need no check: standard, block and vLLM 0.33.0's lossy `fly`
    # (which gates a deferred rejection on the proposed draft count) all equal the
    # truncated batch once dead drafts are masked invalid (tests/draft_trunc/test_exactness.py).
    if _get(vllm_config, "speculative_config", "method") == "extract_hidden_states":
        found.append("speculative method extract_hidden_states reads every token's hidden state")
    return found


def adaptive_verification_on(vllm_config: VllmConfig) -> bool:
    return bool(_get(vllm_config, "speculative_config", "enable_adaptive_verification"))


def sampling_defaults(vllm_config: VllmConfig) -> dict[str, Any]:
    """The sampling parameters the server gives every request that does not set them:
    the model's generation config with ``--override-generation-config`` on top (``{}``
    under ``--generation-config vllm``), the dict vLLM's OpenAI server applies
    (``ModelConfig.get_diff_sampling_param``); ``{}`` where the config has no such method."""
    read = _get(vllm_config, "model_config", "get_diff_sampling_param")
    return dict(read()) if callable(read) else {}


def _hf(vllm_config: VllmConfig) -> Any:
    return _get(vllm_config, "model_config", "hf_text_config") or _get(vllm_config, "model_config", "hf_config")


def _first_int(obj: object, names: Iterable[str]) -> int:
    for name in names:
        value = getattr(obj, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 0


def routed_top_k(vllm_config: VllmConfig) -> int:
    """Routed experts per token, for the 'expert slots saved' statistic."""
    return _first_int(_hf(vllm_config), ("num_experts_per_tok", "moe_topk", "num_experts_per_token"))


def moe_layer(vllm_config: VllmConfig) -> MoELayer | None:
    """The routed-expert shape the cost-aware policy prices, or None if unknown.

    With expert parallelism a rank streams only its 1/ep share of the touched
    experts; that is priced as a 1/ep share of every expert's bytes.
    """
    from ._cost import MoELayer

    hf = _hf(vllm_config)
    experts = _first_int(hf, ("n_routed_experts", "num_experts", "num_local_experts"))
    top_k = routed_top_k(vllm_config)
    hidden = _first_int(hf, ("hidden_size",))
    inter = _first_int(hf, ("moe_intermediate_size", "intermediate_size"))
    if not (experts and top_k and hidden and inter) or top_k > experts:
        return None
    dtype = _get(vllm_config, "model_config", "dtype")
    itemsize = getattr(dtype, "itemsize", 2) or 2
    quant = _get(vllm_config, "model_config", "quantization") or ""
    if "fp8" in str(quant):
        itemsize = 1
    ep = 1
    parallel = _get(vllm_config, "parallel_config")
    if _get(parallel, "enable_expert_parallel", default=False):
        ep = (_get(parallel, "tensor_parallel_size", default=1) or 1) * (
            _get(parallel, "data_parallel_size", default=1) or 1
        )
    expert_bytes = 3.0 * hidden * inter * itemsize / max(ep, 1)
    return MoELayer(experts=experts, top_k=top_k, expert_bytes=expert_bytes)
