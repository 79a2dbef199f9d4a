"""The Triton device functions both kernels (``kernel``) are built of: the
exploration hash, each request's facts and draft survivals, the calibrated
survival of a cell, and the cost-aware choice of tau; and their constants.

Imported lazily by the package: it needs triton, which a CPU vLLM image may lack.
"""

from __future__ import annotations

import triton.language as tl

from .. import _cost
from .jit import jit

# Exploration hash: a small integer mixer. Every multiplier is below 2**31 and
# every operand below 2**32, so products fit in int64 both on the GPU and in
# the interpreter (numpy), and the two agree bit for bit. The test reference
# imports these, so there is one copy of each.
MASK32 = tl.constexpr(0xFFFFFFFF)
STEP_MUL = tl.constexpr(0x6D2B79F5)
MIX_MUL = tl.constexpr(0x045D9F3B)
# The uniform keeps the top 24 bits: they convert to fp32 exactly, so the
# comparison with ``explore`` is reproducible.
UNIFORM_SHIFT = tl.constexpr(8)
UNIFORM_SCALE = tl.constexpr(1.0 / (1 << 24))
TAU_GRID = tl.constexpr(_cost.TAU_GRID)
CAL_PRIOR = tl.constexpr(_cost.CAL_PRIOR)
# A request's survival bins are filed for grading packed into one int64, 5
# bits per draft (TAU_GRID = 32): one store per request instead of K. Drafts
# past the 12th (60 bits) are not graded; their cells keep the prediction.
BIN_BITS = tl.constexpr(5)
CAL_DEPTH = tl.constexpr(12)
# The exploration key of the drafting depth (per step, not per slot): past any slot.
DEPTH_KEY = tl.constexpr(0xFFFFFFFF)


@jit
def explore_uniform(step: tl.tensor, slot: tl.tensor) -> tl.tensor:
    """Uniform in [0, 1) keyed by (step, slot); identical on every TP rank."""
    x = (slot & MASK32) ^ (((step & MASK32) * STEP_MUL) & MASK32)
    x = ((x ^ (x >> 16)) * MIX_MUL) & MASK32
    x = ((x ^ (x >> 16)) * MIX_MUL) & MASK32
    x = x ^ (x >> 16)
    return (x >> UNIFORM_SHIFT).to(tl.float32) * UNIFORM_SCALE


@jit
def request_block(
    start: tl.tensor,
    query_start_loc_ptr: tl.tensor,
    cu_num_logits_ptr: tl.tensor,
    idx_mapping_ptr: tl.tensor,
    seq_lens_ptr: tl.tensor,
    prefill_len_ptr: tl.tensor,
    depth_ptr: tl.tensor,
    step: tl.tensor,
    num_reqs: tl.tensor,
    explore: tl.tensor,
    deep: tl.tensor,
    K: tl.constexpr,
    BLOCK: tl.constexpr,
) -> tl.tuple:
    """Per-request facts of one block: rows, slot, n, drafts made, qe, and whether
    truncatable. Drafts made: n, or fewer where the drafter stopped early
    (``Buffers.depth``), for pure verify queries only. With ``deep`` (the depth
    decision is on) a step whose drafting explored (``_depth_kernel``'s key) verifies
    every draft of every request: the deep cells it grades would otherwise only be
    graded in the few requests that explore."""
    r = start + tl.arange(0, BLOCK)
    rmask = r < num_reqs
    slot = tl.load(idx_mapping_ptr + r, mask=rmask, other=0).to(tl.int64)
    c0 = tl.load(cu_num_logits_ptr + r, mask=rmask, other=0)
    c1 = tl.load(cu_num_logits_ptr + r + 1, mask=rmask, other=1)
    n = tl.minimum(tl.maximum(c1 - c0 - 1, 0), K)
    qs = tl.load(query_start_loc_ptr + r, mask=rmask, other=0)
    qe = tl.load(query_start_loc_ptr + r + 1, mask=rmask, other=0)
    seq_len = tl.load(seq_lens_ptr + r, mask=rmask, other=0)
    prefill_len = tl.load(prefill_len_ptr + slot, mask=rmask, other=0)
    # Only a pure verify query [t0, d1..dn] whose t0 lies past the prefill
    # may lose drafts: prompt, prefill-chunk and placeholder drafts stay.
    eligible = rmask & (n > 0) & (qe - qs == n + 1) & (seq_len - n - 1 >= prefill_len)
    explored = (explore_uniform(step, slot) < explore) | ((deep != 0) & (explore_uniform(step, DEPTH_KEY) < explore))
    depth = tl.load(depth_ptr + slot, mask=rmask, other=K)
    made = tl.where(eligible, tl.minimum(n, depth), n)
    return rmask, slot, n, made, qe, eligible, eligible & (~explored)


@jit
def _clamped(p: tl.tensor, k: tl.constexpr, n: tl.tensor) -> tl.tensor:
    # NaN says nothing: keep the draft. Clamp the rest into [0, 1] so survival
    # never grows with depth and "keep" is a prefix.
    return tl.where(
        # p != p: NaN, the only test Triton has
        (k >= n) | (p != p),  # noqa: PLR0124
        1.0,
        tl.minimum(tl.maximum(p, 0.0), 1.0),
    )


@jit
def _halves(w: tl.tensor) -> tl.tuple:
    """The two fp32 of an int64 word, the lower address first (little endian)."""
    lo = w.to(tl.int32).to(tl.float32, bitcast=True)
    hi = (w >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    return lo, hi


@jit
def _row_predictions(
    pred_ptr: tl.tensor,
    slot: tl.tensor,
    pred_stride: tl.tensor,
    n: tl.tensor,
    K: tl.constexpr,
    VEC: tl.constexpr,
) -> tl.tuple:
    """A K-tuple of [BLOCK] vectors: each request's row of predictions, read
    VEC floats per load. Slots are scattered, so every load of a warp touches
    up to 32 cache lines, which one SM's L1 serves a line at a time: fewer,
    wider loads, and none past a request's n drafts, are what scales (the
    launcher picks VEC from the row's alignment). What is not loaded reads 0
    and is dropped by ``_clamped``."""
    out: tl.tuple = ()
    if VEC == 1:
        for k in tl.static_range(K):
            out = out + (tl.load(pred_ptr + slot * pred_stride + k, mask=k < n, other=0.0),)
    else:
        words = pred_ptr.to(tl.pointer_type(tl.int64), bitcast=True)
        wrow = tl.multiple_of(slot * (pred_stride // 2), VEC // 2)
        if VEC == 2:
            for q in tl.static_range(K // 2):
                lo, hi = _halves(tl.load(words + wrow + q, mask=2 * q < n, other=0))
                out = out + (lo, hi)
        else:
            tl.static_assert(VEC == 4, "rows are read 1, 2 or 4 floats at a time")
            pair = tl.arange(0, 2)
            for q in tl.static_range(K // 4):
                quad = words + (wrow[:, None] + (2 * q + pair)[None, :])
                a, b = tl.split(tl.load(quad, mask=(4 * q < n)[:, None], other=0))
                a0, a1 = _halves(a)
                b0, b1 = _halves(b)
                out = out + (a0, a1, b0, b1)
    return out


@jit
def survivals(
    pred_ptr: tl.tensor,
    slot: tl.tensor,
    pred_stride: tl.tensor,
    n: tl.tensor,
    K: tl.constexpr,
    VEC: tl.constexpr,
) -> tl.tuple:
    """S_k of every draft position, a K-tuple of [BLOCK] vectors, multiplied
    in order in fp32 (positions past n multiply by 1). The loads come before
    any barrier, so all are in flight at once."""
    preds = _row_predictions(pred_ptr, slot, pred_stride, n, K, VEC)
    surv = _clamped(preds[0], 0, n)
    out: tl.tuple = (surv,)
    for k in tl.static_range(1, K):
        surv = surv * _clamped(preds[k], k, n)
        out = out + (surv,)
    return out


@jit
def _calibrated(hits_ptr: tl.tensor, counts_ptr: tl.tensor, k: tl.constexpr, K: tl.constexpr) -> tl.tensor:
    """Calibrated survival (``kiln_testkit.dt_cost.calibrated_values``) of the TAU_GRID cells of
    position k: each bin's drafts shrunk toward the middle of the bin with
    CAL_PRIOR pseudo-drafts."""
    cell = k * TAU_GRID + tl.arange(0, TAU_GRID)
    h = tl.load(hits_ptr + cell, mask=cell < K * TAU_GRID, other=0.0)
    c = tl.load(counts_ptr + cell, mask=cell < K * TAU_GRID, other=0.0)
    mid = ((cell % TAU_GRID).to(tl.float32) + 0.5) * (1.0 / TAU_GRID)
    return (h + CAL_PRIOR * mid) / (c + CAL_PRIOR)


@jit
def cost_aware_tau(
    surv: tl.tensor,
    rmask: tl.tensor,
    n: tl.tensor,
    truncated: tl.tensor,
    j_min: tl.tensor,
    num_tokens: tl.tensor,
    cost_ptr: tl.tensor,
    cost_max: tl.tensor,
    num_reqs: tl.tensor,
    t_fixed: tl.tensor,
    t_token: tl.tensor,
    other_ratio: tl.tensor,
    t_draft: tl.tensor,
    undrafted: tl.tensor,
    hits_ptr: tl.tensor,
    counts_ptr: tl.tensor,
    K: tl.constexpr,
    BLOCK_R: tl.constexpr,
) -> tl.tuple:
    """The tau of the grid that maximises expected tokens per unit of step
    time, each request's survival bins packed for grading, and that best ratio.
    ``n``: the drafts that exist (made), ``undrafted``: scheduled drafts the
    drafter never made (dead whatever tau is); ``t_draft``: the step's
    drafting time (the same for every candidate, so it only moves the rate a
    draft must beat).

    For any number x of optional drafts kept, keeping the x with the highest
    survival maximises expected accepted tokens; survival falls with depth, so
    those x form a prefix of every request, i.e. a threshold on S. So the
    search is over thresholds g / TAU_GRID. Draft survivals are binned by
    floor(S * TAU_GRID) (exact: TAU_GRID is a power of two), so candidate g
    keeps exactly the optional drafts of bins >= g. Each optional draft kept
    adds to the expected tokens its calibrated survival: the acceptance rate
    measured so far in its (position, bin) cell, which is the bin's middle
    until grades arrive. Live tokens are priced with the routed-cost table; the best ratio
    wins, the smallest tau on ties, so when cutting buys nothing nothing is cut.

    Every histogram synchronises the CTA, so all loads are issued first.
    One histogram per position, not one of K * TAU_GRID cells for all of
    them: fewer barriers, but Triton's histogram spends log2(cells) ballots
    and cells / 32 popcounts on every element, which costs more than the
    barriers save (measured: docs/draft-trunc-bench.md, "Kernel choices").
    """
    # Loads first (the rates, the batch's token count, the full-batch cost):
    # nothing below waits on them until the histograms are done.
    rates: tl.tuple = ()
    for k in tl.static_range(K):
        rates = rates + (_calibrated(hits_ptr, counts_ptr, k, K),)
    t_all = tl.load(cost_ptr + tl.minimum(num_tokens, cost_max))
    forced = tl.zeros([BLOCK_R], tl.float32)
    packed = tl.zeros([BLOCK_R], tl.int64)
    cells: tl.tuple = ()
    for k in tl.static_range(K):
        in_n = rmask & (k < n)
        opt = truncated & in_n & (k >= j_min)
        bins = tl.minimum((surv[k] * TAU_GRID).to(tl.int32), TAU_GRID - 1)
        if k < CAL_DEPTH:
            packed = packed | (bins.to(tl.int64) << (BIN_BITS * k))
        cells = cells + (tl.where(opt, bins, -1),)  # -1: stays whatever tau is
        # Drafts that stay whatever tau is only shift every candidate's tokens
        # alike: they count their raw survival. Calibrating them too takes two
        # gathers per position and barely moves the simulated speed
        # (docs/draft-trunc-bench.md, "Kernel choices").
        forced += tl.where(in_n & (~opt), surv[k], 0.0)
    # the barriers come only now, back to back, one histogram per position
    counts = tl.zeros([TAU_GRID], tl.int32)
    worth = tl.zeros([TAU_GRID], tl.float32)
    for k in tl.static_range(K):
        in_bin = tl.histogram(cells[k], TAU_GRID, mask=cells[k] >= 0)
        counts += in_bin
        worth += in_bin.to(tl.float32) * rates[k]
    kept = tl.cumsum(counts, 0, reverse=True)
    gain = tl.cumsum(worth, 0, reverse=True)
    # every optional draft falls in some bin: their count is the histograms' total
    live = num_tokens - undrafted - tl.sum(counts, axis=0) + kept
    t_live = tl.load(cost_ptr + tl.minimum(tl.maximum(live, 0), cost_max))
    t_shared = t_fixed + t_token * num_tokens.to(tl.float32)
    t_other = other_ratio * (t_all + t_shared)
    # Every scheduled request yields one token besides its accepted drafts.
    tokens = num_reqs.to(tl.float32) + tl.sum(forced, axis=0) + gain
    ratio = tokens / (t_shared + t_other + t_draft + t_live)
    best = tl.argmax(ratio, axis=0)
    return best.to(tl.float32) * (1.0 / TAU_GRID), packed, tl.max(ratio, axis=0)
