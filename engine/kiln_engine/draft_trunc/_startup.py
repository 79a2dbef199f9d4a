"""The start-up hooks: ``check_config`` (once per process, in the runner's
``__init__``: refuse what the marks cannot be trusted under, say how statistics
flush, register the counters) and ``refuse_runner`` (a runner without hooks).

Pure Python at import: vLLM is read by attribute, and imported only to ask for the
tensor-parallel rank.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from . import _state
from ._config_check import VllmConfig
from ._env import Knobs, env_name

if TYPE_CHECKING:
    from ._cost import MoELayer

logger = logging.getLogger("kiln_engine.draft_trunc")


def refuse_runner(name: str) -> None:
    """Refuse to start in a model runner that has no draft_trunc hooks."""
    if _state.current.enabled:
        raise RuntimeError(
            f"KILN_DRAFT_TRUNC=1 cannot run here: vLLM chose {name}, which has no "
            "draft-trunc hooks (only Model Runner V2 has them); set "
            "VLLM_USE_V2_MODEL_RUNNER=1, or drop what makes vLLM fall back, or turn "
            "draft-trunc off"
        )


def check_config(vllm_config: VllmConfig) -> None:
    """Refuse configurations where the marks cannot be trusted (RuntimeError).

    Called once per process at start (the runner's __init__, before the server
    answers). Turns draft_trunc off (with a warning) when adaptive verification is
    on and ``KILN_DRAFT_TRUNC_WITH_AV`` is not. Reads the server's default sampling
    parameters (``_tenant`` compares each request's with them). On the reporting rank it
    logs the knobs and the statistics interval, and registers the counters (at 0).
    """
    state = _state.current
    if not state.enabled:
        return
    from ._config_check import (
        adaptive_verification_on,
        problems,
        routed_top_k,
        sampling_defaults,
    )

    found = problems(vllm_config)
    if found:
        raise RuntimeError(f"KILN_DRAFT_TRUNC=1 cannot run here: {found[0]}")
    if state.knobs.av_calibrate and not adaptive_verification_on(vllm_config):
        raise RuntimeError(
            "KILN_DRAFT_TRUNC_AV_CALIBRATE=1 corrects adaptive verification's confidences, but "
            "speculative_config.enable_adaptive_verification is off: turn it on or unset "
            "KILN_DRAFT_TRUNC_AV_CALIBRATE"
        )
    if adaptive_verification_on(vllm_config) and not state.knobs.with_av:
        logger.warning(
            "draft_trunc: adaptive verification is on; draft truncation is off "
            "(set KILN_DRAFT_TRUNC_WITH_AV=1 to combine them)"
        )
        state.enabled = state.log = False
        return
    state.top_k = routed_top_k(vllm_config)
    state.sampling_defaults = sampling_defaults(vllm_config)
    state.lead = _is_lead_rank()
    layer = _priced_layer(state.knobs, vllm_config)
    if layer is not None:
        _state.set_moe_layer(layer)
    if state.lead:
        logger.info("draft_trunc on: %s", state.knobs)
        _start_statistics(state.knobs.log_interval)


def _start_statistics(interval: int) -> None:
    """Say how often statistics flush, and register their counters at 0, so that
    /metrics shows them from its first scrape rather than from the first flush."""
    name = env_name("log_interval")
    if interval <= 0:
        logger.info(
            "draft_trunc statistics: off (%s=0): no summary lines, no kiln_draft_trunc_* counters",
            name,
        )
        return
    from ._metrics import FeatureCounters, served_elsewhere_warning

    published = FeatureCounters.register() is not None
    logger.info(
        "draft_trunc statistics: every %d steps (%s=%d): a summary line and the kiln_draft_trunc_* counters%s",
        interval,
        name,
        interval,
        " (on /metrics from the start, at 0 until the first flush)"
        if published
        else " (not published: prometheus_client is not installed)",
    )
    warning = served_elsewhere_warning() if published else None
    if warning is not None:
        logger.warning(warning)


def _priced_layer(knobs: Knobs, vllm_config: VllmConfig) -> MoELayer | None:
    """The layer the cost policy prices: the knob's if set (a CPU twin priced as its
    GPU sibling, or a model whose config the check cannot read), else the model's."""
    if knobs.moe_layer is None:
        from ._config_check import moe_layer

        return moe_layer(vllm_config)
    from ._cost import MoELayer

    experts, top_k, expert_bytes = knobs.moe_layer
    return MoELayer(experts=experts, top_k=top_k, expert_bytes=expert_bytes)


def _is_lead_rank() -> bool:
    """Tensor-parallel rank 0 (of its data-parallel replica) reports for the server;
    the other TP ranks see the same batch. True where no TP group exists."""
    try:
        from vllm.distributed import parallel_state
    except ImportError:
        return True
    try:
        rank: int = parallel_state.get_tensor_model_parallel_rank()
    except (AssertionError, AttributeError, RuntimeError):  # group not initialized
        return True
    return rank == 0
