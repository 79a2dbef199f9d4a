"""kiln-av's hook in one Triton kernel (``_av.av_confidences``).

The eager arithmetic (``_av.corrected_confidences``, the reference) is some 30 small
torch operations: on an H100 they took 270-680 us a step, mostly launch gaps, as much
as kiln-av's whole modelled gain at 1-2 requests. Here the cell lookup, the
correction, the running minimum and the re-normalisation to conditional confidences
run in one launch, for every row at once, and the same launch adds the step's
survival sums to the counters' device accumulator (no host sync).

Bit for bit the reference's arithmetic: the survival is a running product in float64
rounded to float32 at each position (what torch's cumprod does on the CPU, and what
the reference asks for on every device), the divisions round to nearest
(``div_rn``: Triton's ``/`` is an approximate division on CUDA) and the prior times
a bin's middle is exact for a power-of-two prior (``AV_PRIOR`` = 64), so a fused
multiply-add changes nothing there either.

Imported lazily by ``_av``: it needs triton.
"""

from __future__ import annotations

import torch
import triton.language as tl

from .. import _cost
from .device_functions import TAU_GRID
from .jit import jit

# The device accumulator's columns (float64): sums over the corrected draft slots.
STATS = (
    "survival_raw",  # the estimator's survival, as adaptive verification would rank it
    "survival_corrected",  # the corrected survival it ranks instead
    "survival_shift",  # |corrected - raw|
)

# Rows per block: one compiled variant for every batch size (a new constexpr would
# compile again mid-serving); a verify batch of 512 requests is 4 blocks.
BLOCK_R = 128


@jit(do_not_specialize=["conf_stride", "col_stride", "out_stride", "num_reqs", "num_rows", "prior"])
def _av_kernel(
    conf_ptr: tl.tensor,  # [num_rows, K]: the estimator's conditional confidences
    conf_stride: tl.tensor,
    col_stride: tl.tensor,
    out_ptr: tl.tensor,  # [num_rows, K], same dtype: the corrected ones
    out_stride: tl.tensor,
    hits_ptr: tl.tensor,  # [K * TAU_GRID + 1] fp32: the calibration (Calibration.hits)
    counts_ptr: tl.tensor,  # [K * TAU_GRID + 1] fp32
    stats_ptr: tl.tensor,  # [len(STATS)] fp64, added to (WITH_STATS only)
    num_reqs: tl.tensor,
    num_rows: tl.tensor,
    prior: tl.tensor,
    K: tl.constexpr,
    BLOCK: tl.constexpr,
    WITH_STATS: tl.constexpr,
) -> None:
    # One program: a batch is at most a few thousand rows, and one program can add
    # the step's sums to the accumulator without atomics (the sums stay deterministic).
    raw_sum = tl.zeros([BLOCK], tl.float64)
    fixed_sum = tl.zeros([BLOCK], tl.float64)
    shift_sum = tl.zeros([BLOCK], tl.float64)
    for start in range(0, num_reqs, BLOCK):
        rows = start + tl.arange(0, BLOCK)
        rmask = rows < num_reqs
        product = tl.full([BLOCK], 1.0, tl.float64)
        best = tl.full([BLOCK], 1.0, tl.float32)  # the running minimum (corrected survival)
        before = tl.full([BLOCK], 1.0, tl.float32)
        for k in tl.static_range(K):
            p = tl.load(conf_ptr + rows * conf_stride + k * col_stride, mask=rmask, other=1.0)
            p = p.to(tl.float32)
            # NaN (no prediction) counts as certain, as the truncation kernel reads it
            # p != p: NaN, the only test Triton has
            p = tl.minimum(tl.maximum(tl.where(p != p, 1.0, p), 0.0), 1.0)  # noqa: PLR0124
            product = product * p.to(tl.float64)
            surv = product.to(tl.float32)
            b = tl.minimum((surv * TAU_GRID).to(tl.int32), TAU_GRID - 1)  # floor: surv >= 0
            mid = (b.to(tl.float32) + 0.5) * (1.0 / TAU_GRID)  # exact: TAU_GRID is a power of two
            h = tl.load(hits_ptr + k * TAU_GRID + b, mask=rmask, other=0.0)
            c = tl.load(counts_ptr + k * TAU_GRID + b, mask=rmask, other=0.0)
            rate = tl.math.div_rn(h + prior * mid, c + prior)
            fixed = tl.minimum(tl.maximum(tl.math.div_rn(surv * rate, mid), 0.0), 1.0)
            # survival falls along a request, corrected or not
            best = tl.minimum(best, fixed)
            cond = tl.where(before > 0, tl.math.div_rn(best, tl.maximum(before, 1e-30)), 0.0)
            tl.store(out_ptr + rows * out_stride + k, cond.to(out_ptr.dtype.element_ty), mask=rmask)
            before = best
            if WITH_STATS:
                raw_sum += tl.where(rmask, surv, 0.0).to(tl.float64)
                fixed_sum += tl.where(rmask, best, 0.0).to(tl.float64)
                shift_sum += tl.where(rmask, tl.abs(best - surv), 0.0).to(tl.float64)
    # rows past the batch are copied: the result stands in for the whole buffer
    for start in range(num_reqs, num_rows, BLOCK):
        rows = start + tl.arange(0, BLOCK)
        rmask = rows < num_rows
        for k in tl.static_range(K):
            v = tl.load(conf_ptr + rows * conf_stride + k * col_stride, mask=rmask)
            tl.store(out_ptr + rows * out_stride + k, v, mask=rmask)
    if WITH_STATS:
        tl.store(stats_ptr, tl.load(stats_ptr) + tl.sum(raw_sum, axis=0))
        tl.store(stats_ptr + 1, tl.load(stats_ptr + 1) + tl.sum(fixed_sum, axis=0))
        tl.store(stats_ptr + 2, tl.load(stats_ptr + 2) + tl.sum(shift_sum, axis=0))


def launch_av(
    confidence_probs: torch.Tensor,
    num_reqs: int,
    hits: torch.Tensor,
    counts: torch.Tensor,
    prior: float,
    out: torch.Tensor,
    stats: torch.Tensor | None = None,
) -> torch.Tensor:
    """Write ``_av.corrected_confidences(confidence_probs, num_reqs, hits, counts,
    prior)`` into ``out`` (contiguous, same shape and dtype) with one launch, and with
    ``stats`` (float64 [len(STATS)]) add the step's sums to it. Returns ``out``."""
    k = confidence_probs.shape[1]
    if hits.shape[0] < k * _cost.TAU_GRID or counts.shape[0] < k * _cost.TAU_GRID:
        # the kernel would read past the cells (the eager reference raises IndexError)
        raise ValueError(f"kiln-av: a calibration of {hits.shape[0]} cells for {k} drafts")
    _av_kernel[(1,)](
        confidence_probs,
        confidence_probs.stride(0),
        confidence_probs.stride(1),
        out,
        out.stride(0),
        hits,
        counts,
        out if stats is None else stats,  # unread without WITH_STATS
        num_reqs,
        confidence_probs.shape[0],
        float(prior),
        K=k,
        BLOCK=BLOCK_R,
        WITH_STATS=stats is not None,
        num_warps=4,
    )
    return out
