"""What a step reports (``log_step``, on the reporting rank): the device-side
statistics behind the summary lines and the ``kiln_draft_trunc_*`` counters
(``_stats``, ``_metrics``), and the acceptance trace (``KILN_DRAFT_TRUNC_TRACE``).

Pure Python at import: torch loads only when a step is logged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from . import _state

if TYPE_CHECKING:
    import torch

    from ._stats import Summary


@dataclass
class TraceWriter:
    """``KILN_DRAFT_TRUNC_TRACE``: the file (opened at the first record), and the
    predictions of the step in flight, kept from the moment its marks were made:
    by the time the outcome is known, the speculator may have written the next
    step's predictions into its buffer."""

    path: str
    file: IO[str] | None = None
    pending: torch.Tensor | None = None
    steps: int = 0

    def write(self, record: dict[str, Any]) -> None:
        if self.file is None:
            self.file = open(self.path, "a", buffering=1)  # noqa: SIM115 (kept open across steps)
        self.file.write(json.dumps(record) + "\n")
        self.steps += 1

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        self.file = self.pending = None


def log_step(
    cu_num_logits: torch.Tensor,
    num_sampled: torch.Tensor,
    idx_mapping: torch.Tensor,
    num_tokens: int,
) -> Summary | None:
    """Fold this step into the device-side statistics (no host sync).

    Every ``KILN_DRAFT_TRUNC_LOG_INTERVAL`` steps the totals are logged and
    added to the ``kiln_draft_trunc_*`` Prometheus counters once their copy has
    landed. Returns the last finished summary, if one finished now. With
    ``KILN_DRAFT_TRUNC_TRACE`` set it also appends this step to the trace (that
    part does sync the host: it is a measurement mode).
    """
    state = _state.current
    buffers = state.buffers
    if not (state.log and state.active and state.lead) or buffers is None:
        return None
    if state.trace is not None and state.trace.pending is not None:
        _write_trace(state.trace, cu_num_logits, num_sampled, idx_mapping, buffers.live)
    if state.knobs.log_interval <= 0:
        return None
    from ._metrics import FeatureCounters
    from ._stats import StepStats

    if state.stats is None:
        state.stats = StepStats(buffers.live.device, state.knobs.log_interval, state.top_k, FeatureCounters.register())
    stats = state.stats
    before = stats.last
    stats.add(
        cu_num_logits,
        num_sampled,
        idx_mapping,
        num_tokens,
        buffers.live,
        buffers.expected,
        state.tally,
    )
    return stats.last if stats.last is not before else None


def poll_summary() -> Summary | None:
    """Report a statistics flush whose copy has landed since the last step, if any
    (``log_step`` does this every step; this is for a caller with no next step)."""
    stats = _state.current.stats
    return None if stats is None else stats.poll()


def _write_trace(
    trace: TraceWriter,
    cu_num_logits: torch.Tensor,
    num_sampled: torch.Tensor,
    idx_mapping: torch.Tensor,
    live: torch.Tensor,
) -> None:
    """One JSON line per verify step: {"step", "k", "reqs": [{"p", "kept", "accepted",
    "n"}]}; p_i is the estimator's conditional acceptance probability of draft i
    (null where it had none), kept the drafts verified, accepted those accepted."""
    from ._stats import step_outcomes

    p = trace.pending
    trace.pending = None
    if p is None:
        return
    rows = step_outcomes(cu_num_logits, num_sampled, idx_mapping, live)
    probs_by_req: list[list[float]] = p.tolist()
    reqs = []
    for outcome, probs in zip(rows, probs_by_req, strict=True):
        if outcome.proposed <= 0:  # prefill or no drafts: nothing was verified
            continue
        shown = [None if x != x else round(x, 6) for x in probs]  # NaN: no prediction  # noqa: PLR0124
        reqs.append({"p": shown, "kept": outcome.kept, "accepted": outcome.accepted, "n": outcome.proposed})
    if reqs:
        trace.write({"step": trace.steps, "k": p.shape[1], "reqs": reqs})
