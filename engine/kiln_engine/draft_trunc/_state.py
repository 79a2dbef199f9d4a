"""draft_trunc's state in one process, and the device buffers it owns.

One ``State`` per process (``current``), rebound by ``reload``; the hooks read it
through this module's attribute, so they always see the live one. Tests and
benchmarks read it through ``snapshot()``, never by reaching inside.

Pure Python at import: torch loads only when ``prepare`` allocates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._env import Knobs, read_knobs

if TYPE_CHECKING:  # torch and triton load only when a kernel runs
    import torch

    from ._cost import MoELayer
    from ._kernels.buffers import Buffers, Calibration, CostInputs
    from ._reporting import TraceWriter
    from ._stats import StepStats, Summary


def _wants_log_step(knobs: Knobs) -> bool:
    return knobs.enabled and (knobs.log_interval > 0 or bool(knobs.trace))


@dataclass
class State:
    """Everything draft_trunc keeps in one process.

    knobs: as read from the environment; ``enabled`` and ``log`` start from them
        and are what the hooks test (``check_config`` may turn both off).
    lead: this process reports (logs, counters, trace); False on tensor-parallel
        ranks other than 0, which see the same batch and would only repeat rank 0.
    top_k, layer: from the model config at start (``check_config``, or
        ``set_moe_layer`` for the layer): routed experts per token, and the MoE
        shape the cost model prices. They outlive ``reload``.
    buffers, cost, calibration: device buffers allocated once and reused, so that
        the kernel itself never allocates (``prepare``); the calibration of the
        estimator is kept across steps.
    stats, trace: the statistics accumulator and the acceptance trace.
    active: this step's marks were written; calibrating: and they filed cells
        for ``graded`` to grade.
    target_only, excluded, sampling_defaults: the slots whose request's sampling
        settings act on the target only (``_tenant``; host set, and its device mask
        once one was flagged), and the server's default sampling parameters those
        settings are compared with (``check_config``).
    tally: drafts graded into the calibration and drafts kept out of it since the
        last statistics step (device, [2]; only while statistics are published).
    """

    knobs: Knobs
    enabled: bool
    log: bool
    lead: bool = True
    top_k: int = 0
    layer: MoELayer | None = None
    buffers: Buffers | None = None
    cost: CostInputs | None = None
    calibration: Calibration | None = None
    stats: StepStats | None = None
    trace: TraceWriter | None = None
    active: bool = False
    calibrating: bool = False
    # host copy of the cost table (pricing drafting needs the full step's time)
    cost_host: list[float] | None = None
    # the drafting in flight (begin_drafting): drafts scheduled for verification,
    # positions made so far (what the next mark_dead prices), the depth decision's
    # device flag
    scheduled: int | None = None
    drafted: int | None = None
    go: torch.Tensor | None = None
    target_only: set[int] = field(default_factory=set)
    excluded: torch.Tensor | None = None
    sampling_defaults: dict[str, Any] = field(default_factory=dict)
    tally: torch.Tensor | None = None

    @classmethod
    def start(cls, knobs: Knobs, top_k: int = 0, layer: MoELayer | None = None) -> State:
        return cls(knobs, knobs.enabled, _wants_log_step(knobs), top_k=top_k, layer=layer)


@dataclass(frozen=True)
class Snapshot:
    """A read-only view of the state at one moment, for tests and benchmarks.

    The tensors are draft_trunc's own persistent buffers, not copies (a copy would
    cost a device round trip and would not be what a captured graph writes): read
    them, and ``clone()`` what must outlive the next step.
    """

    knobs: Knobs
    enabled: bool
    log: bool
    lead: bool
    top_k: int
    layer: MoELayer | None
    buffers: Buffers | None
    cost: CostInputs | None
    calibration: Calibration | None
    active: bool
    calibrating: bool
    last_summary: Summary | None  # the last statistics flush reported
    trace_steps: int  # steps written to the trace
    target_only: frozenset[int]  # slots whose request's settings act on the target only
    sampling_defaults: Mapping[str, Any]  # the server's, as check_config read them


current = State.start(read_knobs())


def snapshot() -> Snapshot:
    """The state as it is now (see ``Snapshot``)."""
    s = current
    return Snapshot(
        knobs=s.knobs,
        enabled=s.enabled,
        log=s.log,
        lead=s.lead,
        top_k=s.top_k,
        layer=s.layer,
        buffers=s.buffers,
        cost=s.cost,
        calibration=s.calibration,
        active=s.active,
        calibrating=s.calibrating,
        last_summary=None if s.stats is None else s.stats.last,
        trace_steps=0 if s.trace is None else s.trace.steps,
        target_only=frozenset(s.target_only),
        sampling_defaults=dict(s.sampling_defaults),
    )


def reload(env: Mapping[str, str] | None = None) -> Knobs:
    """Re-read the knobs (tests, or a process that sets them after import): a fresh
    state, keeping only what the model config said (``top_k``, ``layer``)."""
    global current
    old = current
    if old.trace is not None:
        old.trace.close()
    current = State.start(read_knobs(env), top_k=old.top_k, layer=old.layer)
    return current.knobs


def set_moe_layer(layer: MoELayer | None) -> None:
    """The MoE layer shape the cost-aware policy prices (None: the default)."""
    current.layer = layer
    current.cost = None


def prepare(max_num_reqs: int, device: torch.device | str, max_num_tokens: int = 0, num_spec: int = 0) -> None:
    """Allocate the per-slot buffers (and the cost table for ``max_num_tokens``,
    and the calibration for ``num_spec`` drafts) up front, else the first
    mark_dead does."""
    import torch

    from ._kernels.buffers import Buffers

    # Normalise "cuda" to "cuda:N" so an unchanged device never reallocates
    # (which would also reset the step counter).
    where = torch.empty(0, device=device).device
    state = current
    buffers = state.buffers
    if buffers is None or buffers.live.shape[0] < max_num_reqs or buffers.live.device != where:
        state.buffers = Buffers.allocate(max_num_reqs, where)
        state.stats = None
    if state.knobs.policy == "cost":
        _prepare_cost(state, max_num_tokens, where)
        if num_spec > 0:
            _prepare_calibration(state, max_num_reqs, num_spec, where)


def _prepare_calibration(state: State, max_num_reqs: int, num_spec: int, device: torch.device) -> None:
    from ._cost import TAU_GRID
    from ._kernels.buffers import Calibration

    cal = state.calibration
    same_shape = cal is not None and cal.hits.shape[0] == num_spec * TAU_GRID + 1
    if cal is not None and same_shape and cal.bins.shape[0] >= max_num_reqs and cal.bins.device == device:
        return
    fresh = Calibration.allocate(max_num_reqs, num_spec, device)
    if cal is not None and same_shape and cal.hits.device == device:
        # more slots: keep what was learnt
        fresh = fresh._replace(hits=cal.hits, counts=cal.counts)
    state.calibration = fresh


def _prepare_cost(state: State, max_num_tokens: int, device: torch.device) -> None:
    import torch

    from ._cost import H200_FIT, MoELayer, live_table, other_ratio
    from ._kernels.buffers import CostInputs

    cost = state.cost
    if cost is not None and cost.table.shape[0] > max_num_tokens and cost.table.device == device:
        return
    layer = state.layer or MoELayer()
    # Room for a few thousand tokens at once, so that growing batches rarely
    # rebuild the table (a rebuild allocates, which a graph capture must not).
    size = max(max_num_tokens, 8192)
    state.cost_host = live_table(layer, H200_FIT, size)
    table = torch.tensor(state.cost_host, dtype=torch.float32, device=device)
    state.cost = CostInputs(table, H200_FIT.t_fixed, H200_FIT.t_token, other_ratio(state.knobs.other_share))
