"""The kernel's inputs and the device buffers it writes, by request slot.

Allocated once per device and size (``_state.prepare``) and reused, so that a
launch never allocates and a captured graph keeps its addresses. Needs torch only.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .. import _cost

# ``Buffers.depth`` of a request whose drafting was not cut short.
UNCAPPED = 1 << 30


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
    t_draft: float = 0.0  # this step's drafting time, in the table's units


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
