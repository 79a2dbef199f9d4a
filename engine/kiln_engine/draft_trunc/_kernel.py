"""The one Triton kernel behind ``mark_dead``.

Imported lazily by the package: it needs torch and triton, which a CPU vLLM
image may lack.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Exploration hash: a small integer mixer. Every multiplier is below 2**31 and
# every operand below 2**32, so products fit in int64 both on the GPU and in
# the interpreter (numpy), and the two agree bit for bit.
_MASK32 = 0xFFFFFFFF
_STEP_MUL = 0x6D2B79F5
_MIX_MUL = 0x045D9F3B


@triton.jit
def _explore_uniform(step, slot):
    """Uniform in [0, 1) keyed by (step, slot); identical on every TP rank."""
    x = (slot & 0xFFFFFFFF) ^ (((step & 0xFFFFFFFF) * 0x6D2B79F5) & 0xFFFFFFFF)
    x = ((x ^ (x >> 16)) * 0x045D9F3B) & 0xFFFFFFFF
    x = ((x ^ (x >> 16)) * 0x045D9F3B) & 0xFFFFFFFF
    x = x ^ (x >> 16)
    # 24 bits convert to fp32 exactly, so the comparison is reproducible.
    return (x >> 8).to(tl.float32) * (1.0 / 16777216.0)


@triton.jit(do_not_specialize=["num_reqs", "tau", "min_keep", "explore"])
def _mark_dead_kernel(
    is_padding_ptr,  # [>= num_tokens] bool, persistent, written in place
    query_start_loc_ptr,  # [num_reqs + 1] int32
    cu_num_logits_ptr,  # [num_reqs + 1] int32
    idx_mapping_ptr,  # [num_reqs] int64, batch -> request slot
    seq_lens_ptr,  # [num_reqs] int32, batch order
    prefill_len_ptr,  # [max_num_reqs] int32, by slot
    pred_ptr,  # [max_num_reqs, K] fp32, by slot
    pred_stride,
    live_ptr,  # [max_num_reqs] int32, by slot: kept draft count j
    expected_ptr,  # [max_num_reqs] fp32, by slot: E[A_j]
    step_ptr,  # [1] int64, bumped by this kernel
    num_reqs,
    tau,
    min_keep,
    explore,
    K: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    # One program walks the whole batch: the step counter is read once and
    # bumped at the end without a race, and a verify batch is small enough
    # (<= a few thousand requests) that one CTA finishes in microseconds.
    step = tl.load(step_ptr)
    for start in range(0, num_reqs, BLOCK_R):
        r = start + tl.arange(0, BLOCK_R)
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
        explored = _explore_uniform(step, slot) < explore

        surv = tl.full([BLOCK_R], 1.0, tl.float32)
        j_rule = tl.zeros([BLOCK_R], tl.int32)
        e_rule = tl.zeros([BLOCK_R], tl.float32)
        e_min = tl.zeros([BLOCK_R], tl.float32)
        e_all = tl.zeros([BLOCK_R], tl.float32)
        j_min = tl.minimum(n, min_keep)
        for k in tl.static_range(K):
            in_n = rmask & (k < n)
            p = tl.load(pred_ptr + slot * pred_stride + k, mask=in_n, other=1.0)
            # NaN says nothing: keep the draft. Clamp the rest into [0, 1] so
            # survival never grows with depth and "keep" is a prefix.
            p = tl.where(p != p, 1.0, tl.minimum(tl.maximum(p, 0.0), 1.0))
            surv = surv * p
            keep = in_n & (surv >= tau)
            j_rule += keep.to(tl.int32)
            s = tl.where(in_n, surv, 0.0)
            e_rule += tl.where(keep, s, 0.0)
            e_min += tl.where(k < j_min, s, 0.0)
            e_all += s
        truncated = eligible & (~explored)
        j = tl.where(truncated, tl.maximum(j_rule, j_min), n)
        expected = tl.where(truncated, tl.where(j_rule >= j_min, e_rule, e_min), e_all)
        tl.store(live_ptr + slot, j, mask=rmask)
        tl.store(expected_ptr + slot, expected, mask=rmask)
        # Draft d_{k+1} sits at query row qe - n + k; rows k >= j are dead.
        for k in tl.static_range(K):
            dead = truncated & (k >= j) & (k < n)
            tl.store(is_padding_ptr + (qe - n + k), tl.full([BLOCK_R], 1, tl.int1), mask=dead)
    tl.store(step_ptr, step + 1)


def launch_mark_dead(
    is_padding: torch.Tensor,
    query_start_loc: torch.Tensor,
    cu_num_logits: torch.Tensor,
    idx_mapping: torch.Tensor,
    seq_lens: torch.Tensor,
    prefill_len: torch.Tensor,
    predictions: torch.Tensor,
    live: torch.Tensor,
    expected: torch.Tensor,
    step: torch.Tensor,
    num_reqs: int,
    tau: float,
    min_keep: int,
    explore: float,
) -> None:
    """Launch the kernel: no allocation, no host sync, capturable."""
    num_spec = predictions.shape[1]
    block_r = max(64, min(1024, triton.next_power_of_2(max(num_reqs, 1))))
    _mark_dead_kernel[(1,)](
        is_padding,
        query_start_loc,
        cu_num_logits,
        idx_mapping,
        seq_lens,
        prefill_len,
        predictions,
        predictions.stride(0),
        live,
        expected,
        step,
        num_reqs,
        float(tau),
        int(min_keep),
        float(explore),
        K=num_spec,
        BLOCK_R=block_r,
        num_warps=4 if block_r >= 256 else 1,
    )
