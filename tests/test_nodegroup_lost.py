"""Which node a group blames when one stops (unit level: fake containers, whose states
change as the daemon records them). The proof against real containers is
tests/k8s/test_multinode_e2e.py's killed worker."""

from __future__ import annotations

import time

from kiln.domain.serving import multi_node
from kiln.domain.serving.multi_node import NodeGroup


class Box:
    """A ServingContainer as far as NodeGroup.lost_node reads it: exited from `at` on."""

    def __init__(self, exits_at: float | None):
        self.exits_at = exits_at

    def status(self) -> str:
        return "exited" if self.exits_at is not None and time.monotonic() >= self.exits_at else "running"


def group(*boxes: Box) -> NodeGroup:
    g = NodeGroup.__new__(NodeGroup)  # no daemon: only the boxes are read
    g.boxes = list(boxes)  # type: ignore[assignment]
    return g


def test_a_leader_seen_exited_before_its_killed_worker_blames_the_worker(monkeypatch):
    monkeypatch.setattr(multi_node, "_WORKER_SETTLE_S", 3.0)
    now = time.monotonic()
    lost = group(Box(now - 1), Box(now + 1.0)).lost_node()  # the worker's exit shows 1 s later
    assert lost is not None and lost.rank == 1


def test_a_leader_that_exits_alone_is_the_lost_node_and_nothing_lost_is_none(monkeypatch):
    monkeypatch.setattr(multi_node, "_WORKER_SETTLE_S", 0.6)
    now = time.monotonic()
    lost = group(Box(now - 1), Box(None), Box(None)).lost_node()
    assert lost is not None and lost.rank == 0
    assert group(Box(None), Box(None)).lost_node() is None
    worker = group(Box(None), Box(None), Box(now - 1)).lost_node()
    assert worker is not None and worker.rank == 2
