"""Adaptive verification fed draft-trunc's calibration (``KILN_DRAFT_TRUNC_AV_CALIBRATE``).

vLLM 0.32.0-0.34.0's adaptive verification (``speculative_config.
enable_adaptive_verification``) sizes each step's draft budget and admits the best
draft slots from the acceptance estimator's confidences, and then verifies only
those (a variable-length verify). It takes the confidences as they are (0.34.0 ranks
them in a Triton kernel, ``_assign_draft_token_budget_kernel``, reading the buffer
``record_confidences`` fills: the hook still comes first). On the CPU
twin's traces the estimator is off by cell (a survival of 0.2 meant 0.19 at the first
draft and 0.09 at the third), and in the trace model adaptive verification ran
0.958-1.000x of the best fixed K there (docs/draft-trunc-policy.md section 4).

``av_confidences`` corrects them before adaptive verification records them: a draft
whose predicted survival S falls in cell (position, bin) is given S x the cell's
calibrated rate / the bin's middle, from the calibration draft-trunc's cost policy
already keeps on the device (graded from the drafts adaptive verification let
through), shrunk toward no correction with ``AV_PRIOR`` pseudo-drafts. The result goes
back as conditional confidences, the form vLLM reads. Lossless by construction: it
only changes which drafts are verified, never how.

The hook runs as one Triton kernel (``_kernels.av``: eagerly the ~30 torch
operations cost up to 1.7% of a TP-8 verify step at 1 request, as much as kiln-av's
modelled gain there); ``corrected_confidences`` is the eager reference it is tested
against. Below ``KILN_DRAFT_TRUNC_AV_MIN_BATCH`` requests the hook steps aside (returns
the confidences as they are): there even the fused hook's price outweighs what the
correction wins in the trace model (docs/draft-trunc-policy.md section 4). With
statistics on (``KILN_DRAFT_TRUNC_LOG_INTERVAL``) it counts what it did
(``_av_stats``), and with ``KILN_DRAFT_TRUNC_AV_TIMING`` what it cost.

Pure Python at import; torch loads when the hook has work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import _state

if TYPE_CHECKING:
    import torch

    from ._av_stats import AvStats
    from ._kernels.buffers import Calibration

# Pseudo-drafts per cell that vouch for the estimator itself: a cell needs a few
# hundred grades before its correction is most of the way in. 8 (the truncation
# policy's CAL_PRIOR) let noise cost up to 0.4% against vLLM's own rule on calibrated
# traffic in the trace model; 64 at most 0.1%. A power of two: the fused kernel's
# prior x bin middle is then exact, so it matches the eager arithmetic bit for bit.
AV_PRIOR = 64.0


@dataclass
class _Hook:
    """What the hook keeps between steps, for one ``_state.State`` (a reload starts
    afresh): the output buffer (reused: vLLM copies it into its own buffer at once,
    in stream order, and the allocator's host time is a share of the hook's) and the
    statistics (None: not reported from this process)."""

    state: _state.State
    stats: AvStats | None
    out: torch.Tensor | None = None


_hook: _Hook | None = None


def av_confidences(confidence_probs: torch.Tensor, num_reqs: int) -> torch.Tensor:
    """The confidences adaptive verification should record for this step's drafts
    (hook: the runner's ``record_confidences`` call). ``confidence_probs`` [>= num_reqs,
    K], conditional, in batch order. Returns them unchanged unless
    ``KILN_DRAFT_TRUNC_AV_CALIBRATE`` is on, the calibration exists and the batch has at
    least ``KILN_DRAFT_TRUNC_AV_MIN_BATCH`` requests; else a tensor of the same shape,
    rows past ``num_reqs`` copied, valid until the next call. No host sync (it runs
    after drafting, outside CUDA graphs)."""
    state = _state.current
    cal = state.calibration
    if not (state.enabled and state.knobs.av_calibrate) or cal is None or num_reqs <= 0:
        return confidence_probs
    hook = _hook_for(state, confidence_probs.device)
    if num_reqs < state.knobs.av_min_batch:
        if hook.stats is not None:
            hook.stats.stepped_aside()
        return confidence_probs
    return _corrected(hook, confidence_probs, num_reqs, cal)


def _hook_for(state: _state.State, device: torch.device) -> _Hook:
    global _hook
    if _hook is None or _hook.state is not state:
        stats = None
        if state.lead and state.knobs.log_interval > 0:
            from ._av_stats import AvStats
            from ._metrics import FeatureCounters

            stats = AvStats(device, state.knobs.log_interval, FeatureCounters.register(), state.knobs.av_timing)
        _hook = _Hook(state, stats)
    return _hook


def _corrected(hook: _Hook, confidence_probs: torch.Tensor, num_reqs: int, cal: Calibration) -> torch.Tensor:
    import torch

    from ._kernels.av import launch_av

    out = hook.out
    like = (confidence_probs.shape, confidence_probs.dtype, confidence_probs.device)
    if out is None or (out.shape, out.dtype, out.device) != like:
        out = hook.out = torch.empty(like[0], dtype=like[1], device=like[2])
    stats = hook.stats
    timer = None if stats is None else stats.timer
    if timer is not None:
        timer.start()
    launch_av(
        confidence_probs,
        num_reqs,
        cal.hits,
        cal.counts,
        AV_PRIOR,
        out,
        None if stats is None else stats.acc,
    )
    if timer is not None:
        timer.stop()
    if stats is not None:
        stats.corrected(num_reqs, confidence_probs.shape[1])
    return out


def last_summary() -> dict[str, float] | None:
    """The last flush of kiln-av's statistics this process reported, if any (tests,
    benchmarks): ``_av_stats.FIELDS``' totals."""
    if _hook is None or _hook.state is not _state.current or _hook.stats is None:
        return None
    return _hook.stats.last


def corrected_confidences(
    confidence_probs: torch.Tensor,
    num_reqs: int,
    hits: torch.Tensor,
    counts: torch.Tensor,
    prior: float = AV_PRIOR,
) -> torch.Tensor:
    """``av_confidences``' arithmetic in eager torch, on any device: the reference the
    fused kernel (``_kernels.av``) is held to. ``hits``/``counts``: the calibration's
    cells, ``k * TAU_GRID + bin`` (``_kernels.buffers.Calibration``)."""
    import torch

    from ._cost import TAU_GRID

    probs = confidence_probs[:num_reqs].float()
    k = probs.shape[1]
    # NaN (no prediction) counts as certain, as the truncation kernel reads it. The
    # product runs in float64 (as torch's CPU cumprod does for float32 anyway; CUDA's
    # would run a float32 tree), so that every device and the kernel agree on the bins
    surv = torch.nan_to_num(probs, nan=1.0).clamp(0.0, 1.0).cumprod(dim=1, dtype=torch.float64)
    surv = surv.float()
    bins = (surv * TAU_GRID).floor().clamp(max=TAU_GRID - 1).long()
    cells = torch.arange(k, device=probs.device) * TAU_GRID + bins
    mids = (bins.float() + 0.5) / TAU_GRID
    rate = (hits[cells] + prior * mids) / (counts[cells] + prior)
    # survival falls along a request, corrected or not
    fixed = torch.cummin((surv * rate / mids).clamp(0.0, 1.0), dim=1).values
    before = torch.cat([torch.ones_like(fixed[:, :1]), fixed[:, :-1]], dim=1)
    conditional = torch.where(before > 0, fixed / before.clamp(min=1e-30), torch.zeros_like(fixed))
    out = confidence_probs.clone()
    out[:num_reqs] = conditional.to(out.dtype)
    return out
