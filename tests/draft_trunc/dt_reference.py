"""Pure-PyTorch/Python reference of draft_trunc's rule, written from the spec.

Deliberately a per-request loop: it restates the contract in the plainest way
so the Triton kernel can be checked against it.
"""

from __future__ import annotations

import math

import torch
from kiln_engine.draft_trunc._kernels import device_functions as kernel

_M32 = kernel.MASK32.value
_STEP_MUL = kernel.STEP_MUL.value
_MIX_MUL = kernel.MIX_MUL.value
TAU_GRID = kernel.TAU_GRID.value
CAL_PRIOR = kernel.CAL_PRIOR.value


def explore_uniform(step: int, slot: int) -> float:
    x = (slot & _M32) ^ (((step & _M32) * _STEP_MUL) & _M32)
    x = ((x ^ (x >> 16)) * _MIX_MUL) & _M32
    x = ((x ^ (x >> 16)) * _MIX_MUL) & _M32
    x ^= x >> 16
    return float(x >> kernel.UNIFORM_SHIFT.value) * kernel.UNIFORM_SCALE.value


def _f32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32))


def survivals(preds: list[float], n: int) -> list[float]:
    surv, out = 1.0, []
    for m in range(n):
        p = preds[m]
        p = 1.0 if math.isnan(p) else min(max(p, 0.0), 1.0)
        surv = _f32(surv * p)  # the kernel multiplies in fp32
        out.append(surv)
    return out


def kept_drafts(preds: list[float], n: int, tau: float, min_keep: int) -> tuple[int, float]:
    """j = max{m in [j_min, n] : S_m >= tau} and E[A_j] = sum_{m<=j} S_m."""
    survs = survivals(preds, n)
    j_min = min(n, min_keep)
    j = j_min
    for m in range(n, j_min, -1):
        if survs[m - 1] >= _f32(tau):
            j = m
            break
    return j, sum(survs[:j])


def _request(
    r,
    query_start_loc,
    cu_num_logits,
    idx_mapping,
    seq_lens,
    prefill_len,
    # K as vLLM's reference names it
    K,  # noqa: N803
    step,
    explore,
):
    """slot, n, qe and whether request r may lose drafts this step."""
    slot = int(idx_mapping[r])
    n = min(max(int(cu_num_logits[r + 1] - cu_num_logits[r]) - 1, 0), K)
    qs, qe = int(query_start_loc[r]), int(query_start_loc[r + 1])
    eligible = n > 0 and qe - qs == n + 1 and int(seq_lens[r]) - n - 1 >= int(prefill_len[slot])
    explored = explore_uniform(step, slot) < _f32(explore)
    return slot, n, qe, eligible and not explored


def cost_aware_ratios(
    query_start_loc,
    cu_num_logits,
    idx_mapping,
    seq_lens,
    prefill_len,
    predictions,
    step,
    num_reqs,
    min_keep,
    explore,
    table,
    t_fixed,
    t_token,
    other_ratio,
    calibration=None,
) -> list[float]:
    """Expected tokens per unit of step time at each candidate tau g / TAU_GRID.

    Written as the spec reads: keep, in every truncatable request, the drafts
    past min_keep whose survival reaches tau; every other live draft counts
    its survival, and a kept optional draft its calibrated survival,
    (hits + CAL_PRIOR * mid) / (counts + CAL_PRIOR) of its cell (position k,
    bin b of its survival; mid the middle of that bin), from ``calibration``
    (a ``Calibration``; None: no grades yet, i.e. mid).
    """
    hits = counts = None
    if calibration is not None:
        hits = [float(x) for x in calibration.hits.cpu()]
        counts = [float(x) for x in calibration.counts.cpu()]

    def worth(k: int, s: float) -> float:
        b = min(math.floor(s * TAU_GRID), TAU_GRID - 1)
        mid = (b + 0.5) / TAU_GRID
        if hits is None:
            return mid
        cell = k * TAU_GRID + b
        return (hits[cell] + CAL_PRIOR * mid) / (counts[cell] + CAL_PRIOR)

    num_tokens = int(query_start_loc[num_reqs])
    table = [float(x) for x in table]
    cap = len(table) - 1
    shared = t_fixed + t_token * num_tokens
    other = other_ratio * (table[min(num_tokens, cap)] + shared)
    ratios = []
    for g in range(TAU_GRID):
        tau = g / TAU_GRID
        tokens, dead = float(num_reqs), 0
        for r in range(num_reqs):
            slot, n, _, truncatable = _request(
                r,
                query_start_loc,
                cu_num_logits,
                idx_mapping,
                seq_lens,
                prefill_len,
                predictions.shape[1],
                step,
                explore,
            )
            survs = survivals([float(x) for x in predictions[slot, :n]], n)
            for m, s in enumerate(survs):
                if not (truncatable and m >= min(n, min_keep)):
                    tokens += s
                elif s < tau:
                    dead += 1
                else:
                    tokens += worth(m, s)
        live = min(max(num_tokens - dead, 0), cap)
        ratios.append(tokens / (shared + other + table[live]))
    return ratios


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
    for r in range(num_reqs):
        slot, n, qe, truncatable = _request(
            r,
            query_start_loc,
            cu_num_logits,
            idx_mapping,
            seq_lens,
            prefill_len,
            predictions.shape[1],
            step,
            explore,
        )
        preds = [float(x) for x in predictions[slot, :n]]
        if truncatable:
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
