"""draft_trunc: verify only the drafts worth verifying, without changing shapes.

Exposed to vLLM 0.32.0 as ``vllm.v1.worker.gpu.spec_decode.draft_trunc`` (the
kiln plugin registers it in ``sys.modules``). Each verifying request's query is
``[t0, d1..dn]``; draft_trunc keeps the first ``j`` drafts and marks the tail as
MoE padding, so routed experts skip it while token counts, CUDA-graph shapes and
DP sync stay as they are. Exactness comes from the rejection sampler's
``invalid_drafts``: drafts past ``j`` are never accepted, so the output is the
output of a batch truly truncated to ``j`` drafts.

Before a request's first step, ``note_request`` (the runner's ``add_requests``) flags
it when its sampling settings act on the target only; ``graded`` keeps its drafts out
of the calibration (``_tenant``).

Lifecycle of one step, as the runner patches call it:
1. ``mark_dead`` (``prepare_inputs``): one kernel chooses ``tau`` (cost-aware
   policy, the default) and writes the dead marks and ``j``.
2. ``verify_mask`` (before rejection sampling; on 0.34.0 ``verify_drafts`` inside the
   rejection sampler): rows past ``j`` become invalid.
3. ``graded`` (before ``observe_verification``): censored rejection counts;
   with the cost-aware policy it also grades the verified drafts into the
   policy's calibration of the estimator (on the device, no host sync).
4. ``log_step`` (if ``LOG``): device-side statistics, and the acceptance trace
   (``KILN_DRAFT_TRUNC_TRACE``).
5. ``av_confidences`` (before adaptive verification records this step's
   confidences, with ``KILN_DRAFT_TRUNC_AV_CALIBRATE``): the survivals it sizes its
   budget from, corrected by the cost policy's calibration.
6. ``begin_drafting`` / ``stop_drafting`` (the draft_model drafter's propose and
   its loop over positions): stop where vLLM's dynamic schedule stops verifying,
   and with ``KILN_DRAFT_TRUNC_DEPTH`` where one more position does not pay;
   the positions not drafted are dead in the next ``mark_dead``.

State: one ``State`` object per process (``_state.current``), read by the hooks
through ``ENABLED``, ``LOG`` and ``KNOBS``; tests and benchmarks read it through
``snapshot()``, never by reaching inside.

This module is the public surface (what the patched runner and users import); the
parts live in private modules: ``_state`` (the state, ``snapshot``/``reload``, the
buffers ``prepare`` allocates), ``_startup`` (``check_config``, ``refuse_runner``),
``_verify`` (``mark_dead``, ``zero_dead_rows``, ``verify_mask``, ``graded``),
``_drafting`` (``begin_drafting``, ``stop_drafting``, ``draft_time``), ``_av``
(``av_confidences``), ``_tenant`` (``note_request``, ``target_only_settings``), ``_reporting``
(``log_step``, the trace); below them ``_env`` (the knobs), ``_config_check``,
``_cost`` (the cost model), ``_stats``/``_metrics`` (statistics and counters;
``_host_copy``, the flush ``_stats`` and ``_av_stats`` share) and what runs on the
device, in ``_kernels``: the kernels and their launchers, their Triton building blocks,
their buffers and Triton's decorator, typed.

Importing this module is cheap and imports neither vLLM nor torch; with
``KILN_DRAFT_TRUNC`` unset every entry point returns at once.
"""

from __future__ import annotations

from . import _state
from ._av import av_confidences
from ._drafting import begin_drafting, stop_drafting
from ._drafting import draft_time as draft_time
from ._env import Knobs
from ._reporting import log_step, poll_summary
from ._startup import check_config, refuse_runner
from ._state import Snapshot, prepare, reload, set_moe_layer, snapshot
from ._tenant import note_request, target_only_settings
from ._verify import (
    graded,
    mark_dead,
    mask_from_live,
    policy_tau,
    verify_drafts,
    verify_mask,
    zero_dead_rows,
)

__all__ = [
    "ENABLED",
    "KNOBS",
    "LOG",
    "Snapshot",
    "av_confidences",
    "begin_drafting",
    "check_config",
    "graded",
    "log_step",
    "mark_dead",
    "mask_from_live",
    "note_request",
    "policy_tau",
    "poll_summary",
    "prepare",
    "refuse_runner",
    "reload",
    "set_moe_layer",
    "snapshot",
    "stop_drafting",
    "target_only_settings",
    "verify_drafts",
    "verify_mask",
    "zero_dead_rows",
]


def __getattr__(name: str) -> bool | Knobs:
    """The hook API's switches, read from the state: ``ENABLED`` (draft_trunc is on in
    this process), ``LOG`` (``log_step`` has work), ``KNOBS`` (the parsed knobs).
    The patched runner tests them every step: one function call each."""
    if name == "ENABLED":
        return _state.current.enabled
    if name == "LOG":
        return _state.current.log
    if name == "KNOBS":
        return _state.current.knobs
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
