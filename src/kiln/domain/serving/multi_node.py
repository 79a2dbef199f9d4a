"""A multi-node topology on one Docker host: one container per node.

The containers share a private user-defined network; the leader (API server + rank 0)
publishes the API port, the workers run headless ranks that join it by container name.
The wiring is exactly
the per-node commands `kiln run --print` shows and `kiln render k8s` deploys; only the
leader's address differs (a container name here, LWS_LEADER_ADDRESS on Kubernetes)."""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import NamedTuple, Self

from kiln.basics import log
from kiln.basics.errors import ContainerStartFailed, NodeLost
from kiln.domain.recipes.recipe import LoadedRecipe
from kiln.domain.recipes.topology import Topology, layout_args, node_args, roles
from kiln.domain.serving.launch_command import RunSpec
from kiln.domain.serving.serving_container import ServingContainer, health_ok, run_spec
from kiln.infra.docker import DockerDaemon, DockerError


def node_specs(
    loaded: LoadedRecipe,
    image: str,
    topo: Topology,
    *,
    host_port: int,
    host_ip: str = "",
    env: dict[str, str] | None = None,
    extra_args: list[str] | None = None,
    network: str | None = None,
) -> list[RunSpec]:
    """One RunSpec per node, leader first. The layout flags are spelled out on every node
    (kiln-serve replaces the baked ones of the same name), so the commands say the whole
    layout even for an image built before the topology changed."""
    base = run_spec(loaded, image, host_port=host_port, host_ip=host_ip, env=env)
    prefix = base.name
    network = network or f"{prefix}-net"
    leader = f"{prefix}-node0"
    specs = []
    for node in roles(topo):
        args = layout_args(topo) + node_args(topo, node.rank, leader) + list(extra_args or [])
        specs.append(
            replace(
                base,
                name=f"{prefix}-node{node.rank}",
                network=network,
                extra_args=args,
                host_port=host_port if node.leader else None,
                healthcheck=node.leader,
                env=dict(base.env),
                labels=dict(base.labels),
            )
        )
    return specs


def print_commands(specs: list[RunSpec], topo: Topology) -> None:
    """The commands, one node per line, with the network they share."""
    print("# one host, one container per node on a private network; on separate hosts run each node's")
    print("# command on its own host with --network host and --master-addr set to the leader host's address")
    print(f"docker network create {shlex.quote(specs[0].network)}")
    for node, spec in zip(roles(topo), specs, strict=True):
        print(f"# node {node.rank} ({node.role})")
        print(spec.shell())


# how long a lost leader waits for a worker's exit to show (see NodeGroup.lost_node)
_WORKER_SETTLE_S = 5.0


class _LostNode(NamedTuple):
    """A member of a node group that stopped running."""

    rank: int  # 0: the leader
    box: ServingContainer


class NodeGroup:
    """Start every node, wait for the leader's /health while watching the workers, and
    always remove the containers and the network, whatever happened."""

    def __init__(self, docker: DockerDaemon, specs: list[RunSpec]) -> None:
        self.docker = docker
        self.specs = specs
        self.boxes = [ServingContainer(docker, spec) for spec in specs]
        self.network: str | None = None

    @property
    def leader(self) -> ServingContainer:
        """The rank 0 node's container, which serves the API."""
        return self.boxes[0]

    @property
    def url(self) -> str:
        """The group's API address: its leader's."""
        return self.leader.url

    def start(self) -> None:
        """Create the group's network and start its containers, workers first."""
        self.docker.create_network(self.specs[0].network, labels={"ai.kiln.run.network": "1"})
        self.network = self.specs[0].network
        # workers first: the leader's rank 0 waits for them at master_addr:master_port
        for box in reversed(self.boxes):
            box.start()

    def lost_node(self) -> _LostNode | None:
        """The node that is no longer running, else None. Workers first: a leader whose
        worker died exits too, and the worker is the cause. The daemon can record the
        leader's exit before the killed worker's (a SIGKILLed container's state changes
        only once its teardown is done), so a lost leader waits a moment for a worker."""
        lost = self._first_gone(range(1, len(self.boxes))) or self._first_gone([0])
        if lost is None or lost.rank != 0 or len(self.boxes) == 1:
            return lost
        deadline = time.monotonic() + _WORKER_SETTLE_S
        while time.monotonic() < deadline:
            time.sleep(0.5)
            worker = self._first_gone(range(1, len(self.boxes)))
            if worker is not None:
                return worker
        return lost

    def _first_gone(self, ranks: Iterable[int]) -> _LostNode | None:
        for rank in ranks:
            if self.boxes[rank].status() in ("exited", "dead", "removed"):
                return _LostNode(rank, self.boxes[rank])
        return None

    def node_lost(self, lost: _LostNode, when: str) -> NodeLost:
        """The NodeLost error for a node that exited: its role, container and exit code, its logs dumped."""
        rank, box = lost
        code = box.wait_exited(5)
        box.dump_logs(40)
        role = "leader" if rank == 0 else "worker"
        return NodeLost(
            f"{role} node {rank} (container {box.spec.name}) exited {when} "
            f"(exit code {'?' if code is None else code}); the group of {len(self.boxes)} cannot serve"
        )

    def wait_healthy(self, timeout_s: float) -> float:
        """Wait until the leader answers /health; NodeLost when a node exits first. The seconds it took."""
        t0 = time.monotonic()
        with log.console.status(f"waiting for {self.url}/health ({len(self.boxes)} nodes)") as status:
            while True:
                elapsed = time.monotonic() - t0
                lost = self.lost_node()
                if lost is not None:
                    raise self.node_lost(lost, "during start")
                if health_ok(self.url):
                    log.ok(f"healthy after {elapsed:.1f} s: {self.url} ({len(self.boxes)} nodes)")
                    return elapsed
                if elapsed > timeout_s:
                    self.dump_logs()
                    raise ContainerStartFailed(
                        f"{self.specs[0].name} not healthy after {timeout_s:.0f} s ({len(self.boxes)} nodes)"
                    )
                status.update(
                    f"waiting for {self.url}/health ({len(self.boxes)} nodes)  {elapsed:5.0f}s / {timeout_s:.0f}s"
                )
                time.sleep(0.5)

    def dump_logs(self, tail: int = 40) -> None:
        """Print the last lines of each node's log."""
        for box in self.boxes:
            box.dump_logs(tail)

    def stop(self, timeout: int = 30) -> float:
        """Stop the leader first (it owns the API server), then the workers."""
        t0 = time.monotonic()
        for box in self.boxes:
            box.stop(timeout=timeout)
        return time.monotonic() - t0

    def remove(self) -> None:
        """Remove every node's container and the group's network."""
        for box in self.boxes:
            box.remove()
        self._remove_network()

    def _remove_network(self) -> None:
        if self.network is not None:
            self.docker.remove_network(self.network)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        try:
            try:
                self.stop(timeout=30)
            finally:
                self.remove()  # every node, with force: also those a failed stop skipped
        except DockerError as fault:
            if exc_type is None:
                raise
            log.warn(f"{fault.message} ({fault.hint})")  # the error on its way out is the one reported
