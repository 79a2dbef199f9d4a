"""The verify step's hooks, in the order the patched runner calls them.

``mark_dead`` (the marks and ``j``), ``zero_dead_rows`` (the MoE output of the rows marked),
``verify_mask`` (0.32.0/0.33.0) or ``verify_drafts`` (0.34.0's rejection sampler):
rows past ``j`` become invalid drafts; and ``graded`` (censored
rejection counts, and the calibration of the estimator, without the drafts of
requests whose sampling acts on the target only: ``_tenant``).

Pure Python at import: torch and the kernels load only when a hook has work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from . import _state
from ._drafting import draft_time
from ._reporting import TraceWriter
from ._tenant import excluded_rows

if TYPE_CHECKING:
    import torch

    from ._kernels.buffers import Calibration


def policy_tau() -> torch.Tensor | None:
    """The device scalar holding the tau the last ``mark_dead`` used (or None)."""
    state = _state.current
    buffers = state.buffers
    return buffers.tau if state.active and buffers is not None else None


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
    state = _state.current
    state.active = False
    knobs = state.knobs
    if not state.enabled or predictions is None or num_reqs <= 0:
        return False
    if num_draft_tokens is not None and num_draft_tokens <= 0:
        return False
    if refits is not None and refits < knobs.warmup:
        return False
    assert predictions.shape[1] == num_speculative_steps, (  # an invariant of vLLM's call, not input  # noqa: S101
        f"predictions hold {predictions.shape[1]} steps, drafts {num_speculative_steps}"
    )
    _state.prepare(predictions.shape[0], predictions.device, is_padding.shape[0], num_speculative_steps)
    from ._kernels.buffers import MarkInputs
    from ._kernels.kernel import MAX_COST_REQS, launch_mark_dead

    buffers = state.buffers
    assert buffers is not None  # prepare allocated them  # noqa: S101
    cost = state.cost if knobs.policy == "cost" else None
    if cost is not None and knobs.draft_cost:
        drafted = state.drafted if state.drafted is not None else num_speculative_steps
        cost = cost._replace(t_draft=draft_time(num_reqs, drafted, num_speculative_steps))
    inputs = MarkInputs(is_padding, query_start_loc, cu_num_logits, idx_mapping, seq_lens, prefill_len, predictions)
    launch_mark_dead(
        inputs,
        buffers,
        num_reqs,
        knobs.tau,
        knobs.min_keep,
        knobs.explore,
        cost=cost,
        calibration=state.calibration,
        deep=knobs.depth,
    )
    state.active = True
    state.calibrating = cost is not None and num_reqs <= MAX_COST_REQS
    if knobs.trace and state.lead:
        if state.trace is None:
            state.trace = TraceWriter(knobs.trace)
        slots = idx_mapping[:num_reqs].long().clamp(min=0)
        state.trace.pending = predictions.index_select(0, slots).clone()
    return True


def zero_dead_rows(routed: Any, is_padding: torch.Tensor | None) -> Any:
    """The routed-expert output with the rows marked padding set to 0, in place.

    The experts never write the rows the router skipped, so those rows hold
    whatever the buffer held, NaN or Inf included. Dead draft rows keep their KV
    slots, and attention masks their scores but still multiplies their values
    (0 * NaN = NaN), so a non-finite dead row would poison live rows of its
    request. ``masked_fill_`` is graph-safe and allocates nothing. Anything but
    a plain tensor (a deferred MoE output; hence ``Any``) is returned as it is.
    """
    if not _state.current.enabled or is_padding is None or not hasattr(routed, "masked_fill_"):
        return routed
    rows = routed.shape[0]
    mask = is_padding[:rows].view(rows, *([1] * (routed.dim() - 1)))
    return routed.masked_fill_(mask, 0)


class ExpandedBatch(Protocol):
    """What ``verify_mask`` reads of vLLM's InputBatch: one entry per logits row."""

    expanded_idx_mapping: torch.Tensor
    expanded_local_pos: torch.Tensor


def verify_mask(input_batch: ExpandedBatch, invalid_drafts: torch.Tensor | None = None) -> torch.Tensor | None:
    """``invalid_drafts`` for the rejection sampler, widened by this step's marks.

    Row ``c0 + i`` of a request carries draft ``d_i``; drafts past the kept
    count ``j`` become -1 in the verification copy and are never accepted, so
    the garbage logits of dead rows are never read.
    """
    state = _state.current
    buffers = state.buffers
    if not state.active or buffers is None:
        return invalid_drafts
    return mask_from_live(
        buffers.live,
        input_batch.expanded_idx_mapping,
        input_batch.expanded_local_pos,
        invalid_drafts,
    )


def verify_drafts(
    draft_sampled: torch.Tensor,
    expanded_idx_mapping: torch.Tensor,
    expanded_local_pos: torch.Tensor,
) -> torch.Tensor:
    """The draft ids the rejection sampler verifies, with this step's dead drafts -1.

    vLLM 0.34.0 dropped the sampler's ``invalid_drafts``; its ``_verify`` calls this
    (per chunk of logit rows) on the ids it passes to ``rejection_sample`` only, so
    sampling parameters and watermarking still see the real ids, as on 0.32.0/0.33.0.
    ``-1`` is what 0.33.0 put there (``draft_sampled.masked_fill(invalid_drafts, -1)``):
    the same rows, the same mask as ``verify_mask``. Returns ``draft_sampled`` itself
    when nothing was marked this step.
    """
    state = _state.current
    buffers = state.buffers
    if not state.active or buffers is None:
        return draft_sampled
    mask = mask_from_live(buffers.live, expanded_idx_mapping, expanded_local_pos)
    return draft_sampled.masked_fill(mask, -1)


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


def graded(num_rejected: torch.Tensor, cu_num_logits: torch.Tensor, idx_mapping: torch.Tensor) -> torch.Tensor:
    """Rejection counts to grade the acceptance estimator with.

    A truncated window that accepted all ``j`` kept drafts would otherwise be
    graded as rejecting ``d_{j+1}``, which was never verified; subtracting the
    ``n - j`` dead drafts labels only verified drafts, so truncation does not
    bias the estimator. Returns ``num_rejected`` itself when nothing was marked.
    The cost policy's calibration is graded too, without the drafts of requests
    whose sampling settings act on the target only (``_tenant``).
    """
    state = _state.current
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
    cal = state.calibration
    if state.calibrating and cal is not None:
        excluded = excluded_rows(slots, buffers.live)
        _calibrate(cal, slots, j, j - censored, excluded, _tally(state, cal.hits.device))
    return censored.to(num_rejected.dtype)


def _tally(state: _state.State, device: torch.device) -> torch.Tensor | None:
    """The graded/excluded draft counts for the next statistics step, where statistics
    are published (None elsewhere: nobody would read them)."""
    if not (state.log and state.lead and state.knobs.log_interval > 0):
        return None
    if state.tally is None or state.tally.device != device:
        import torch

        state.tally = torch.zeros(2, dtype=torch.float64, device=device)
    return state.tally


def _calibrate(
    cal: Calibration,
    slots: torch.Tensor,
    kept: torch.Tensor,
    accepted: torch.Tensor,
    excluded: torch.Tensor | None = None,
    tally: torch.Tensor | None = None,
) -> None:
    """File each verified draft's outcome under the cell its marks were made in.

    Only verified drafts are graded (k < kept), and only those of pure verify
    queries (the kernel filed -1 for the rest), and none of a row ``excluded``
    marks (its request's sampling acts on the target only: ``_tenant``). Every
    count added is 1.0, so the totals are exact and identical on every rank
    whatever the order of the atomic adds; past ``CAL_CAP`` a cell's counts are
    halved so that old grades fade. ``tally`` (if any) gains the drafts graded and
    the drafts ``excluded`` kept out. Graph-safe, no host sync.
    """
    import torch

    from ._cost import CAL_CAP, TAU_GRID
    from ._kernels.device_functions import BIN_BITS, CAL_DEPTH

    sink = cal.hits.shape[0] - 1
    depth = min(sink // TAU_GRID, CAL_DEPTH.value)
    pos = torch.arange(depth, device=cal.bins.device)
    packed = cal.bins.index_select(0, slots.clamp(min=0))
    bins = (packed[:, None] >> (BIN_BITS.value * pos)) & (TAU_GRID - 1)
    filed = (slots >= 0) & (packed >= 0)
    in_window = pos < kept[:, None]
    if excluded is not None:
        if tally is not None:
            tally[1] += (in_window & (filed & excluded)[:, None]).sum()
        filed = filed & ~excluded
    verified = in_window & filed[:, None]
    if tally is not None:
        tally[0] += verified.sum()
    survived = verified & (pos < accepted[:, None])
    cells = torch.where(verified, pos * TAU_GRID + bins, sink).flatten()
    cal.counts.index_add_(0, cells, verified.flatten().to(cal.counts.dtype))
    cal.hits.index_add_(0, cells, survived.flatten().to(cal.hits.dtype))
    fade = torch.where(cal.counts > CAL_CAP, 0.5, 1.0)
    cal.counts.mul_(fade)
    cal.hits.mul_(fade)
