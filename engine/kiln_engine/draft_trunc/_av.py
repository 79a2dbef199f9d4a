"""Adaptive verification fed draft-trunc's calibration (issue 37,
``KILN_DRAFT_TRUNC_AV_CALIBRATE``).

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

Pure Python at import; torch loads when the hook has work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _state

if TYPE_CHECKING:
    import torch

# Pseudo-drafts per cell that vouch for the estimator itself: a cell needs a few
# hundred grades before its correction is most of the way in. 8 (the truncation
# policy's CAL_PRIOR) let noise cost up to 0.4% against vLLM's own rule on calibrated
# traffic in the trace model; 64 at most 0.1%.
AV_PRIOR = 64.0


def av_confidences(confidence_probs: torch.Tensor, num_reqs: int) -> torch.Tensor:
    """The confidences adaptive verification should record for this step's drafts
    (hook: the runner's ``record_confidences`` call). ``confidence_probs`` [>= num_reqs,
    K], conditional, in batch order. Returns them unchanged unless
    ``KILN_DRAFT_TRUNC_AV_CALIBRATE`` is on and the calibration exists; else a new
    tensor of the same shape, rows past ``num_reqs`` copied. No host sync (it runs
    after drafting, outside CUDA graphs)."""
    state = _state.current
    cal = state.calibration
    if not (state.enabled and state.knobs.av_calibrate) or cal is None or num_reqs <= 0:
        return confidence_probs
    return corrected_confidences(confidence_probs, num_reqs, cal.hits, cal.counts)


def corrected_confidences(
    confidence_probs: torch.Tensor,
    num_reqs: int,
    hits: torch.Tensor,
    counts: torch.Tensor,
    prior: float = AV_PRIOR,
) -> torch.Tensor:
    """``av_confidences``' arithmetic, on any device. ``hits``/``counts``: the
    calibration's cells, ``k * TAU_GRID + bin`` (``_kernels.buffers.Calibration``)."""
    import torch

    from ._cost import TAU_GRID

    probs = confidence_probs[:num_reqs].float()
    k = probs.shape[1]
    # NaN (no prediction) counts as certain, as the truncation kernel reads it
    surv = torch.nan_to_num(probs, nan=1.0).clamp(0.0, 1.0).cumprod(dim=1)
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
