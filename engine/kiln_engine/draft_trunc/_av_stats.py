"""kiln-av's statistics: what its hook did, and with
``KILN_DRAFT_TRUNC_AV_TIMING`` what it cost, in a served engine.

Every ``KILN_DRAFT_TRUNC_LOG_INTERVAL`` hook calls the totals go to one log line and
to the ``kiln_draft_trunc_av_*`` counters, as ``_stats`` does for the truncation: the
survival sums live on the device (the fused kernel adds to them) and are copied to
pinned memory behind a CUDA event, reported once the copy has landed; the hook's GPU
time is read from CUDA events once they have completed. The host never waits.

Why these counts: adaptive verification sizes its budget on the host one step later,
from confidences it copies back itself, and admits drafts in its own kernel, so which
drafts the correction moved across the budget is not known where the hook runs
without a host sync. What is: how many steps and draft slots it corrected or left
alone, and how far it moved the survivals adaptive verification ranks (their sums
before and after, and the sum of the moves).

Needs torch: imported by ``_av`` when the hook first has work.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Mapping

import torch

from ._host_copy import start_host_copy
from ._kernels.av import STATS
from ._metrics import FeatureCounters

logger = logging.getLogger("kiln_engine.draft_trunc")

# Counted on the host, per flush; the device columns (``STATS``) are "av_" + name.
HOST_FIELDS = (
    "av_steps",  # hook calls that corrected the confidences
    "av_stepped_aside",  # hook calls below KILN_DRAFT_TRUNC_AV_MIN_BATCH: left as they were
    "av_drafts",  # draft slots corrected (requests x drafts)
    "av_hook_timed",  # corrected calls timed (KILN_DRAFT_TRUNC_AV_TIMING)
    "av_hook_seconds",  # ... their GPU time, CUDA events (0 off CUDA)
    "av_hook_host_seconds",  # ... their host time
)
FIELDS = (*HOST_FIELDS, *(f"av_{name}" for name in STATS))


class HookTimer:
    """CUDA events around each corrected call (reused, never waited on) and the host
    clock; a timing is booked once its end event has completed."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.free: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.pending: deque[tuple[torch.cuda.Event | None, torch.cuda.Event | None, float]] = deque()
        self.started = 0.0
        self.start_event: torch.cuda.Event | None = None

    def start(self) -> None:
        if self.cuda:
            if not self.free:
                self.free.append(
                    (
                        torch.cuda.Event(enable_timing=True),  # type: ignore[no-untyped-call]  # unannotated in torch
                        torch.cuda.Event(enable_timing=True),  # type: ignore[no-untyped-call]  # unannotated in torch
                    )
                )
            self.start_event = self.free[-1][0]
            self.start_event.record()
        self.started = time.perf_counter()

    def stop(self) -> None:
        end = None
        if self.cuda:
            _begin, end = self.free.pop()
            end.record()
        self.pending.append((self.start_event, end, time.perf_counter() - self.started))

    def drain(self, counts: dict[str, float]) -> None:
        """Book every finished timing into ``counts``, oldest first."""
        while self.pending:
            begin, end, host = self.pending[0]
            if end is not None and not end.query():  # type: ignore[no-untyped-call]  # unannotated in torch
                return
            self.pending.popleft()
            counts["av_hook_timed"] += 1
            counts["av_hook_host_seconds"] += host
            if begin is not None and end is not None:
                counts["av_hook_seconds"] += begin.elapsed_time(end) / 1e3
                self.free.append((begin, end))


class AvStats:
    """kiln-av's accumulator in one process (the reporting rank); ``counters`` (None:
    none to publish to) get every flush."""

    def __init__(
        self,
        device: torch.device,
        interval: int,
        counters: FeatureCounters | None,
        timing: bool,
    ) -> None:
        self.interval = interval
        self.counters = counters
        self.acc = torch.zeros(len(STATS), dtype=torch.float64, device=device)
        cuda = device.type == "cuda"
        self.host = torch.zeros(len(STATS), dtype=torch.float64, pin_memory=cuda)
        self.event = (
            torch.cuda.Event() if cuda else None  # type: ignore[no-untyped-call]  # unannotated in torch
        )
        self.timer = HookTimer(cuda) if timing else None
        self.counts = dict.fromkeys(HOST_FIELDS, 0.0)
        self.in_flight: dict[str, float] | None = None
        self.calls = 0
        self.last: dict[str, float] | None = None

    def stepped_aside(self) -> None:
        self.counts["av_stepped_aside"] += 1
        self._tick()

    def corrected(self, num_reqs: int, drafts: int) -> None:
        self.counts["av_steps"] += 1
        self.counts["av_drafts"] += num_reqs * drafts
        self._tick()

    def _tick(self) -> None:
        self.calls += 1
        self.poll()
        if self.calls % self.interval == 0 and self.in_flight is None:
            self._flush()

    def _flush(self) -> None:
        start_host_copy(self.acc, self.host, self.event)
        self.in_flight, self.counts = self.counts, dict.fromkeys(HOST_FIELDS, 0.0)
        self.poll()

    def poll(self) -> dict[str, float] | None:
        """Report a finished flush (the totals of FIELDS); never waits."""
        if self.timer is not None:
            self.timer.drain(self.counts)
        if self.in_flight is None:
            return None
        if self.event is not None and not self.event.query():  # type: ignore[no-untyped-call]  # unannotated in torch
            return None
        device = self.host.tolist()
        totals = {**self.in_flight, **{f"av_{n}": v for n, v in zip(STATS, device, strict=True)}}
        self.in_flight = None
        self.last = totals
        logger.info(line(totals, timed=self.timer is not None))
        if self.counters is not None:
            self.counters.add(totals)
        return totals


def line(totals: Mapping[str, float], timed: bool) -> str:
    """The summary line of one flush."""
    out = (
        f"draft_trunc av: steps={totals['av_steps']:.0f} stepped_aside={totals['av_stepped_aside']:.0f} "
        f"drafts={totals['av_drafts']:.0f} survival_raw={totals['av_survival_raw']:.1f} "
        f"survival_corrected={totals['av_survival_corrected']:.1f} "
        f"survival_shift={totals['av_survival_shift']:.1f}"
    )
    if timed:
        n = max(totals["av_hook_timed"], 1.0)
        out += (
            f" hook_us_per_step: gpu={totals['av_hook_seconds'] / n * 1e6:.1f} "
            f"host={totals['av_hook_host_seconds'] / n * 1e6:.1f} (timed={totals['av_hook_timed']:.0f})"
        )
    return out
