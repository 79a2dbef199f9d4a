"""recipe `topology:`: vLLM's layout rules and feature refusals at `kiln check` time, the
launch flags it drives, and the per-node commands (`kiln run --print`, kiln-serve)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import itertools
import json
import shutil
from types import SimpleNamespace

import pytest
from kilntest import REPO, run_kiln

from kiln.domain.recipes.recipe import load_recipe
from kiln.domain.recipes.topology import Topology, _feature_refusals, _layout_problems, node_args
from kiln.domain.serving.launch_command import _vllm_argv, launch_document

# daemon-optional commands run with no daemon, on purpose (conftest no_docker): unit tests
pytestmark = pytest.mark.usefixtures("no_docker")

MINI = "kiln-test-mini"
TOPOLOGY = "topology:\n  nodes: 2\n  accelerators_per_node: 1\n  tensor_parallel: 2\n"


def _write(tree, text: str, name: str = MINI):
    path = tree / "recipes" / name / "recipe.yaml"
    path.write_text(text)
    return path


def _mini(tree) -> str:
    return (tree / "recipes" / MINI / "recipe.yaml").read_text()


def _check(tree, name: str = MINI):
    return run_kiln("check", name, env={"KILN_ROOT": str(tree)}, cwd=tree)


def test_topology_drives_the_launch_flags(kiln_tree):
    _write(
        kiln_tree,
        _mini(kiln_tree) + TOPOLOGY.replace("tensor_parallel: 2", "tensor_parallel: 2\n  expert_parallel: true"),
    )
    loaded = load_recipe(kiln_tree / "recipes" / MINI)
    argv = _vllm_argv(loaded.recipe)
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert "--enable-expert-parallel" in argv
    assert "--pipeline-parallel-size" not in argv and "--nnodes" not in argv  # per node, never baked
    assert launch_document(loaded)["topology"]["nodes"] == 2


def test_recipe_without_topology_keeps_its_command_line():
    loaded = load_recipe(REPO / "recipes" / "tiny-moe")
    assert "topology" not in launch_document(loaded)
    assert not any(a.startswith("--tensor-parallel") for a in _vllm_argv(loaded.recipe))


@pytest.mark.parametrize(
    ("topology", "field", "words"),
    [
        (
            "nodes: 3\n  accelerators_per_node: 1\n  tensor_parallel: 2",
            "topology.nodes",
            "do not evenly divide the world size",
        ),
        (
            "nodes: 2\n  accelerators_per_node: 8\n  tensor_parallel: 8",
            "topology.accelerators_per_node",
            "= 4 per node",
        ),
        (
            "nodes: 3\n  accelerators_per_node: 4\n  tensor_parallel: 6\n  data_parallel: 2",
            "topology.data_parallel",
            "must fill whole nodes or fit whole into one",
        ),
        ("nodes: 2\n  gpus: 8", "topology.gpus", "unknown key"),
        ('nodes: "2"', "topology.nodes", "must be an integer"),
        ("nodes: 0", "topology.nodes", "must be an integer in 1..4096"),
        ("master_port: 80", "topology.master_port", "1024..65535"),
    ],
)
def test_layouts_vllm_refuses_fail_check_with_one_line_naming_the_field(kiln_tree, topology, field, words):
    block_starts = len(_mini(kiln_tree).splitlines()) + 1
    _write(kiln_tree, _mini(kiln_tree) + f"topology:\n  {topology}\n")
    result = _check(kiln_tree)
    assert result.returncode == 2, result.stderr
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("kiln: error:")]
    assert len(errors) == 1, result.stderr
    assert f"{field}:" in errors[0] and words in errors[0], errors[0]
    line = int(errors[0].split("recipe.yaml:")[1].split(":")[0])
    assert line >= block_starts, errors[0]  # at the topology block, not somewhere else


@pytest.mark.parametrize(
    ("arg", "words"),
    [
        ("tensor-parallel-size: 2", "launch.args.tensor-parallel-size: the layout comes from topology.tensor_parallel"),
        (
            "enable-expert-parallel: true",
            "launch.args.enable-expert-parallel: the layout comes from topology.expert_parallel",
        ),
        ("nnodes: 2", "launch.args.nnodes: set per node at launch"),
        ("node-rank: 1", "launch.args.node-rank: set per node at launch"),
    ],
)
def test_layout_said_twice_is_refused(kiln_tree, arg, words):
    text = _mini(kiln_tree).replace("    max-model-len: 256", f"    max-model-len: 256\n    {arg}") + TOPOLOGY
    _write(kiln_tree, text)
    result = _check(kiln_tree)
    assert result.returncode == 2, result.stderr
    assert words in result.stderr, result.stderr


def test_vllm_rules_accept_the_layouts_vllm_serves():
    for topo in (
        Topology(nodes=2, accelerators_per_node=8, tensor_parallel=8, data_parallel=2, expert_parallel=True),
        Topology(nodes=2, accelerators_per_node=8, tensor_parallel=16),
        Topology(nodes=2, accelerators_per_node=8, tensor_parallel=8, pipeline_parallel=2),
        Topology(nodes=4, accelerators_per_node=8, tensor_parallel=16, data_parallel=2),
        Topology(nodes=2, accelerators_per_node=8, tensor_parallel=4, data_parallel=4),
    ):
        assert _layout_problems(topo) == [], topo


def test_node_args_leader_serves_workers_are_headless():
    topo = Topology(nodes=3, accelerators_per_node=1, tensor_parallel=3, master_port=29600)
    assert node_args(topo, 0, "lead") == [
        "--nnodes",
        "3",
        "--node-rank",
        "0",
        "--master-addr",
        "lead",
        "--master-port",
        "29600",
    ]
    assert node_args(topo, 2, "lead")[-1] == "--headless"
    assert node_args(Topology(), 0, "lead") == []


# -- draft-trunc's refusals --------------------------------------------------------------
def _glm_tree(tree, topology: str):
    """The real glm53-kindling recipe (draft-trunc on) in a throwaway tree, with its
    single-node `topology:` block replaced by `topology`."""
    shutil.copytree(REPO / "recipes" / "glm53-kindling", tree / "recipes" / "glm53-kindling")
    path = tree / "recipes" / "glm53-kindling" / "recipe.yaml"
    kept, inside = [], False
    for ln in path.read_text().splitlines():
        if ln.startswith("topology:"):
            inside = True
        elif inside and ln and not ln.startswith((" ", "#")):
            inside = False  # the next top-level key ends the block
        if not inside:
            kept.append(ln)
    assert len(kept) < len(path.read_text().splitlines()), "glm53-kindling has no topology: block to replace"
    path.write_text("\n".join(kept) + "\n" + topology)
    return path


@pytest.mark.parametrize(
    ("topology", "field", "words"),
    [
        (
            "topology:\n  nodes: 2\n  accelerators_per_node: 8\n  tensor_parallel: 8\n  pipeline_parallel: 2\n",
            "topology.pipeline_parallel",
            "draft-trunc refuses pipeline parallelism",
        ),
        (
            (
                "topology:\n  nodes: 2\n  accelerators_per_node: 8\n  tensor_parallel: 8\n"
                "  data_parallel: 2\n  expert_parallel: true\n"
            ),
            "topology.data_parallel",
            "draft-trunc refuses sequence-parallel MoE",
        ),
    ],
)
def test_draft_trunc_refuses_layouts_it_cannot_run_at_check_time(kiln_tree, topology, field, words):
    _glm_tree(kiln_tree, topology)
    result = _check(kiln_tree, "glm53-kindling")
    assert result.returncode == 2, result.stderr
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("kiln: error:")]
    assert len(errors) == 1, result.stderr
    assert f"{field}: {words}" in errors[0]


def test_draft_trunc_runs_tensor_parallel_across_nodes(kiln_tree):
    _glm_tree(
        kiln_tree, "topology:\n  nodes: 2\n  accelerators_per_node: 8\n  tensor_parallel: 16\n  expert_parallel: true\n"
    )
    result = _check(kiln_tree, "glm53-kindling")
    assert result.returncode == 0, result.stderr


def _engine_check():
    from kiln_engine.draft_trunc import _config_check

    return _config_check


def test_kiln_refuses_exactly_the_layouts_the_engine_refuses(monkeypatch):
    """The check-time table mirrors the engine's start-up check: over a grid of layouts and
    all2all backends, kiln refuses a layout iff draft-trunc would refuse it in vLLM
    (use_sequence_parallel_moe computed as vLLM 0.32.0's ParallelConfig does)."""
    from kiln.domain.recipes.topology import _SEQUENCE_PARALLEL_BACKENDS

    engine = _engine_check()
    monkeypatch.setattr(engine.importlib.util, "find_spec", lambda name: object())  # triton: not a layout rule
    for tp, pp, dp, ep, backend in itertools.product(
        (1, 2, 8),
        (1, 2),
        (1, 2),
        (False, True),
        ("allgather_reducescatter", "deepep_low_latency", "flashinfer_nvlink_two_sided"),
    ):
        parallel = SimpleNamespace(
            pipeline_parallel_size=pp,
            prefill_context_parallel_size=1,
            data_parallel_size=dp,
            all2all_backend=backend,
            use_sequence_parallel_moe=backend in _SEQUENCE_PARALLEL_BACKENDS and ep and tp > 1 and dp > 1,
        )
        config = SimpleNamespace(parallel_config=parallel, speculative_config=None)
        engine_refuses = bool(engine.problems(config))
        topo = Topology.model_construct(
            nodes=1,
            accelerators_per_node=tp * pp * dp,
            tensor_parallel=tp,
            pipeline_parallel=pp,
            data_parallel=dp,
            expert_parallel=ep,
            master_port=29501,
        )
        kiln_refuses = bool(_feature_refusals("draft-trunc", topo, {"all2all-backend": backend}))
        assert kiln_refuses == engine_refuses, (tp, pp, dp, ep, backend)


def test_two_node_glm_variant_is_valid_and_draft_trunc_is_off():
    result = run_kiln("check", "glm53-kindling-2node")
    assert result.returncode == 0, result.stderr
    loaded = load_recipe(REPO / "recipes" / "glm53-kindling-2node")
    assert loaded.recipe.experimental == []
    assert _feature_refusals("draft-trunc", loaded.recipe.topology, loaded.recipe.launch.args)  # why it is off


# -- the per-node commands ---------------------------------------------------------------
def _kiln_serve():
    path = REPO / "docker-images" / "common" / "kiln-serve"
    loader = importlib.machinery.SourceFileLoader("kiln_serve_k8s", str(path))
    spec = importlib.util.spec_from_loader("kiln_serve_k8s", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_run_print_shows_one_command_per_node():
    result = run_kiln("run", "glm53-kindling-2node", "--print")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    network = next(ln for ln in lines if ln.startswith("docker network create")).split()[-1]
    runs = [ln for ln in lines if ln.startswith("docker run")]
    assert len(runs) == 2
    leader, worker = runs
    leader_name = leader.split("--name ")[1].split()[0]
    for cmd in runs:
        assert f"--network {network}" in cmd
        assert "--tensor-parallel-size 8 --data-parallel-size 2 --enable-expert-parallel --nnodes 2" in cmd
        assert f"--master-addr {leader_name} --master-port 29501" in cmd
    assert "--node-rank 0" in leader and "--headless" not in leader and "-p 8000:8000" in leader
    assert "--node-rank 1" in worker and worker.endswith("--headless") and " -p " not in worker
    assert "--no-healthcheck" in worker and "--no-healthcheck" not in leader  # headless ranks serve no /health


def test_a_multi_node_recipe_is_not_started_by_kiln_run():
    result = run_kiln("run", "glm53-kindling-2node")
    assert result.returncode == 64, result.stderr
    assert "spans 2 nodes" in result.stderr and "kiln render k8s" in result.stderr


def test_kiln_serve_print_launch_shows_each_node(monkeypatch, capsys, tmp_path):
    serve = _kiln_serve()
    loaded = load_recipe(REPO / "recipes" / "glm53-kindling-2node")
    launch = tmp_path / "launch.json"
    launch.write_text(json.dumps(launch_document(loaded)))
    monkeypatch.setattr(serve, "LAUNCH", str(launch))
    monkeypatch.setenv("LWS_LEADER_ADDRESS", "glm-0.glm.default")
    monkeypatch.setattr("sys.argv", ["kiln-serve", "--print-launch"])
    assert serve.main() == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-4] == "# node 0 (leader: API server + rank 0)"
    assert out[-2] == "# node 1 (worker: headless ranks)"
    topo = loaded.recipe.topology
    for rank, line in ((0, out[-3]), (1, out[-1])):
        assert line.endswith(" ".join(node_args(topo, rank, "glm-0.glm.default")))  # the same flags as kiln's
        assert "--tensor-parallel-size 8" in line
    monkeypatch.setattr("sys.argv", ["kiln-serve", "--print-launch", "--node-rank", "1", "--headless"])
    assert serve.main() == 0
    assert not any(ln.startswith("# node") for ln in capsys.readouterr().out.splitlines())


@pytest.mark.parametrize("count", ["0", "-1", "two"])
def test_smoke_nodes_must_be_a_node_count(count):
    result = run_kiln("smoke", "tiny-moe", "--nodes", count)
    assert result.returncode == 64, result.stderr
    assert "is not a node count" in result.stderr and "internal error" not in result.stderr
