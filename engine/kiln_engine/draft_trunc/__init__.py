"""draft_trunc: verify only the drafts worth verifying, without changing shapes.

Exposed to vLLM 0.32.0 as ``vllm.v1.worker.gpu.spec_decode.draft_trunc`` (the
kiln plugin registers it in ``sys.modules``). Each verifying request's query is
``[t0, d1..dn]``; draft_trunc keeps the first ``j`` drafts and marks the tail as
MoE padding, so routed experts skip it while token counts, CUDA-graph shapes and
DP sync stay as they are. Exactness comes from the rejection sampler's
``invalid_drafts``: drafts past ``j`` are never accepted, so the output is the
output of a batch truly truncated to ``j`` drafts.

Lifecycle of one step, as the runner patches call it:
1. ``mark_dead`` (``prepare_inputs``): one kernel chooses ``tau`` (cost-aware
   policy, the default) and writes the dead marks and ``j``.
2. ``verify_mask`` (before rejection sampling): rows past ``j`` become invalid.
3. ``graded`` (before ``observe_verification``): censored rejection counts;
   with the cost-aware policy it also grades the verified drafts into the
   policy's calibration of the estimator (on the device, no host sync).
4. ``log_step`` (if ``LOG``): device-side statistics, and the acceptance trace
   (``KILN_DRAFT_TRUNC_TRACE``).

Importing this module is cheap and imports neither vLLM nor torch; with
``KILN_DRAFT_TRUNC`` unset every entry point returns at once.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

from ._env import Knobs, read_knobs

logger = logging.getLogger("kiln_engine.draft_trunc")



def _wants_log_step(knobs: Knobs) -> bool:
    return knobs.enabled and (knobs.log_interval > 0 or bool(knobs.trace))


KNOBS: Knobs = read_knobs()
ENABLED: bool = KNOBS.enabled
LOG: bool = _wants_log_step(KNOBS)

# Per-process state: buffers are allocated once and reused, so that the kernel
# itself never allocates. ``active`` says whether this step's marks were written.
# ``lead``: this process reports (logs, counters, trace); False on tensor-parallel
# ranks other than 0, which see the same batch and would only repeat rank 0.
# ``layer`` is the MoE shape the cost model prices (set from the model config at
# start, or by ``set_moe_layer``); ``cost`` the device inputs built from it.
# ``calibration``: the cost policy's online calibration of the estimator (kept
# across steps); ``calibrating``: this step's marks filed cells to grade.
_STATE = SimpleNamespace(
    live=None, expected=None, step=None, tau=None, cost=None, layer=None, stats=None,
    active=False, top_k=0, lead=True, trace=None, trace_p=None, trace_steps=0,
    calibration=None, calibrating=False,
)

__all__ = [
    "ENABLED",
    "KNOBS",
    "LOG",
    "check_config",
    "graded",
    "log_step",
    "mark_dead",
    "policy_tau",
    "prepare",
    "refuse_runner",
    "reload",
    "set_moe_layer",
    "verify_mask",
    "zero_dead_rows",
]


def reload(env: dict[str, str] | None = None) -> Knobs:
    """Re-read the knobs (tests, or a process that sets them after import)."""
    global KNOBS, ENABLED, LOG
    KNOBS = read_knobs(env)
    ENABLED = KNOBS.enabled
    LOG = _wants_log_step(KNOBS)
    _STATE.live = _STATE.expected = _STATE.step = _STATE.tau = _STATE.stats = None
    _STATE.cost = _STATE.calibration = None
    _STATE.active = _STATE.calibrating = False
    _STATE.lead = True
    _close_trace()
    return KNOBS


def set_moe_layer(layer) -> None:
    """The MoE layer shape (a ``_cost.MoELayer``) the cost-aware policy prices."""
    _STATE.layer = layer
    _STATE.cost = None


def prepare(max_num_reqs: int, device: Any, max_num_tokens: int = 0, num_spec: int = 0) -> None:
    """Allocate the per-slot buffers (and the cost table for ``max_num_tokens``,
    and the calibration for ``num_spec`` drafts) up front, else the first
    mark_dead does."""
    import torch

    # Normalise "cuda" to "cuda:N" so an unchanged device never reallocates
    # (which would also reset the step counter).
    device = torch.empty(0, device=device).device
    live = _STATE.live
    if live is None or live.shape[0] < max_num_reqs or live.device != device:
        _STATE.live = torch.zeros(max_num_reqs, dtype=torch.int32, device=device)
        _STATE.expected = torch.zeros(max_num_reqs, dtype=torch.float32, device=device)
        _STATE.step = torch.zeros(1, dtype=torch.int64, device=device)
        _STATE.tau = torch.zeros(1, dtype=torch.float32, device=device)
        _STATE.stats = None
    if KNOBS.policy == "cost":
        _prepare_cost(max_num_tokens, device)
        if num_spec > 0:
            _prepare_calibration(max_num_reqs, num_spec, device)


def _prepare_calibration(max_num_reqs: int, num_spec: int, device) -> None:
    from ._cost import TAU_GRID
    from ._kernel import Calibration

    cal = _STATE.calibration
    same_shape = cal is not None and cal.hits.shape[0] == num_spec * TAU_GRID + 1
    if same_shape and cal.bins.shape[0] >= max_num_reqs and cal.bins.device == device:
        return
    fresh = Calibration.allocate(max_num_reqs, num_spec, device)
    if same_shape and cal.hits.device == device:
        # more slots: keep what was learnt
        fresh = fresh._replace(hits=cal.hits, counts=cal.counts)
    _STATE.calibration = fresh


def _prepare_cost(max_num_tokens: int, device) -> None:
    import torch

    from ._cost import H200_FIT, MoELayer, live_table, other_ratio
    from ._kernel import CostInputs

    cost = _STATE.cost
    if cost is not None and cost.table.shape[0] > max_num_tokens and cost.table.device == device:
        return
    layer = _STATE.layer or MoELayer()
    # Room for a few thousand tokens at once, so that growing batches rarely
    # rebuild the table (a rebuild allocates, which a graph capture must not).
    size = max(max_num_tokens, 8192)
    table = torch.tensor(live_table(layer, H200_FIT, size), dtype=torch.float32, device=device)
    _STATE.cost = CostInputs(
        table, H200_FIT.t_fixed, H200_FIT.t_token, other_ratio(KNOBS.other_share)
    )


def policy_tau():
    """The device scalar holding the tau the last ``mark_dead`` used (or None)."""
    return _STATE.tau if _STATE.active else None


def mark_dead(
    is_padding,
    query_start_loc,
    cu_num_logits,
    num_reqs: int,
    num_speculative_steps: int,
    predictions,
    idx_mapping,
    *,
    seq_lens,
    prefill_len,
    num_draft_tokens: int | None = None,
    refits: int | None = None,
) -> bool:
    """Mark the dead draft tail of every verifying request as MoE padding.

    ``is_padding`` is the persistent buffer the model reads (written in place);
    ``predictions`` the estimator's ``[max_num_reqs, K]`` conditional acceptance
    probabilities by slot, or None. ``refits`` is the estimator's host-side refit
    count (None: treat as warmed up). Returns whether a kernel was launched;
    with no predictions, no drafts, before warm-up or when disabled it launches
    nothing and ``verify_mask``/``graded`` stay no-ops for this step.
    """
    _STATE.active = False
    if not ENABLED or predictions is None or num_reqs <= 0:
        return False
    if num_draft_tokens is not None and num_draft_tokens <= 0:
        return False
    if refits is not None and refits < KNOBS.warmup:
        return False
    assert predictions.shape[1] == num_speculative_steps, (
        f"predictions hold {predictions.shape[1]} steps, drafts {num_speculative_steps}"
    )
    prepare(predictions.shape[0], predictions.device, is_padding.shape[0], num_speculative_steps)
    from ._kernel import MAX_COST_REQS, launch_mark_dead

    cost = _STATE.cost if KNOBS.policy == "cost" else None

    launch_mark_dead(
        is_padding,
        query_start_loc,
        cu_num_logits,
        idx_mapping,
        seq_lens,
        prefill_len,
        predictions,
        _STATE.live,
        _STATE.expected,
        _STATE.step,
        _STATE.tau,
        num_reqs,
        KNOBS.tau,
        KNOBS.min_keep,
        KNOBS.explore,
        cost=cost,
        calibration=_STATE.calibration,
    )
    _STATE.active = True
    _STATE.calibrating = cost is not None and num_reqs <= MAX_COST_REQS
    if KNOBS.trace and _STATE.lead:
        # the predictions this step's marks were made from: by the time the outcome
        # is known, the speculator may have written the next step's into the buffer
        slots = idx_mapping[:num_reqs].long().clamp(min=0)
        _STATE.trace_p = predictions.index_select(0, slots).clone()
    return True


def verify_mask(input_batch, invalid_drafts=None):
    """``invalid_drafts`` for the rejection sampler, widened by this step's marks.

    Row ``c0 + i`` of a request carries draft ``d_i``; drafts past the kept
    count ``j`` become -1 in the verification copy and are never accepted, so
    the garbage logits of dead rows are never read.
    """
    if not _STATE.active:
        return invalid_drafts
    return mask_from_live(
        _STATE.live,
        input_batch.expanded_idx_mapping,
        input_batch.expanded_local_pos,
        invalid_drafts,
    )


def mask_from_live(live, expanded_idx_mapping, expanded_local_pos, invalid_drafts=None):
    # Cudagraph-padded rows may carry slot -1: clamp them to a real slot; the
    # sampler never reads those rows anyway.
    kept = live.index_select(0, expanded_idx_mapping.clamp(min=0).long())
    mask = expanded_local_pos > kept
    return mask if invalid_drafts is None else (mask | invalid_drafts)


def graded(num_rejected, cu_num_logits, idx_mapping):
    """Rejection counts to grade the acceptance estimator with.

    A truncated window that accepted all ``j`` kept drafts would otherwise be
    graded as rejecting ``d_{j+1}``, which was never verified; subtracting the
    ``n - j`` dead drafts labels only verified drafts, so truncation does not
    bias the estimator. Returns ``num_rejected`` itself when nothing was marked.
    """
    if not _STATE.active:
        return num_rejected
    num_reqs = idx_mapping.shape[0]
    cu = cu_num_logits[: num_reqs + 1]
    n = (cu[1:] - cu[:-1] - 1).clamp(min=0)
    # Masked entries carry slot -1 and keep their count.
    slots = idx_mapping.long()
    j = _STATE.live.index_select(0, slots.clamp(min=0))
    dead = (n - j) * (slots >= 0)
    censored = (num_rejected[:num_reqs] - dead).clamp(min=0)
    if _STATE.calibrating:
        _calibrate(slots, j, j - censored)
    return censored.to(num_rejected.dtype)


def _calibrate(slots, kept, accepted) -> None:
    """File each verified draft's outcome under the cell its marks were made in.

    Only verified drafts are graded (k < kept), and only those of pure verify
    queries (the kernel filed -1 for the rest). Every count added
    is 1.0, so the totals are exact and identical on every rank whatever the
    order of the atomic adds; past ``CAL_CAP`` a cell's counts are halved so
    that old grades fade. Graph-safe, no host sync.
    """
    import torch

    from ._cost import CAL_CAP, TAU_GRID
    from ._kernel import BIN_BITS, CAL_DEPTH

    cal = _STATE.calibration
    sink = cal.hits.shape[0] - 1
    depth = min(sink // TAU_GRID, CAL_DEPTH.value)
    pos = torch.arange(depth, device=cal.bins.device)
    packed = cal.bins.index_select(0, slots.clamp(min=0))
    bins = (packed[:, None] >> (BIN_BITS.value * pos)) & (TAU_GRID - 1)
    filed = (slots >= 0) & (packed >= 0)
    verified = (pos < kept[:, None]) & filed[:, None]
    survived = verified & (pos < accepted[:, None])
    cells = torch.where(verified, pos * TAU_GRID + bins, sink).flatten()
    cal.counts.index_add_(0, cells, verified.flatten().to(cal.counts.dtype))
    cal.hits.index_add_(0, cells, survived.flatten().to(cal.hits.dtype))
    fade = torch.where(cal.counts > CAL_CAP, 0.5, 1.0)
    cal.counts.mul_(fade)
    cal.hits.mul_(fade)


def log_step(cu_num_logits, num_sampled, idx_mapping, num_tokens: int):
    """Fold this step into the device-side statistics (no host sync).

    Every ``KILN_DRAFT_TRUNC_LOG_INTERVAL`` steps the totals are logged and
    published as ``kiln_draft_trunc_*`` Prometheus counters once their copy has
    landed. Returns the last finished summary, if one finished now. With
    ``KILN_DRAFT_TRUNC_TRACE`` set it also appends this step to the trace (that
    part does sync the host: it is a measurement mode).
    """
    if not (LOG and _STATE.active and _STATE.lead):
        return None
    if KNOBS.trace and _STATE.trace_p is not None:
        _write_trace(cu_num_logits, num_sampled, idx_mapping)
    if KNOBS.log_interval <= 0:
        return None
    from ._stats import StepStats

    if _STATE.stats is None:
        _STATE.stats = StepStats(_STATE.live.device, KNOBS.log_interval, _STATE.top_k)
    stats = _STATE.stats
    before = stats.last
    stats.add(cu_num_logits, num_sampled, idx_mapping, num_tokens, _STATE.live, _STATE.expected)
    return stats.last if stats.last is not before else None


def _write_trace(cu_num_logits, num_sampled, idx_mapping) -> None:
    """One JSON line per verify step: {"step", "k", "reqs": [{"p", "kept", "accepted",
    "n"}]}; p_i is the estimator's conditional acceptance probability of draft i
    (null where it had none), kept the drafts verified, accepted those accepted."""
    import json

    from ._stats import step_outcomes

    if _STATE.trace is None:
        _STATE.trace = open(KNOBS.trace, "a", buffering=1)  # noqa: SIM115 (kept open)
        _STATE.trace_steps = 0
    p = _STATE.trace_p
    _STATE.trace_p = None
    rows = step_outcomes(cu_num_logits, num_sampled, idx_mapping, _STATE.live)
    reqs = []
    for (n, kept, accepted), probs in zip(rows, p.tolist(), strict=True):
        if n <= 0:  # prefill or no drafts: nothing was verified
            continue
        probs = [None if x != x else round(x, 6) for x in probs]  # NaN: no prediction
        reqs.append({"p": probs, "kept": kept, "accepted": accepted, "n": n})
    if reqs:
        _STATE.trace.write(json.dumps({"step": _STATE.trace_steps, "k": p.shape[1], "reqs": reqs}) + "\n")
        _STATE.trace_steps += 1


def _close_trace() -> None:
    if _STATE.trace is not None:
        _STATE.trace.close()
    _STATE.trace = _STATE.trace_p = None


def zero_dead_rows(routed, is_padding):
    """The routed-expert output with the rows marked padding set to 0, in place.

    The experts never write the rows the router skipped, so those rows hold
    whatever the buffer held, NaN or Inf included. Dead draft rows keep their KV
    slots, and attention masks their scores but still multiplies their values
    (0 * NaN = NaN), so a non-finite dead row would poison live rows of its
    request. ``masked_fill_`` is graph-safe and allocates nothing. Anything but
    a plain tensor (a deferred MoE output) is returned as it is.
    """
    if not ENABLED or is_padding is None or not hasattr(routed, "masked_fill_"):
        return routed
    rows = routed.shape[0]
    mask = is_padding[:rows].view(rows, *([1] * (routed.dim() - 1)))
    return routed.masked_fill_(mask, 0)


def refuse_runner(name: str) -> None:
    """Refuse to start in a model runner that has no draft_trunc hooks."""
    if ENABLED:
        raise RuntimeError(
            f"KILN_DRAFT_TRUNC=1 cannot run here: vLLM chose {name}, which has no "
            "draft-trunc hooks (only Model Runner V2 has them); set "
            "VLLM_USE_V2_MODEL_RUNNER=1, or drop what makes vLLM fall back, or turn "
            "draft-trunc off"
        )


def check_config(vllm_config) -> None:
    """Refuse configurations where the marks cannot be trusted (RuntimeError).

    Called once per process at start. Turns draft_trunc off (with a warning)
    when adaptive verification is on and ``KILN_DRAFT_TRUNC_WITH_AV`` is not.
    """
    global ENABLED, LOG
    if not ENABLED:
        return
    from ._config_check import adaptive_verification_on, problems, routed_top_k

    found = problems(vllm_config)
    if found:
        raise RuntimeError(f"KILN_DRAFT_TRUNC=1 cannot run here: {found[0]}")
    if adaptive_verification_on(vllm_config) and not KNOBS.with_av:
        logger.warning(
            "draft_trunc: adaptive verification is on; draft truncation is off "
            "(set KILN_DRAFT_TRUNC_WITH_AV=1 to combine them)"
        )
        ENABLED = LOG = False
        return
    _STATE.top_k = routed_top_k(vllm_config)
    _STATE.lead = _is_lead_rank()
    layer = _priced_layer(vllm_config)
    if layer is not None:
        set_moe_layer(layer)
    if _STATE.lead:
        logger.info("draft_trunc on: %s", KNOBS)


def _priced_layer(vllm_config):
    """The layer the cost policy prices: the knob's if set (a CPU twin priced as its
    GPU sibling, or a model whose config the check cannot read), else the model's."""
    if KNOBS.moe_layer is None:
        from ._config_check import moe_layer

        return moe_layer(vllm_config)
    from ._cost import MoELayer

    experts, top_k, expert_bytes = KNOBS.moe_layer
    return MoELayer(experts=experts, top_k=top_k, expert_bytes=expert_bytes)


def _is_lead_rank() -> bool:
    """Tensor-parallel rank 0 (of its data-parallel replica) reports for the server;
    the other TP ranks see the same batch. True where no TP group exists."""
    try:
        from vllm.distributed import parallel_state
    except ImportError:
        return True
    try:
        return parallel_state.get_tensor_model_parallel_rank() == 0
    except (AssertionError, AttributeError, RuntimeError):  # group not initialized
        return True
