"""The drafting hooks: stop the draft_model drafter where vLLM's dynamic schedule stops
verifying, and with ``KILN_DRAFT_TRUNC_DEPTH`` where one more position does not pay;
and what drafting costs, in the cost table's units.

Pure Python at import: torch and the kernels load only when a hook has work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _state

if TYPE_CHECKING:
    import torch

    from ._cost import DraftCost


def _draft_cost() -> DraftCost:
    from ._cost import DraftCost

    return DraftCost(_state.current.knobs.draft_cost)


def draft_time(reqs: int, depth: int, max_drafts: int) -> float:
    """Drafting ``depth`` positions for ``reqs`` requests, in the cost table's units (a
    layer's routed-expert microseconds): the DRAFT_COST share of a fully verified step
    (``max_drafts`` drafts per request, every one live). 0 when drafting is unpriced
    or the cost table is not built yet."""
    state = _state.current
    table, cost = state.cost_host, state.cost
    share = _draft_cost().positions(reqs, depth)
    if share <= 0.0 or table is None or cost is None:
        return 0.0
    full = min(reqs * (1 + max_drafts), len(table) - 1)
    routed = cost.t_fixed + cost.t_token * full + table[full]
    # the verify step's routed time and its non-routed share on top (other_ratio)
    return share * routed * (1.0 + cost.other_ratio)


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
    state = _state.current
    state.scheduled = state.drafted = None
    if not state.enabled or dummy_run or num_reqs <= 0:
        return
    # -1: every position (resolved against the drafter's buffer in stop_drafting)
    state.scheduled = -1 if num_speculative_tokens is None else num_speculative_tokens
    state.drafted = num_speculative_tokens
    buffers = state.buffers
    if buffers is not None:
        from ._kernels.buffers import UNCAPPED

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
      pays (``_kernels.kernel.launch_depth``; the host reads its flag: one sync).
      Then the scheduled positions past ``step`` keep a copy of the last draft (a
      valid token id), are recorded as not drafted (``Buffers.depth``) and the
      next ``mark_dead`` marks them dead: never accepted, routed experts skipped.
    """
    state = _state.current
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
    from ._kernels.kernel import launch_depth

    buffers, cost, cal = state.buffers, state.cost, state.calibration
    assert buffers is not None and cost is not None and cal is not None  # _depth_ready  # noqa: S101,PT018
    if state.go is None or state.go.device != buffers.step.device:
        state.go = _zeros_int(buffers.step.device)
    k = estimator.predictions.shape[1]
    launch_depth(
        state.go,
        idx_mapping,
        estimator.predictions,
        buffers,
        cost,
        cal,
        num_reqs,
        step,
        scheduled,
        state.knobs.min_keep,
        state.knobs.explore,
        draft_time(num_reqs, 1, k),
        draft_time(num_reqs, 2, k) - draft_time(num_reqs, 1, k),
    )
    if bool(state.go.item()):  # the one host sync of a drafting step
        return False
    draft_tokens[:num_reqs, step:scheduled] = draft_tokens[:num_reqs, step - 1 : step]
    buffers.depth.index_fill_(0, idx_mapping[:num_reqs].long(), step)
    state.drafted = step
    return True


def _zeros_int(device: torch.device) -> torch.Tensor:
    import torch

    return torch.zeros(1, dtype=torch.int32, device=device)


def _depth_ready(estimator: Any, num_reqs: int) -> bool:
    """The depth decision has what it needs: predictions past the estimator's warm-up,
    the cost policy's buffers (built by the first mark_dead) and a batch that fits
    the cost kernel's one block."""
    from ._kernels.kernel import MAX_COST_REQS

    state = _state.current
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
