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
5. ``begin_drafting`` / ``stop_drafting`` (the draft_model drafter's propose and
   its loop over positions): stop where vLLM's dynamic schedule stops verifying,
   and with ``KILN_DRAFT_TRUNC_DEPTH`` where one more position does not pay
   (issue 37); the positions not drafted are dead in the next ``mark_dead``.

State: one ``State`` object per process (``_state``), read by the hooks through
``ENABLED``, ``LOG`` and ``KNOBS``; tests and benchmarks read it through
``snapshot()``, never by reaching inside.

Importing this module is cheap and imports neither vLLM nor torch; with
``KILN_DRAFT_TRUNC`` unset every entry point returns at once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Protocol

from ._config_check import VllmConfig
from ._env import Knobs, env_name, read_knobs

if TYPE_CHECKING:  # torch and triton load only when a kernel runs
    import torch

    from ._cost import DraftCost, MoELayer
    from ._kernel import Buffers, Calibration, CostInputs
    from ._stats import StepStats, Summary

logger = logging.getLogger("kiln_engine.draft_trunc")



def _wants_log_step(knobs: Knobs) -> bool:
    return knobs.enabled and (knobs.log_interval > 0 or bool(knobs.trace))


@dataclass
class TraceWriter:
    """``KILN_DRAFT_TRUNC_TRACE``: the file (opened at the first record), and the
    predictions of the step in flight, kept from the moment its marks were made:
    by the time the outcome is known, the speculator may have written the next
    step's predictions into its buffer."""

    path: str
    file: IO[str] | None = None
    pending: torch.Tensor | None = None
    steps: int = 0

    def write(self, record: dict[str, Any]) -> None:
        if self.file is None:
            self.file = open(self.path, "a", buffering=1)  # noqa: SIM115 (kept open across steps)
        self.file.write(json.dumps(record) + "\n")
        self.steps += 1

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        self.file = self.pending = None


@dataclass
class State:
    """Everything draft_trunc keeps in one process.

    knobs: as read from the environment; ``enabled`` and ``log`` start from them
        and are what the hooks test (``check_config`` may turn both off).
    lead: this process reports (logs, counters, trace); False on tensor-parallel
        ranks other than 0, which see the same batch and would only repeat rank 0.
    top_k, layer: from the model config at start (``check_config``, or
        ``set_moe_layer`` for the layer): routed experts per token, and the MoE
        shape the cost model prices. They outlive ``reload``.
    buffers, cost, calibration: device buffers allocated once and reused, so that
        the kernel itself never allocates (``prepare``); the calibration of the
        estimator is kept across steps.
    stats, trace: the statistics accumulator and the acceptance trace.
    active: this step's marks were written; calibrating: and they filed cells
        for ``graded`` to grade.
    """

    knobs: Knobs
    enabled: bool
    log: bool
    lead: bool = True
    top_k: int = 0
    layer: MoELayer | None = None
    buffers: Buffers | None = None
    cost: CostInputs | None = None
    calibration: Calibration | None = None
    stats: StepStats | None = None
    trace: TraceWriter | None = None
    active: bool = False
    calibrating: bool = False
    # host copy of the cost table (pricing drafting needs the full step's time)
    cost_host: list[float] | None = None
    # the drafting in flight (begin_drafting): drafts scheduled for verification,
    # positions made so far (what the next mark_dead prices), the depth decision's
    # device flag
    scheduled: int | None = None
    drafted: int | None = None
    go: torch.Tensor | None = None

    @classmethod
    def start(cls, knobs: Knobs, top_k: int = 0, layer: MoELayer | None = None) -> State:
        return cls(knobs, knobs.enabled, _wants_log_step(knobs), top_k=top_k, layer=layer)


@dataclass(frozen=True)
class Snapshot:
    """A read-only view of the state at one moment, for tests and benchmarks.

    The tensors are draft_trunc's own persistent buffers, not copies (a copy would
    cost a device round trip and would not be what a captured graph writes): read
    them, and ``clone()`` what must outlive the next step.
    """

    knobs: Knobs
    enabled: bool
    log: bool
    lead: bool
    top_k: int
    layer: MoELayer | None
    buffers: Buffers | None
    cost: CostInputs | None
    calibration: Calibration | None
    active: bool
    calibrating: bool
    last_summary: Summary | None  # the last statistics flush reported
    trace_steps: int  # steps written to the trace


_state = State.start(read_knobs())

__all__ = [
    "ENABLED",
    "KNOBS",
    "LOG",
    "Snapshot",
    "begin_drafting",
    "check_config",
    "graded",
    "log_step",
    "mark_dead",
    "mask_from_live",
    "policy_tau",
    "poll_summary",
    "prepare",
    "refuse_runner",
    "reload",
    "set_moe_layer",
    "snapshot",
    "stop_drafting",
    "verify_mask",
    "zero_dead_rows",
]


def __getattr__(name: str) -> bool | Knobs:
    """The hook API's switches, read from the state: ``ENABLED`` (draft_trunc is on in
    this process), ``LOG`` (``log_step`` has work), ``KNOBS`` (the parsed knobs).
    The patched runner tests them every step: one function call each."""
    if name == "ENABLED":
        return _state.enabled
    if name == "LOG":
        return _state.log
    if name == "KNOBS":
        return _state.knobs
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def snapshot() -> Snapshot:
    """The state as it is now (see ``Snapshot``)."""
    s = _state
    return Snapshot(
        knobs=s.knobs,
        enabled=s.enabled,
        log=s.log,
        lead=s.lead,
        top_k=s.top_k,
        layer=s.layer,
        buffers=s.buffers,
        cost=s.cost,
        calibration=s.calibration,
        active=s.active,
        calibrating=s.calibrating,
        last_summary=None if s.stats is None else s.stats.last,
        trace_steps=0 if s.trace is None else s.trace.steps,
    )


def reload(env: Mapping[str, str] | None = None) -> Knobs:
    """Re-read the knobs (tests, or a process that sets them after import): a fresh
    state, keeping only what the model config said (``top_k``, ``layer``)."""
    global _state
    old = _state
    if old.trace is not None:
        old.trace.close()
    _state = State.start(read_knobs(env), top_k=old.top_k, layer=old.layer)
    return _state.knobs


def set_moe_layer(layer: MoELayer | None) -> None:
    """The MoE layer shape the cost-aware policy prices (None: the default)."""
    _state.layer = layer
    _state.cost = None


def prepare(
    max_num_reqs: int, device: torch.device | str, max_num_tokens: int = 0, num_spec: int = 0
) -> None:
    """Allocate the per-slot buffers (and the cost table for ``max_num_tokens``,
    and the calibration for ``num_spec`` drafts) up front, else the first
    mark_dead does."""
    import torch

    from ._kernel import Buffers

    # Normalise "cuda" to "cuda:N" so an unchanged device never reallocates
    # (which would also reset the step counter).
    where = torch.empty(0, device=device).device
    state = _state
    buffers = state.buffers
    if buffers is None or buffers.live.shape[0] < max_num_reqs or buffers.live.device != where:
        state.buffers = Buffers.allocate(max_num_reqs, where)
        state.stats = None
    if state.knobs.policy == "cost":
        _prepare_cost(state, max_num_tokens, where)
        if num_spec > 0:
            _prepare_calibration(state, max_num_reqs, num_spec, where)


def _prepare_calibration(state: State, max_num_reqs: int, num_spec: int, device: torch.device) -> None:
    from ._cost import TAU_GRID
    from ._kernel import Calibration

    cal = state.calibration
    same_shape = cal is not None and cal.hits.shape[0] == num_spec * TAU_GRID + 1
    if cal is not None and same_shape and cal.bins.shape[0] >= max_num_reqs and cal.bins.device == device:
        return
    fresh = Calibration.allocate(max_num_reqs, num_spec, device)
    if cal is not None and same_shape and cal.hits.device == device:
        # more slots: keep what was learnt
        fresh = fresh._replace(hits=cal.hits, counts=cal.counts)
    state.calibration = fresh


def _prepare_cost(state: State, max_num_tokens: int, device: torch.device) -> None:
    import torch

    from ._cost import H200_FIT, MoELayer, live_table, other_ratio
    from ._kernel import CostInputs

    cost = state.cost
    if cost is not None and cost.table.shape[0] > max_num_tokens and cost.table.device == device:
        return
    layer = state.layer or MoELayer()
    # Room for a few thousand tokens at once, so that growing batches rarely
    # rebuild the table (a rebuild allocates, which a graph capture must not).
    size = max(max_num_tokens, 8192)
    state.cost_host = live_table(layer, H200_FIT, size)
    table = torch.tensor(state.cost_host, dtype=torch.float32, device=device)
    state.cost = CostInputs(
        table, H200_FIT.t_fixed, H200_FIT.t_token, other_ratio(state.knobs.other_share)
    )


def _draft_cost() -> DraftCost:
    from ._cost import DraftCost

    return DraftCost(_state.knobs.draft_cost)


def draft_time(reqs: int, depth: int, max_drafts: int) -> float:
    """Drafting ``depth`` positions for ``reqs`` requests, in the cost table's units (a
    layer's routed-expert microseconds): the DRAFT_COST share of a fully verified step
    (``max_drafts`` drafts per request, every one live). 0 when drafting is unpriced
    or the cost table is not built yet."""
    state = _state
    table, cost = state.cost_host, state.cost
    share = _draft_cost().positions(reqs, depth)
    if share <= 0.0 or table is None or cost is None:
        return 0.0
    full = min(reqs * (1 + max_drafts), len(table) - 1)
    routed = cost.t_fixed + cost.t_token * full + table[full]
    # the verify step's routed time and its non-routed share on top (other_ratio)
    return share * routed * (1.0 + cost.other_ratio)


def policy_tau() -> torch.Tensor | None:
    """The device scalar holding the tau the last ``mark_dead`` used (or None)."""
    buffers = _state.buffers
    return buffers.tau if _state.active and buffers is not None else None


def mark_dead(
    is_padding: torch.Tensor,
    query_start_loc: torch.Tensor,
    cu_num_logits: torch.Tensor,
    num_reqs: int,
    num_speculative_steps: int,
    predictions: torch.Tensor | None,
    idx_mapping: torch.Tensor,
    *,
    seq_lens: torch.Tensor,
    prefill_len: torch.Tensor,
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
    state = _state
    state.active = False
    knobs = state.knobs
    if not state.enabled or predictions is None or num_reqs <= 0:
        return False
    if num_draft_tokens is not None and num_draft_tokens <= 0:
        return False
    if refits is not None and refits < knobs.warmup:
        return False
    assert predictions.shape[1] == num_speculative_steps, (
        f"predictions hold {predictions.shape[1]} steps, drafts {num_speculative_steps}"
    )
    prepare(predictions.shape[0], predictions.device, is_padding.shape[0], num_speculative_steps)
    from ._kernel import MAX_COST_REQS, MarkInputs, launch_mark_dead

    buffers = state.buffers
    assert buffers is not None  # prepare allocated them
    cost = state.cost if knobs.policy == "cost" else None
    if cost is not None and knobs.draft_cost:
        drafted = state.drafted if state.drafted is not None else num_speculative_steps
        cost = cost._replace(t_draft=draft_time(num_reqs, drafted, num_speculative_steps))
    inputs = MarkInputs(is_padding, query_start_loc, cu_num_logits, idx_mapping, seq_lens,
                        prefill_len, predictions)
    launch_mark_dead(inputs, buffers, num_reqs, knobs.tau, knobs.min_keep, knobs.explore,
                     cost=cost, calibration=state.calibration, deep=knobs.depth)
    state.active = True
    state.calibrating = cost is not None and num_reqs <= MAX_COST_REQS
    if knobs.trace and state.lead:
        if state.trace is None:
            state.trace = TraceWriter(knobs.trace)
        slots = idx_mapping[:num_reqs].long().clamp(min=0)
        state.trace.pending = predictions.index_select(0, slots).clone()
    return True


def begin_drafting(
    num_speculative_tokens: int | None,
    idx_mapping: torch.Tensor,
    num_reqs: int,
    dummy_run: bool = False,
) -> None:
    """The drafter starts proposing for ``num_reqs`` requests (hook at the top of the
    draft_model drafter's ``propose``). ``num_speculative_tokens``: the drafts vLLM
    will verify next step (its dynamic schedule, ``num_speculative_tokens_per_batch_size``;
    None: all). Every request drafts to the end unless ``stop_drafting`` says
    otherwise. Dummy and profiling runs are ignored."""
    state = _state
    state.scheduled = state.drafted = None
    if not state.enabled or dummy_run or num_reqs <= 0:
        return
    # -1: every position (resolved against the drafter's buffer in stop_drafting)
    state.scheduled = -1 if num_speculative_tokens is None else num_speculative_tokens
    state.drafted = num_speculative_tokens
    buffers = state.buffers
    if buffers is not None:
        from ._kernel import UNCAPPED

        buffers.depth.index_fill_(0, idx_mapping[:num_reqs].long(), UNCAPPED)


def stop_drafting(
    step: int,
    draft_tokens: torch.Tensor,
    estimator: Any,
    idx_mapping: torch.Tensor,
    num_reqs: int,
) -> bool:
    """Whether the drafter stops before drafting position ``step`` (0-based; the
    positions before it are drafted). Hook at the top of the draft_model drafter's
    loop over positions; True means break.

    - Past the drafts vLLM will verify (its dynamic schedule): always, no sync.
      vLLM 0.32.0/0.33.0's draft_model drafter would draft them and throw them away.
    - With ``KILN_DRAFT_TRUNC_DEPTH``: where the cost policy says no deeper drafting
      pays (``_kernel.launch_depth``; the host reads its flag: one sync).
      Then the scheduled positions past ``step`` keep a copy of the last draft (a
      valid token id), are recorded as not drafted (``Buffers.depth``) and the
      next ``mark_dead`` marks them dead: never accepted, routed experts skipped.
    """
    state = _state
    scheduled = state.scheduled
    if scheduled is None:
        return False
    if scheduled < 0:
        scheduled = draft_tokens.shape[1]
    if step >= scheduled:
        state.drafted = scheduled
        return True
    if not state.knobs.depth or not _depth_ready(estimator, num_reqs):
        return False
    from ._kernel import launch_depth

    buffers, cost, cal = state.buffers, state.cost, state.calibration
    assert buffers is not None and cost is not None and cal is not None  # _depth_ready
    if state.go is None or state.go.device != buffers.step.device:
        state.go = torch_zeros_int(buffers.step.device)
    k = estimator.predictions.shape[1]
    launch_depth(
        state.go, idx_mapping, estimator.predictions, buffers, cost, cal, num_reqs, step,
        scheduled, state.knobs.min_keep, state.knobs.explore,
        draft_time(num_reqs, 1, k), draft_time(num_reqs, 2, k) - draft_time(num_reqs, 1, k),
    )
    if bool(state.go.item()):  # the one host sync of a drafting step
        return False
    draft_tokens[:num_reqs, step:scheduled] = draft_tokens[:num_reqs, step - 1 : step]
    buffers.depth.index_fill_(0, idx_mapping[:num_reqs].long(), step)
    state.drafted = step
    return True


def torch_zeros_int(device: torch.device) -> torch.Tensor:
    import torch

    return torch.zeros(1, dtype=torch.int32, device=device)


def _depth_ready(estimator: Any, num_reqs: int) -> bool:
    """The depth decision has what it needs: predictions past the estimator's warm-up,
    the cost policy's buffers (built by the first mark_dead) and a batch that fits
    the cost kernel's one block."""
    from ._kernel import MAX_COST_REQS

    state = _state
    predictions = getattr(estimator, "predictions", None)
    refits = getattr(estimator, "_refits", None)
    if predictions is None or (refits is not None and refits < state.knobs.warmup):
        return False
    return (
        state.buffers is not None
        and state.cost is not None
        and state.cost_host is not None
        and state.calibration is not None
        and 0 < num_reqs <= MAX_COST_REQS
    )


class ExpandedBatch(Protocol):
    """What ``verify_mask`` reads of vLLM's InputBatch: one entry per logits row."""

    expanded_idx_mapping: torch.Tensor
    expanded_local_pos: torch.Tensor


def verify_mask(
    input_batch: ExpandedBatch, invalid_drafts: torch.Tensor | None = None
) -> torch.Tensor | None:
    """``invalid_drafts`` for the rejection sampler, widened by this step's marks.

    Row ``c0 + i`` of a request carries draft ``d_i``; drafts past the kept
    count ``j`` become -1 in the verification copy and are never accepted, so
    the garbage logits of dead rows are never read.
    """
    buffers = _state.buffers
    if not _state.active or buffers is None:
        return invalid_drafts
    return mask_from_live(
        buffers.live,
        input_batch.expanded_idx_mapping,
        input_batch.expanded_local_pos,
        invalid_drafts,
    )


def mask_from_live(
    live: torch.Tensor,
    expanded_idx_mapping: torch.Tensor,
    expanded_local_pos: torch.Tensor,
    invalid_drafts: torch.Tensor | None = None,
) -> torch.Tensor:
    # Cudagraph-padded rows may carry slot -1: clamp them to a real slot; the
    # sampler never reads those rows anyway.
    kept = live.index_select(0, expanded_idx_mapping.clamp(min=0).long())
    mask = expanded_local_pos > kept
    return mask if invalid_drafts is None else (mask | invalid_drafts)


def graded(
    num_rejected: torch.Tensor, cu_num_logits: torch.Tensor, idx_mapping: torch.Tensor
) -> torch.Tensor:
    """Rejection counts to grade the acceptance estimator with.

    A truncated window that accepted all ``j`` kept drafts would otherwise be
    graded as rejecting ``d_{j+1}``, which was never verified; subtracting the
    ``n - j`` dead drafts labels only verified drafts, so truncation does not
    bias the estimator. Returns ``num_rejected`` itself when nothing was marked.
    """
    state = _state
    buffers = state.buffers
    if not state.active or buffers is None:
        return num_rejected
    num_reqs = idx_mapping.shape[0]
    cu = cu_num_logits[: num_reqs + 1]
    n = (cu[1:] - cu[:-1] - 1).clamp(min=0)
    # Masked entries carry slot -1 and keep their count.
    slots = idx_mapping.long()
    j = buffers.live.index_select(0, slots.clamp(min=0))
    dead = (n - j) * (slots >= 0)
    censored = (num_rejected[:num_reqs] - dead).clamp(min=0)
    if state.calibrating and state.calibration is not None:
        _calibrate(state.calibration, slots, j, j - censored)
    return censored.to(num_rejected.dtype)


def _calibrate(
    cal: Calibration, slots: torch.Tensor, kept: torch.Tensor, accepted: torch.Tensor
) -> None:
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


def log_step(
    cu_num_logits: torch.Tensor,
    num_sampled: torch.Tensor,
    idx_mapping: torch.Tensor,
    num_tokens: int,
) -> Summary | None:
    """Fold this step into the device-side statistics (no host sync).

    Every ``KILN_DRAFT_TRUNC_LOG_INTERVAL`` steps the totals are logged and
    added to the ``kiln_draft_trunc_*`` Prometheus counters once their copy has
    landed. Returns the last finished summary, if one finished now. With
    ``KILN_DRAFT_TRUNC_TRACE`` set it also appends this step to the trace (that
    part does sync the host: it is a measurement mode).
    """
    state = _state
    buffers = state.buffers
    if not (state.log and state.active and state.lead) or buffers is None:
        return None
    if state.trace is not None and state.trace.pending is not None:
        _write_trace(state.trace, cu_num_logits, num_sampled, idx_mapping, buffers.live)
    if state.knobs.log_interval <= 0:
        return None
    from ._metrics import FeatureCounters
    from ._stats import StepStats

    if state.stats is None:
        state.stats = StepStats(
            buffers.live.device, state.knobs.log_interval, state.top_k, FeatureCounters.register()
        )
    stats = state.stats
    before = stats.last
    stats.add(cu_num_logits, num_sampled, idx_mapping, num_tokens, buffers.live, buffers.expected)
    return stats.last if stats.last is not before else None


def poll_summary() -> Summary | None:
    """Report a statistics flush whose copy has landed since the last step, if any
    (``log_step`` does this every step; this is for a caller with no next step)."""
    stats = _state.stats
    return None if stats is None else stats.poll()


def _write_trace(
    trace: TraceWriter,
    cu_num_logits: torch.Tensor,
    num_sampled: torch.Tensor,
    idx_mapping: torch.Tensor,
    live: torch.Tensor,
) -> None:
    """One JSON line per verify step: {"step", "k", "reqs": [{"p", "kept", "accepted",
    "n"}]}; p_i is the estimator's conditional acceptance probability of draft i
    (null where it had none), kept the drafts verified, accepted those accepted."""
    from ._stats import step_outcomes

    p = trace.pending
    trace.pending = None
    if p is None:
        return
    rows = step_outcomes(cu_num_logits, num_sampled, idx_mapping, live)
    probs_by_req: list[list[float]] = p.tolist()
    reqs = []
    for outcome, probs in zip(rows, probs_by_req, strict=True):
        if outcome.proposed <= 0:  # prefill or no drafts: nothing was verified
            continue
        shown = [None if x != x else round(x, 6) for x in probs]  # NaN: no prediction
        reqs.append({"p": shown, "kept": outcome.kept, "accepted": outcome.accepted,
                     "n": outcome.proposed})
    if reqs:
        trace.write({"step": trace.steps, "k": p.shape[1], "reqs": reqs})


def zero_dead_rows(routed: Any, is_padding: torch.Tensor | None) -> Any:
    """The routed-expert output with the rows marked padding set to 0, in place.

    The experts never write the rows the router skipped, so those rows hold
    whatever the buffer held, NaN or Inf included. Dead draft rows keep their KV
    slots, and attention masks their scores but still multiplies their values
    (0 * NaN = NaN), so a non-finite dead row would poison live rows of its
    request. ``masked_fill_`` is graph-safe and allocates nothing. Anything but
    a plain tensor (a deferred MoE output; hence ``Any``) is returned as it is.
    """
    if not _state.enabled or is_padding is None or not hasattr(routed, "masked_fill_"):
        return routed
    rows = routed.shape[0]
    mask = is_padding[:rows].view(rows, *([1] * (routed.dim() - 1)))
    return routed.masked_fill_(mask, 0)


def refuse_runner(name: str) -> None:
    """Refuse to start in a model runner that has no draft_trunc hooks."""
    if _state.enabled:
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
    on and ``KILN_DRAFT_TRUNC_WITH_AV`` is not. On the reporting rank it logs the
    knobs and the statistics interval, and registers the counters (at 0).
    """
    state = _state
    if not state.enabled:
        return
    from ._config_check import adaptive_verification_on, problems, routed_top_k

    found = problems(vllm_config)
    if found:
        raise RuntimeError(f"KILN_DRAFT_TRUNC=1 cannot run here: {found[0]}")
    if adaptive_verification_on(vllm_config) and not state.knobs.with_av:
        logger.warning(
            "draft_trunc: adaptive verification is on; draft truncation is off "
            "(set KILN_DRAFT_TRUNC_WITH_AV=1 to combine them)"
        )
        state.enabled = state.log = False
        return
    state.top_k = routed_top_k(vllm_config)
    state.lead = _is_lead_rank()
    layer = _priced_layer(state.knobs, vllm_config)
    if layer is not None:
        set_moe_layer(layer)
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
        "draft_trunc statistics: every %d steps (%s=%d): a summary line and the "
        "kiln_draft_trunc_* counters%s",
        interval, name, interval,
        " (on /metrics from the start, at 0 until the first flush)" if published
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
