"""Device-side statistics of draft_trunc, flushed without blocking.

``StepStats.add`` only queues a few small device ops; every ``interval`` steps
the accumulator is copied to pinned host memory behind a CUDA event, and a later
step reports it once the event has completed, so the host never waits.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ._host_copy import start_host_copy
from ._metrics import FeatureCounters

logger = logging.getLogger("kiln_engine.draft_trunc")

# Order of the accumulator's columns.
FIELDS = (
    "proposed",  # drafts proposed, n
    "kept",  # drafts kept for verification, j
    "accepted",  # drafts accepted, a
    "predicted",  # estimator's E[A_j]
    "dead",  # dead tail tokens, n - j
    "wasted",  # kept but not accepted, j - a
    "boundary",  # requests with a = j < n: truncation may have cost tokens
    "requests",  # verifying requests
    "tokens",  # all scheduled tokens
    "steps",  # truncating steps folded in
    "graded",  # verified drafts graded into the cost policy's calibration
    "excluded",  # verified drafts kept out of it: target-only sampling (_tenant)
)
_IDX = {name: i for i, name in enumerate(FIELDS)}


@dataclass(frozen=True)
class Summary:
    """One flush: the totals of FIELDS since the previous one."""

    values: dict[str, float]
    top_k: int

    def counter_totals(self) -> dict[str, float]:
        """What the flush adds to each ``kiln_draft_trunc_*`` counter."""
        return {**self.values, "expert_slots_saved": self.values["dead"] * self.top_k}

    def line(self) -> str:
        v = self.values
        tokens = max(v["tokens"], 1.0)
        return (
            f"draft_trunc: steps={v['steps']:.0f} reqs={v['requests']:.0f} "
            f"proposed={v['proposed']:.0f} kept={v['kept']:.0f} accepted={v['accepted']:.0f} "
            f"predicted={v['predicted']:.1f} dead_frac={v['dead'] / tokens:.4f} "
            f"expert_slots_saved={v['dead'] * self.top_k:.0f} wasted_live={v['wasted']:.0f} "
            f"boundary_hits={v['boundary']:.0f} graded={v['graded']:.0f} "
            f"excluded={v['excluded']:.0f}"
        )


def _per_request(
    cu_num_logits: torch.Tensor,
    num_sampled: torch.Tensor,
    idx_mapping: torch.Tensor,
    live: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per verifying request of this step: drafts proposed n, kept j, accepted a, and
    the slots (masked entries carry slot -1 and read slot 0's j)."""
    num_reqs = idx_mapping.shape[0]
    cu = cu_num_logits[: num_reqs + 1]
    n = (cu[1:] - cu[:-1] - 1).clamp(min=0).float()
    slots = idx_mapping.long().clamp(min=0)
    j = live[slots].float()
    a = (num_sampled[:num_reqs].float() - 1.0).clamp(min=0.0)
    return n, j, a, slots


class Outcome(NamedTuple):
    """One request's verification: drafts proposed, kept, accepted."""

    proposed: int
    kept: int
    accepted: int


def step_outcomes(
    cu_num_logits: torch.Tensor,
    num_sampled: torch.Tensor,
    idx_mapping: torch.Tensor,
    live: torch.Tensor,
) -> list[Outcome]:
    """Each request's outcome, on the host (syncs: trace mode only)."""
    n, j, a, _ = _per_request(cu_num_logits, num_sampled, idx_mapping, live)
    rows: list[list[float]] = torch.stack((n, j, a), dim=1).tolist()
    return [Outcome(int(p), int(k), int(acc)) for p, k, acc in rows]


class StepStats:
    """The device-side accumulator; ``counters`` (None: none to publish to) get
    every flush."""

    def __init__(self, device: torch.device, interval: int, top_k: int, counters: FeatureCounters | None) -> None:
        self.interval = interval
        self.top_k = top_k
        self.counters = counters
        self.acc = torch.zeros(len(FIELDS), dtype=torch.float64, device=device)
        pinned = device.type == "cuda"
        self.host = torch.zeros(len(FIELDS), dtype=torch.float64, pin_memory=pinned)
        self.event = (
            torch.cuda.Event() if pinned else None  # type: ignore[no-untyped-call]  # torch leaves Event() unannotated
        )
        self.pending = False
        self.steps = 0
        self.last: Summary | None = None

    def add(
        self,
        cu_num_logits: torch.Tensor,
        num_sampled: torch.Tensor,
        idx_mapping: torch.Tensor,
        num_tokens: int,
        live: torch.Tensor,
        expected: torch.Tensor,
        tally: torch.Tensor | None = None,
    ) -> None:
        """Fold one step in; ``tally``: its graded and excluded drafts (``graded``'s
        device counts, zeroed here)."""
        num_reqs = idx_mapping.shape[0]
        n, j, a, slots = _per_request(cu_num_logits, num_sampled, idx_mapping, live)
        per_req = torch.stack((n, j, a, expected[slots], n - j, j - a, ((a == j) & (j < n)).float()))
        self.acc[:7] += per_req.sum(dim=1).double()
        self.acc[_IDX["requests"]] += num_reqs
        self.acc[_IDX["tokens"]] += num_tokens
        self.acc[_IDX["steps"]] += 1
        if tally is not None:
            self.acc[_IDX["graded"] : _IDX["excluded"] + 1] += tally
            tally.zero_()
        self.steps += 1
        self.poll()
        if self.steps % self.interval == 0 and not self.pending:
            self._flush()

    def _flush(self) -> None:
        start_host_copy(self.acc, self.host, self.event)
        self.pending = True
        self.poll()

    def poll(self) -> Summary | None:
        """Report a finished flush; never waits for one that is still running."""
        if not self.pending:
            return None
        # torch leaves Event.query unannotated
        if self.event is not None and not self.event.query():  # type: ignore[no-untyped-call]
            return None
        self.pending = False
        summary = Summary(dict(zip(FIELDS, self.host.tolist(), strict=True)), self.top_k)
        self.last = summary
        logger.info(summary.line())
        if self.counters is not None:
            self.counters.add(summary.counter_totals())
        return summary
