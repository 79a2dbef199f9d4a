"""Pure-PyTorch/Python reference of draft_trunc's rule, written from the spec.

Deliberately a per-request loop: it restates the contract in the plainest way
so the Triton kernel can be checked against it.
"""

from __future__ import annotations

import math

import torch

_M32 = 0xFFFFFFFF


def explore_uniform(step: int, slot: int) -> float:
    x = (slot & _M32) ^ (((step & _M32) * 0x6D2B79F5) & _M32)
    x = ((x ^ (x >> 16)) * 0x045D9F3B) & _M32
    x = ((x ^ (x >> 16)) * 0x045D9F3B) & _M32
    x ^= x >> 16
    return float(x >> 8) / 16777216.0


def _f32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32))


def kept_drafts(preds: list[float], n: int, tau: float, min_keep: int) -> tuple[int, float]:
    """j = max{m in [j_min, n] : S_m >= tau} and E[A_j] = sum_{m<=j} S_m."""
    surv, survs = 1.0, []
    for m in range(n):
        p = preds[m]
        p = 1.0 if math.isnan(p) else min(max(p, 0.0), 1.0)
        surv = _f32(surv * p)  # the kernel multiplies in fp32
        survs.append(surv)
    j_min = min(n, min_keep)
    j = j_min
    for m in range(n, j_min, -1):
        if survs[m - 1] >= _f32(tau):
            j = m
            break
    return j, sum(survs[:j])


def mark_dead_ref(
    is_padding: torch.Tensor,
    query_start_loc: torch.Tensor,
    cu_num_logits: torch.Tensor,
    idx_mapping: torch.Tensor,
    seq_lens: torch.Tensor,
    prefill_len: torch.Tensor,
    predictions: torch.Tensor,
    live: torch.Tensor,
    expected: torch.Tensor,
    step: int,
    num_reqs: int,
    tau: float,
    min_keep: int,
    explore: float,
) -> None:
    """Same effect as one mark_dead kernel launch, on CPU tensors, in place."""
    K = predictions.shape[1]
    for r in range(num_reqs):
        slot = int(idx_mapping[r])
        n = min(max(int(cu_num_logits[r + 1] - cu_num_logits[r]) - 1, 0), K)
        qs, qe = int(query_start_loc[r]), int(query_start_loc[r + 1])
        eligible = n > 0 and qe - qs == n + 1 and int(seq_lens[r]) - n - 1 >= int(prefill_len[slot])
        explored = explore_uniform(step, slot) < _f32(explore)
        preds = [float(x) for x in predictions[slot, :n]]
        if eligible and not explored:
            j, e = kept_drafts(preds, n, tau, min_keep)
            for k in range(j, n):
                is_padding[qe - n + k] = True
        else:
            j, e = n, kept_drafts(preds, n, 0.0, n)[1]
        live[slot] = j
        expected[slot] = e


def verify_mask_ref(live, cu_num_logits, idx_mapping) -> torch.Tensor:
    """Row c0+i holds draft d_i; it is invalid when i > j of its request."""
    rows = []
    for r in range(idx_mapping.shape[0]):
        j = int(live[int(idx_mapping[r])])
        count = int(cu_num_logits[r + 1] - cu_num_logits[r])
        rows += [i > j for i in range(count)]
    return torch.tensor(rows, dtype=torch.bool)
