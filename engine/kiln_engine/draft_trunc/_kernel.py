"""The one Triton kernel behind ``mark_dead``, with both truncation policies.

Imported lazily by the package: it needs torch and triton, which a CPU vLLM
image may lack.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, Protocol, cast, overload

import torch
import triton
import triton.language as tl

from . import _cost


class JitFunction(Protocol):
    """What kiln uses of a ``@triton.jit`` function: a launch (``fn[grid](...)``) and,
    inside other kernels, a call. Triton ships no type information, so mypy sees
    its decorator through ``jit`` below; inside kernels ``tl.*`` stays unchecked."""

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]: ...

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


@overload
def jit(fn: Callable[..., Any]) -> JitFunction: ...


@overload
def jit(*, do_not_specialize: Iterable[str]) -> Callable[[Callable[..., Any]], JitFunction]: ...


def jit(
    fn: Callable[..., Any] | None = None, *, do_not_specialize: Iterable[str] | None = None
) -> JitFunction | Callable[[Callable[..., Any]], JitFunction]:
    """``triton.jit`` (with ``do_not_specialize`` when given), typed for mypy: used
    bare it returns a ``JitFunction``, with keywords the decorator."""

    def decorate(kernel: Callable[..., Any]) -> JitFunction:
        if do_not_specialize is None:
            return cast(JitFunction, triton.jit(kernel))
        return cast(JitFunction, triton.jit(kernel, do_not_specialize=list(do_not_specialize)))

    return decorate if fn is None else decorate(fn)

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


# ``Buffers.depth`` of a request whose drafting was not cut short.
UNCAPPED = 1 << 30
# The exploration key of the drafting depth (per step, not per slot): past any slot.
DEPTH_KEY = tl.constexpr(0xFFFFFFFF)


class MarkInputs(NamedTuple):
    """One step's batch as the runner holds it, in the kernel's argument order:
    the launch passes it unpacked (a Triton kernel takes flat pointers)."""

    is_padding: torch.Tensor  # [>= num_tokens] bool, persistent, written in place
    query_start_loc: torch.Tensor  # [num_reqs + 1] int32
    cu_num_logits: torch.Tensor  # [num_reqs + 1] int32
    idx_mapping: torch.Tensor  # [num_reqs] int64, batch -> request slot
    seq_lens: torch.Tensor  # [num_reqs] int32, batch order
    prefill_len: torch.Tensor  # [max_num_reqs] int32, by slot
    predictions: torch.Tensor  # [max_num_reqs, K] fp32, by slot


class Buffers(NamedTuple):
    """What the kernel writes by request slot, plus its step counter and the tau
    it used: persistent (allocated once per device and size, so that the kernel
    never allocates and a captured graph keeps its addresses), in the kernel's
    argument order."""

    live: torch.Tensor  # [max_num_reqs] int32: kept draft count j
    expected: torch.Tensor  # [max_num_reqs] fp32: E[A_j]
    step: torch.Tensor  # [1] int64: launches so far (keys the exploration)
    tau: torch.Tensor  # [1] fp32: the tau the last launch used
    # [max_num_reqs] int32, by slot: positions the drafter made for the request's
    # drafts in flight (``stop_drafting``); scheduled drafts past it are dead.
    # UNCAPPED where drafting ran its course.
    depth: torch.Tensor

    @staticmethod
    def allocate(max_num_reqs: int, device: torch.device) -> Buffers:
        return Buffers(
            torch.zeros(max_num_reqs, dtype=torch.int32, device=device),
            torch.zeros(max_num_reqs, dtype=torch.float32, device=device),
            torch.zeros(1, dtype=torch.int64, device=device),
            torch.zeros(1, dtype=torch.float32, device=device),
            torch.full((max_num_reqs,), UNCAPPED, dtype=torch.int32, device=device),
        )


class CostInputs(NamedTuple):
    """What the cost-aware policy reads: the live-token cost table (device,
    persistent) and the per-token/fixed routed time and non-routed ratio."""

    table: torch.Tensor
    t_fixed: float
    t_token: float
    other_ratio: float
    t_draft: float = 0.0  # this step's drafting time, in the table's units (issue 37)


class Calibration(NamedTuple):
    """The estimator's online calibration (device, persistent; its numpy twin is
    ``kiln_testkit.dt_cost.calibrated_values``). Cell ``k * TAU_GRID + b``: drafts at position
    k whose predicted survival fell in bin b; the last cell is a sink for
    drafts nobody grades. ``bins`` [max_num_reqs] int64, by slot: the bins of
    a request's drafts at marking time, ``BIN_BITS`` each from the lowest
    (-1: not a pure verify query, nothing to grade), for ``graded`` to file
    the outcomes under."""

    hits: torch.Tensor  # [K * TAU_GRID + 1] fp32
    counts: torch.Tensor  # [K * TAU_GRID + 1] fp32
    bins: torch.Tensor  # [max_num_reqs] int64

    @staticmethod
    def allocate(max_num_reqs: int, k: int, device: torch.device) -> Calibration:
        size = k * _cost.TAU_GRID + 1
        return Calibration(
            torch.zeros(size, dtype=torch.float32, device=device),
            torch.zeros(size, dtype=torch.float32, device=device),
            torch.full((max_num_reqs,), -1, dtype=torch.int64, device=device),
        )


@jit
def _explore_uniform(step: tl.tensor, slot: tl.tensor) -> tl.tensor:
    """Uniform in [0, 1) keyed by (step, slot); identical on every TP rank."""
    x = (slot & MASK32) ^ (((step & MASK32) * STEP_MUL) & MASK32)
    x = ((x ^ (x >> 16)) * MIX_MUL) & MASK32
    x = ((x ^ (x >> 16)) * MIX_MUL) & MASK32
    x = x ^ (x >> 16)
    return (x >> UNIFORM_SHIFT).to(tl.float32) * UNIFORM_SCALE


@jit
def _request_block(
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
    explored = (_explore_uniform(step, slot) < explore) | (
        (deep != 0) & (_explore_uniform(step, DEPTH_KEY) < explore))
    depth = tl.load(depth_ptr + slot, mask=rmask, other=K)
    made = tl.where(eligible, tl.minimum(n, depth), n)
    return rmask, slot, n, made, qe, eligible, eligible & (~explored)


@jit
def _clamped(p: tl.tensor, k: tl.constexpr, n: tl.tensor) -> tl.tensor:
    # NaN says nothing: keep the draft. Clamp the rest into [0, 1] so survival
    # never grows with depth and "keep" is a prefix.
    return tl.where((k >= n) | (p != p), 1.0, tl.minimum(tl.maximum(p, 0.0), 1.0))


@jit
def _halves(w: tl.tensor) -> tl.tuple:
    """The two fp32 of an int64 word, the lower address first (little endian)."""
    lo = w.to(tl.int32).to(tl.float32, bitcast=True)
    hi = (w >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    return lo, hi


@jit
def _row_predictions(
    pred_ptr: tl.tensor, slot: tl.tensor, pred_stride: tl.tensor, n: tl.tensor,
    K: tl.constexpr, VEC: tl.constexpr,
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
def _survivals(
    pred_ptr: tl.tensor, slot: tl.tensor, pred_stride: tl.tensor, n: tl.tensor,
    K: tl.constexpr, VEC: tl.constexpr,
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
def _cost_aware_tau(
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


@jit(
    do_not_specialize=[
        "num_reqs",
        "tau",
        "min_keep",
        "explore",
        "deep",
        "cost_max",
        "t_fixed",
        "t_token",
        "other_ratio",
        "t_draft",
    ]
)
def _mark_dead_kernel(
    is_padding_ptr: tl.tensor,  # [>= num_tokens] bool, persistent, written in place
    query_start_loc_ptr: tl.tensor,  # [num_reqs + 1] int32
    cu_num_logits_ptr: tl.tensor,  # [num_reqs + 1] int32
    idx_mapping_ptr: tl.tensor,  # [num_reqs] int64, batch -> request slot
    seq_lens_ptr: tl.tensor,  # [num_reqs] int32, batch order
    prefill_len_ptr: tl.tensor,  # [max_num_reqs] int32, by slot
    pred_ptr: tl.tensor,  # [max_num_reqs, K] fp32, by slot
    pred_stride: tl.tensor,
    live_ptr: tl.tensor,  # [max_num_reqs] int32, by slot: kept draft count j
    expected_ptr: tl.tensor,  # [max_num_reqs] fp32, by slot: E[A_j]
    step_ptr: tl.tensor,  # [1] int64, bumped by this kernel
    tau_ptr: tl.tensor,  # [1] fp32: the tau this step used
    cost_ptr: tl.tensor,  # [cost_max + 1] fp32: live-token part of routed time (COST only)
    cost_max: tl.tensor,
    hits_ptr: tl.tensor,  # [K * TAU_GRID + 1] fp32: calibration (COST only)
    counts_ptr: tl.tensor,  # [K * TAU_GRID + 1] fp32
    bins_ptr: tl.tensor,  # [max_num_reqs] int64, by slot: packed survival bins (COST only)
    depth_ptr: tl.tensor,  # [max_num_reqs] int32, by slot: positions drafted (Buffers.depth)
    num_reqs: tl.tensor,
    tau: tl.tensor,
    min_keep: tl.tensor,
    explore: tl.tensor,
    deep: tl.tensor,  # 1: the depth decision is on (its exploring steps verify everything)
    t_fixed: tl.tensor,
    t_token: tl.tensor,
    other_ratio: tl.tensor,
    t_draft: tl.tensor,
    K: tl.constexpr,
    BLOCK_R: tl.constexpr,
    COST: tl.constexpr,
    VEC: tl.constexpr,
) -> None:
    # One program walks the whole batch: the step counter is read once and
    # bumped at the end without a race, and a verify batch is small enough
    # (<= a few thousand requests) that one CTA finishes in microseconds.
    # With COST the launcher makes BLOCK_R cover the batch, so the loop runs
    # once and tau is chosen from the whole batch before any draft is marked.
    step = tl.load(step_ptr)
    for start in range(0, num_reqs, BLOCK_R):
        rmask, slot, n, made, qe, eligible, truncated = _request_block(
            start,
            query_start_loc_ptr,
            cu_num_logits_ptr,
            idx_mapping_ptr,
            seq_lens_ptr,
            prefill_len_ptr,
            depth_ptr,
            step,
            num_reqs,
            explore,
            deep,
            K,
            BLOCK_R,
        )
        # Only drafts the drafter made count: past ``made`` the predictions are
        # a previous round's and the tokens placeholders, dead whatever tau is.
        j_min = tl.minimum(made, min_keep)
        surv = _survivals(pred_ptr, slot, pred_stride, made, K, VEC)
        if COST:
            num_tokens = tl.load(query_start_loc_ptr + num_reqs)
            undrafted = tl.sum(tl.where(rmask, n - made, 0), axis=0)
            tau, packed, _ = _cost_aware_tau(
                surv,
                rmask,
                made,
                truncated,
                j_min,
                num_tokens,
                cost_ptr,
                cost_max,
                num_reqs,
                t_fixed,
                t_token,
                other_ratio,
                t_draft,
                undrafted,
                hits_ptr,
                counts_ptr,
                K,
                BLOCK_R,
            )
        j_rule = tl.zeros([BLOCK_R], tl.int32)
        e_rule = tl.zeros([BLOCK_R], tl.float32)
        e_min = tl.zeros([BLOCK_R], tl.float32)
        e_all = tl.zeros([BLOCK_R], tl.float32)
        for k in tl.static_range(K):
            in_n = rmask & (k < made)
            keep = in_n & (surv[k] >= tau)
            j_rule += keep.to(tl.int32)
            s = tl.where(in_n, surv[k], 0.0)
            e_rule += tl.where(keep, s, 0.0)
            e_min += tl.where(k < j_min, s, 0.0)
            e_all += s
        if COST:
            # Graded later (``graded``) if verified: pure verify queries only,
            # explored or not.
            tl.store(bins_ptr + slot, tl.where(eligible, packed, -1), mask=rmask)
        j = tl.where(truncated, tl.maximum(j_rule, j_min), made)
        expected = tl.where(truncated, tl.where(j_rule >= j_min, e_rule, e_min), e_all)
        tl.store(live_ptr + slot, j, mask=rmask)
        tl.store(expected_ptr + slot, expected, mask=rmask)
        # Draft d_{k+1} sits at query row qe - n + k; rows k >= j are dead
        # (j = n for queries that are not pure verify queries: nothing is).
        for k in tl.static_range(K):
            dead = eligible & (k >= j) & (k < n)
            tl.store(is_padding_ptr + (qe - n + k), tl.full([BLOCK_R], 1, tl.int1), mask=dead)
    tl.store(tau_ptr, tau)
    tl.store(step_ptr, step + 1)


# The cost-aware launch keeps the whole batch in one block; past this many
# requests the launcher verifies every draft instead (on the fitted H200 model
# nothing is worth cutting at that load anyway).
MAX_COST_REQS = 4096


def row_vector(predictions: torch.Tensor) -> int:
    """How many predictions one load may read: 4 or 2 where every row starts
    on a 16- or 8-byte boundary and holds a whole number of such vectors."""
    stride, k = predictions.stride(0), predictions.shape[1]
    for vec in (4, 2):
        aligned = predictions.data_ptr() % (4 * vec) == 0 and stride % vec == 0
        if aligned and k % vec == 0 and predictions.stride(1) == 1:
            return vec
    return 1


def launch_vector(predictions: torch.Tensor, block_r: int, num_warps: int) -> int:
    """``row_vector``, where the block gives every thread its own requests:
    with fewer requests than threads (e.g. 64 requests, 4 warps) the wide
    loads' layout is replicated and converting it back costs more than it
    saves (docs/draft-trunc-bench.md, "Kernel choices")."""
    return row_vector(predictions) if block_r >= 32 * num_warps else 1


def launch_mark_dead(
    inputs: MarkInputs,
    buffers: Buffers,
    num_reqs: int,
    tau: float,
    min_keep: int,
    explore: float,
    cost: CostInputs | None = None,
    num_warps: int | None = None,
    calibration: Calibration | None = None,
    deep: bool = False,
) -> None:
    """Launch the kernel: no allocation, no host sync, capturable.

    ``cost`` switches on the cost-aware policy; ``tau`` is then ignored and the
    chosen one lands in ``buffers.tau``. It prices drafts with ``calibration``
    (required with ``cost``) and files each draft's cell there for ``graded``.
    ``num_warps`` overrides the launch shape (benchmarks).
    """
    predictions = inputs.predictions
    if cost is not None and num_reqs > MAX_COST_REQS:
        cost, tau = None, 0.0
    block_r = max(64, triton.next_power_of_2(max(num_reqs, 1)))
    if cost is None:
        block_r = min(block_r, 1024)
        if num_warps is None:
            num_warps = 1 if block_r < 256 else 4
        # Without the cost policy the table and calibration pointers are never
        # read: any device tensors do.
        table = buffers.tau
        cal = Calibration(buffers.tau, buffers.tau, buffers.step)
        cost_scalars = (0.0, 0.0, 0.0, 0.0)
    else:
        if calibration is None:
            raise ValueError("the cost-aware policy needs a Calibration")
        # The cost pass's histograms want more warps as the block grows
        # (bench_policy.py's launch-shape sweep: docs/draft-trunc-bench.md).
        if num_warps is None:
            num_warps = 4 if block_r <= 128 else (8 if block_r == 256 else 16)
        table, cal = cost.table, calibration
        cost_scalars = (cost.t_fixed, cost.t_token, cost.other_ratio, cost.t_draft)
    _mark_dead_kernel[(1,)](
        *inputs,
        predictions.stride(0),
        buffers.live,
        buffers.expected,
        buffers.step,
        buffers.tau,
        table,
        table.shape[0] - 1,
        *cal,
        buffers.depth,
        num_reqs,
        float(tau),
        int(min_keep),
        float(explore),
        int(deep),
        *cost_scalars,
        K=predictions.shape[1],
        BLOCK_R=block_r,
        COST=cost is not None,
        VEC=launch_vector(predictions, block_r, num_warps),
        num_warps=num_warps,
    )


@jit(
    do_not_specialize=[
        "num_reqs", "drafted", "scheduled", "min_keep", "explore", "cost_max", "t_fixed",
        "t_token", "other_ratio", "t_first", "t_pos",
    ]
)
def _depth_kernel(
    go_ptr: tl.tensor,  # [1] int32 out: 1 = draft on
    idx_mapping_ptr: tl.tensor,  # [num_reqs] int64, batch -> request slot
    pred_ptr: tl.tensor,  # [max_num_reqs, K] fp32, by slot: written for positions < drafted
    pred_stride: tl.tensor,
    step_ptr: tl.tensor,  # [1] int64: mark_dead's launch counter (its next key)
    cost_ptr: tl.tensor,
    cost_max: tl.tensor,
    hits_ptr: tl.tensor,
    counts_ptr: tl.tensor,
    num_reqs: tl.tensor,
    drafted: tl.tensor,  # positions drafted so far (>= 1)
    scheduled: tl.tensor,  # drafts each request will verify next step
    min_keep: tl.tensor,
    explore: tl.tensor,
    t_fixed: tl.tensor,
    t_token: tl.tensor,
    other_ratio: tl.tensor,
    t_first: tl.tensor,  # drafting time of one position (the first pass), table units
    t_pos: tl.tensor,  # ... of each further position
    K: tl.constexpr,
    BLOCK_R: tl.constexpr,
    VEC: tl.constexpr,
) -> None:
    """Whether drafting goes on (``kiln_testkit.dt_cost.depth_continue`` in numpy): the
    next verify step priced at its best tau for every depth from here to the last
    scheduled draft, the drafts not made yet entering at their request's last
    survival (an upper bound), worth their (position, bin) cell; go on where a
    deeper depth beats stopping now. Requests the next mark_dead lets explore keep
    every draft, as there; a share ``explore`` of steps drafts (and verifies, in
    mark_dead) to the end whatever the prices say, so deep cells keep being graded."""
    step = tl.load(step_ptr)
    r = tl.arange(0, BLOCK_R)
    rmask = r < num_reqs
    slot = tl.load(idx_mapping_ptr + r, mask=rmask, other=0).to(tl.int64)
    n = tl.where(rmask, scheduled, 0)
    truncated = rmask & (_explore_uniform(step, slot) >= explore)
    # positions >= drafted are not loaded and multiply by 1: they keep S_{drafted-1}
    surv = _survivals(pred_ptr, slot, pred_stride, tl.minimum(n, drafted), K, VEC)
    num_tokens = num_reqs * (1 + scheduled)
    made = tl.minimum(n, drafted)
    _, _, stop = _cost_aware_tau(
        surv, rmask, made, truncated, tl.minimum(made, min_keep), num_tokens, cost_ptr,
        cost_max, num_reqs, t_fixed, t_token, other_ratio, t_first + t_pos * (drafted - 1),
        tl.sum(n - made, axis=0), hits_ptr, counts_ptr, K, BLOCK_R,
    )
    deeper = stop * 0.0 - 1.0
    for d in tl.static_range(2, K + 1):
        more = tl.minimum(n, d)
        _, _, ratio = _cost_aware_tau(
            surv, rmask, more, truncated, tl.minimum(more, min_keep), num_tokens, cost_ptr,
            cost_max, num_reqs, t_fixed, t_token, other_ratio, t_first + t_pos * (d - 1),
            tl.sum(n - more, axis=0), hits_ptr, counts_ptr, K, BLOCK_R,
        )
        deeper = tl.where((d > drafted) & (d <= scheduled), tl.maximum(deeper, ratio), deeper)
    deep = _explore_uniform(step, DEPTH_KEY) < explore
    tl.store(go_ptr, ((deeper > stop) | deep).to(tl.int32))


def launch_depth(
    go: torch.Tensor,
    idx_mapping: torch.Tensor,
    predictions: torch.Tensor,
    buffers: Buffers,
    cost: CostInputs,
    calibration: Calibration,
    num_reqs: int,
    drafted: int,
    scheduled: int,
    min_keep: int,
    explore: float,
    t_first: float,
    t_pos: float,
) -> None:
    """Launch the depth decision (one program; writes ``go`` on the device).
    Drafting d >= 1 positions costs t_first + t_pos (d - 1) in the table's units."""
    block_r = max(64, triton.next_power_of_2(max(num_reqs, 1)))
    num_warps = 4 if block_r <= 128 else (8 if block_r == 256 else 16)
    _depth_kernel[(1,)](
        go, idx_mapping, predictions, predictions.stride(0), buffers.step, cost.table,
        cost.table.shape[0] - 1, calibration.hits, calibration.counts, num_reqs, drafted,
        scheduled, int(min_keep), float(explore), cost.t_fixed, cost.t_token, cost.other_ratio,
        float(t_first), float(t_pos),
        K=predictions.shape[1], BLOCK_R=block_r,
        VEC=launch_vector(predictions, block_r, num_warps), num_warps=num_warps,
    )
