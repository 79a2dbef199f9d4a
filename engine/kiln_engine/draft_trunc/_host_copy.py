"""The flush both statistics accumulators share (``_stats``, ``_av_stats``): a device
accumulator copied to its host buffer and zeroed, without the host waiting for it.

Needs torch: imported by the two modules that do.
"""

from __future__ import annotations

import torch


def start_host_copy(acc: torch.Tensor, host: torch.Tensor, event: torch.cuda.Event | None) -> None:
    """Start copying ``acc`` into ``host`` and zero ``acc`` for the next interval.

    ``event`` (None off CUDA, where the copy is done on return) is recorded behind the
    copy: ``host`` (pinned) holds the totals once it has completed, so the caller reads
    it when ``event.query()`` says so, never by waiting."""
    host.copy_(acc, non_blocking=event is not None)
    acc.zero_()  # queued after the copy on the same stream: the copy reads the old totals
    if event is not None:
        event.record()
