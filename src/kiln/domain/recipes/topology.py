"""Where a recipe runs: nodes, accelerators per node and vLLM's parallel layout.

A recipe states its layout once, in ``topology:``; the launch flags (`--tensor-parallel-size`
and the rest), the per-node commands (leader: API server and rank 0; workers: `--headless`
ranks) and the Kubernetes manifests are all derived from it. The rules below are vLLM's own
(vllm/engine/arg_utils.py `create_engine_config`, vllm/config/parallel.py), checked here so
that a layout vLLM would refuse on the cluster is refused by `kiln check` first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NamedTuple, Protocol

from pydantic import Field, PlainValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

from kiln.domain.recipes.accelerators import NAMES as ACCELERATOR_NAMES
from kiln.domain.recipes.validated_yaml import Strict

_DEFAULT_MASTER_PORT = 29501  # vLLM's ParallelConfig.master_port


def _size(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4096:
        raise PydanticCustomError("size", "must be an integer in 1..4096")
    return value


_Size = Annotated[int, PlainValidator(_size), WithJsonSchema({"type": "integer", "minimum": 1, "maximum": 4096})]


def _port(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1024 <= value <= 65535:
        raise PydanticCustomError("port", "must be an integer in 1024..65535")
    return value


_MasterPort = Annotated[
    int, PlainValidator(_port), WithJsonSchema({"type": "integer", "minimum": 1024, "maximum": 65535})
]


class Topology(Strict):
    """`topology:` in recipe.yaml. One rank per accelerator: nodes * accelerators_per_node
    must equal tensor_parallel * pipeline_parallel * data_parallel."""

    nodes: _Size = Field(default=1, description="machines (Kubernetes pods) one replica spans")
    accelerators_per_node: _Size = Field(default=1, description="GPUs per node (CPU recipes: ranks per node)")
    tensor_parallel: _Size = Field(default=1, description="vLLM --tensor-parallel-size")
    pipeline_parallel: _Size = Field(default=1, description="vLLM --pipeline-parallel-size")
    data_parallel: _Size = Field(default=1, description="vLLM --data-parallel-size")
    expert_parallel: bool = Field(
        default=False,
        description="vLLM --enable-expert-parallel (MoE experts over tensor_parallel * data_parallel ranks)",
    )
    master_port: _MasterPort = Field(
        default=_DEFAULT_MASTER_PORT, description="torch.distributed port on the leader (vLLM --master-port)"
    )
    # Literal of a tuple constant: pydantic reads it at run time, mypy cannot (no literal value)
    accelerator: Literal[ACCELERATOR_NAMES] | None = Field(  # type: ignore[valid-type]  # see above
        default=None,
        description="the GPU the recipe is sized for (`kiln plan`, `kiln check`): " + ", ".join(ACCELERATOR_NAMES),
    )

    @property
    def world_size(self) -> int:
        """The number of ranks: tensor times pipeline times data parallel size."""
        return self.tensor_parallel * self.pipeline_parallel * self.data_parallel

    @property
    def replica_ranks(self) -> int:
        """Ranks of one data-parallel replica (vLLM's world_size within DP)."""
        return self.tensor_parallel * self.pipeline_parallel

    @property
    def ranks_per_node(self) -> int:
        """The ranks on each node."""
        return self.world_size // self.nodes

    @property
    def multi_node(self) -> bool:
        """Whether the recipe spans more than one node."""
        return self.nodes > 1


# vLLM flags that the topology owns: a recipe that also sets one of them in launch.args
# would say the same thing twice, and the two could disagree.
_LAYOUT_FLAGS = {
    "tensor-parallel-size": "tensor_parallel",
    "tp": "tensor_parallel",
    "pipeline-parallel-size": "pipeline_parallel",
    "pp": "pipeline_parallel",
    "data-parallel-size": "data_parallel",
    "dp": "data_parallel",
    "enable-expert-parallel": "expert_parallel",
    "master-port": "master_port",
}
# set per node at launch time (kiln run --print, kiln render k8s), never baked into an image
_NODE_FLAGS = (
    "nnodes",
    "node-rank",
    "master-addr",
    "headless",
    "data-parallel-rank",
    "data-parallel-start-rank",
    "data-parallel-size-local",
    "data-parallel-address",
)


class _Launch(Protocol):
    @property
    def args(self) -> Mapping[str, object]: ...


class _Recipe(Protocol):
    """What the layout rules read of a Recipe (recipe.py imports this module, so the
    rules name the parts they read instead of the class)."""

    @property
    def topology(self) -> Topology | None: ...

    @property
    def launch(self) -> _Launch: ...

    @property
    def features(self) -> list[str]: ...


class _Loaded(Protocol):
    """What the problem reports read of a LoadedRecipe."""

    @property
    def recipe(self) -> _Recipe: ...

    def where(self, *loc: Any) -> str: ...


def _arg_int(args: Mapping[str, object], *names: str, default: int = 1) -> int:
    for name in names:
        value = args.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return default


def effective(recipe: _Recipe) -> Topology:
    """The recipe's topology; a recipe without one runs on one node with whatever layout
    its launch.args give (so feature refusals see that layout too)."""
    if recipe.topology is not None:
        return recipe.topology
    args = recipe.launch.args
    tp = _arg_int(args, "tensor-parallel-size", "tp")
    pp = _arg_int(args, "pipeline-parallel-size", "pp")
    dp = _arg_int(args, "data-parallel-size", "dp")
    ep = args.get("enable-expert-parallel") is True
    world = max(1, min(tp * pp * dp, 4096))
    return Topology.model_construct(
        nodes=1,
        accelerators_per_node=world,
        tensor_parallel=tp,
        pipeline_parallel=pp,
        data_parallel=dp,
        expert_parallel=ep,
        master_port=_DEFAULT_MASTER_PORT,
        accelerator=None,
    )


class _FieldProblem(NamedTuple):
    """A rule a layout breaks, reported at one `topology:` field (or launch flag)."""

    field: str
    reason: str


class _ArgProblem(NamedTuple):
    """A launch.args flag that belongs elsewhere, and why."""

    loc: tuple[str, ...]  # its path in recipe.yaml
    message: str


def _layout_problems(topo: Topology) -> list[_FieldProblem]:
    """The field and why, for each of vLLM's multi-node rules the layout breaks."""
    found: list[_FieldProblem] = []
    world = topo.world_size
    if world % topo.nodes:
        found.append(
            _FieldProblem(
                "nodes",
                f"{topo.nodes} nodes do not evenly divide the world size "
                f"tensor_parallel*pipeline_parallel*data_parallel = {world} (vLLM: --nnodes must divide it)",
            )
        )
        return found
    if topo.ranks_per_node != topo.accelerators_per_node:
        found.append(
            _FieldProblem(
                "accelerators_per_node",
                f"{topo.accelerators_per_node} per node, but the layout puts {world} ranks on "
                f"{topo.nodes} node(s) = {topo.ranks_per_node} per node (one rank per accelerator)",
            )
        )
    replica, per_node = topo.replica_ranks, topo.ranks_per_node
    if topo.multi_node and topo.data_parallel > 1 and per_node % replica and replica % per_node:
        found.append(
            _FieldProblem(
                "data_parallel",
                f"a data-parallel replica (tensor_parallel*pipeline_parallel = {replica} ranks) "
                f"must fill whole nodes or fit whole into one ({per_node} ranks per node)",
            )
        )
    return found


def _arg_problems(recipe: _Recipe) -> list[_ArgProblem]:
    """Where and why, for launch.args flags that belong to the topology or to one node."""
    found: list[_ArgProblem] = []
    for flag in recipe.launch.args:
        name = flag.replace("_", "-")
        if name in _NODE_FLAGS:
            found.append(
                _ArgProblem(
                    ("launch", "args", flag),
                    f"launch.args.{flag}: set per node at launch "
                    "(kiln run --print, kiln render k8s); describe the nodes in topology: instead",
                )
            )
        elif name in _LAYOUT_FLAGS and recipe.topology is not None:
            found.append(
                _ArgProblem(
                    ("launch", "args", flag),
                    f"launch.args.{flag}: the layout comes from topology.{_LAYOUT_FLAGS[name]}; remove it here",
                )
            )
    return found


def problems(loaded: _Loaded) -> list[str]:
    """One-line `file:line: field: message` problems with the recipe's layout."""
    recipe = loaded.recipe
    lines = [f"{loaded.where(*loc)}: {msg}" for loc, msg in _arg_problems(recipe)]
    if recipe.topology is not None:
        for field, msg in _layout_problems(recipe.topology):
            lines.append(f"{loaded.where('topology', field)}: topology.{field}: {msg}")
    return lines


# -- what a layout looks like on the command line -------------------------------------
def layout_args(topo: Topology) -> list[str]:
    """vLLM flags for the parallel layout (defaults left out, so a one-rank recipe's
    command line carries no layout flags at all)."""
    out: list[str] = []
    if topo.tensor_parallel > 1:
        out += ["--tensor-parallel-size", str(topo.tensor_parallel)]
    if topo.pipeline_parallel > 1:
        out += ["--pipeline-parallel-size", str(topo.pipeline_parallel)]
    if topo.data_parallel > 1:
        out += ["--data-parallel-size", str(topo.data_parallel)]
    if topo.expert_parallel:
        out.append("--enable-expert-parallel")
    return out


def node_args(topo: Topology, rank: int, master_addr: str) -> list[str]:
    """Flags one node adds: rank 0 runs the API server and the first ranks; the others run
    headless ranks that join it at master_addr:master_port (vLLM's multiprocessing
    backend, `--nnodes/--node-rank/--master-addr`). Empty on a one-node topology."""
    if not topo.multi_node:
        return []
    out = [
        "--nnodes",
        str(topo.nodes),
        "--node-rank",
        str(rank),
        "--master-addr",
        master_addr,
        "--master-port",
        str(topo.master_port),
    ]
    if rank > 0:
        out.append("--headless")
    return out


@dataclass(frozen=True)
class _NodeRole:
    rank: int

    @property
    def leader(self) -> bool:
        return self.rank == 0

    @property
    def role(self) -> str:
        return "leader: API server + rank 0" if self.leader else "worker: headless ranks"


def roles(topo: Topology) -> list[_NodeRole]:
    """The role of each node of the topology, leader first."""
    return [_NodeRole(r) for r in range(topo.nodes)]


# -- features that cannot run a layout --------------------------------------------------
# vLLM's all2all backends that shard the MoE batch over TP ranks under DP + TP + EP
# (ParallelConfig.use_sequence_parallel_moe in vLLM 0.32.0); allgather_reducescatter is
# vLLM's default backend.
_SEQUENCE_PARALLEL_BACKENDS = frozenset(
    {
        "allgather_reducescatter",
        "naive",
        "deepep_high_throughput",
        "deepep_low_latency",
        "deepep_v2",
        "flashinfer_nvlink_one_sided",
        "passthrough",
        "mori_high_throughput",
        "mori_low_latency",
        "nixl_ep",
    }
)
_DEFAULT_ALL2ALL = "allgather_reducescatter"


def _draft_trunc(topo: Topology, args: Mapping[str, object]) -> list[_FieldProblem]:
    """Mirrors engine/kiln_engine/draft_trunc/_config_check.py, which refuses the same
    layouts when vLLM starts; here they are refused before an image is built."""
    found: list[_FieldProblem] = []
    backend = str(args.get("all2all-backend", _DEFAULT_ALL2ALL))
    if topo.pipeline_parallel > 1:
        found.append(
            _FieldProblem(
                "pipeline_parallel",
                "draft-trunc refuses pipeline parallelism: several microbatches "
                "are in flight, so its dead-token marks would not match the batch being verified",
            )
        )
    if _arg_int(args, "prefill-context-parallel-size", "pcp") > 1:
        found.append(
            _FieldProblem(
                "prefill-context-parallel-size",
                "draft-trunc refuses prefill context parallelism: it repartitions the batch and overwrites the marks",
            )
        )
    if (
        topo.expert_parallel
        and topo.tensor_parallel > 1
        and topo.data_parallel > 1
        and backend in _SEQUENCE_PARALLEL_BACKENDS
    ):
        found.append(
            _FieldProblem(
                "data_parallel",
                "draft-trunc refuses sequence-parallel MoE (data_parallel > 1, "
                "tensor_parallel > 1 and expert_parallel): each TP rank routes a slice of the batch "
                "while GLM-5's router reads the whole batch's padding mask; use tensor_parallel 1 "
                "per data-parallel replica or turn draft-trunc off",
            )
        )
    elif topo.data_parallel > 1 and backend in ("naive", "allgather_reducescatter"):
        found.append(
            _FieldProblem(
                "data_parallel",
                f"draft-trunc refuses data_parallel > 1 with all2all backend {backend!r}: "
                "it gathers every rank's tokens and this rank's padding mask no longer lines up",
            )
        )
    return found


# feature name -> rule(topology, launch.args) -> [FieldProblem]: the layouts each
# experimental feature cannot run (a feature registry can take these over as they are)
FEATURE_LAYOUT_RULES = {"draft-trunc": _draft_trunc}


def _feature_refusals(feature: str, topo: Topology, args: Mapping[str, object]) -> list[_FieldProblem]:
    rule = FEATURE_LAYOUT_RULES.get(feature)
    return rule(topo, args) if rule else []


def feature_problems(loaded: _Loaded) -> list[str]:
    """One line per (enabled feature, layout rule it breaks), at the topology field (or
    at launch.args when the recipe has no topology section)."""
    recipe = loaded.recipe
    topo = effective(recipe)
    lines = []
    for i, feature in enumerate(recipe.features):
        for field, reason in _feature_refusals(feature, topo, recipe.launch.args):
            if recipe.topology is not None and field in Topology.model_fields:
                where, shown = loaded.where("topology", field), f"topology.{field}"
            else:
                where, shown = loaded.where("experimental", i), f"experimental[{i}]"
            lines.append(f"{where}: {shown}: {reason}")
    return lines


def split_over_nodes(nodes: int) -> Topology:
    """`kiln smoke NAME --nodes N`: one tensor-parallel rank per container, N containers
    (proves the multi-node wiring on one host, e.g. a CPU recipe in CI)."""
    return Topology(nodes=nodes, accelerators_per_node=1, tensor_parallel=nodes, accelerator=None)
