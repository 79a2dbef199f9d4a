"""The two Triton kernels of draft_trunc and their launchers: ``mark_dead``'s
(both truncation policies) and the drafting depth decision's.

Imported lazily by the package: it needs torch and triton, which a CPU vLLM
image may lack.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .buffers import Buffers, Calibration, CostInputs, MarkInputs
from .device_functions import DEPTH_KEY, cost_aware_tau, explore_uniform, request_block, survivals
from .jit import jit


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
        rmask, slot, n, made, qe, eligible, truncated = request_block(
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
        surv = survivals(pred_ptr, slot, pred_stride, made, K, VEC)
        if COST:
            num_tokens = tl.load(query_start_loc_ptr + num_reqs)
            undrafted = tl.sum(tl.where(rmask, n - made, 0), axis=0)
            tau, packed, _ = cost_aware_tau(
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
        "num_reqs",
        "drafted",
        "scheduled",
        "min_keep",
        "explore",
        "cost_max",
        "t_fixed",
        "t_token",
        "other_ratio",
        "t_first",
        "t_pos",
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
    truncated = rmask & (explore_uniform(step, slot) >= explore)
    # positions >= drafted are not loaded and multiply by 1: they keep S_{drafted-1}
    surv = survivals(pred_ptr, slot, pred_stride, tl.minimum(n, drafted), K, VEC)
    num_tokens = num_reqs * (1 + scheduled)
    made = tl.minimum(n, drafted)
    _, _, stop = cost_aware_tau(
        surv,
        rmask,
        made,
        truncated,
        tl.minimum(made, min_keep),
        num_tokens,
        cost_ptr,
        cost_max,
        num_reqs,
        t_fixed,
        t_token,
        other_ratio,
        t_first + t_pos * (drafted - 1),
        tl.sum(n - made, axis=0),
        hits_ptr,
        counts_ptr,
        K,
        BLOCK_R,
    )
    deeper = stop * 0.0 - 1.0
    for d in tl.static_range(2, K + 1):
        more = tl.minimum(n, d)
        _, _, ratio = cost_aware_tau(
            surv,
            rmask,
            more,
            truncated,
            tl.minimum(more, min_keep),
            num_tokens,
            cost_ptr,
            cost_max,
            num_reqs,
            t_fixed,
            t_token,
            other_ratio,
            t_first + t_pos * (d - 1),
            tl.sum(n - more, axis=0),
            hits_ptr,
            counts_ptr,
            K,
            BLOCK_R,
        )
        deeper = tl.where((d > drafted) & (d <= scheduled), tl.maximum(deeper, ratio), deeper)
    deep = explore_uniform(step, DEPTH_KEY) < explore
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
        go,
        idx_mapping,
        predictions,
        predictions.stride(0),
        buffers.step,
        cost.table,
        cost.table.shape[0] - 1,
        calibration.hits,
        calibration.counts,
        num_reqs,
        drafted,
        scheduled,
        int(min_keep),
        float(explore),
        cost.t_fixed,
        cost.t_token,
        cost.other_ratio,
        float(t_first),
        float(t_pos),
        K=predictions.shape[1],
        BLOCK_R=block_r,
        VEC=launch_vector(predictions, block_r, num_warps),
        num_warps=num_warps,
    )
