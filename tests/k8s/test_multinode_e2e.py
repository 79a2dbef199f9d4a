"""Multi-node serving for real, on CPU: tiny-moe split over 2 containers on a private
docker network, one tensor-parallel rank per container (`--nnodes 2`), wired with the
same per-node flags `kiln run --print` and `kiln render k8s` emit. The smoke test passes
against the leader, greedy outputs equal the single-node server's, and a worker killed
mid-run fails the smoke with one line and exit code 70, leaving nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest
from kiln_testkit.health import wait_for_health
from kilntest import REPO

from kiln.domain.recipes.topology import split_over_nodes
from kiln.domain.serving.launch_command import LABEL_RECIPE
from kiln.domain.serving.multi_node import NodeGroup, node_specs
from kiln.domain.serving.serving_container import ServingContainer, free_port, run_spec

pytestmark = [pytest.mark.e2e, pytest.mark.docker]

NAME = "tiny-moe"
# bf16 tensor-parallel all-reduces sum partial products in another order than one rank
# does, which flips near-tied argmaxes of random weights (measured: 12 of 16 tokens equal
# for one prompt); in float32 the two layouts agree token for token
EXACT = ["--dtype", "float32"]
PROMPTS = ["def fibonacci(n):", "The quick brown fox", "import os\n"]


def _greedy(url: str) -> list[str]:
    out = []
    for prompt in PROMPTS:
        body = json.dumps({"model": NAME, "prompt": prompt, "max_tokens": 16, "temperature": 0}).encode()
        req = urllib.request.Request(f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            out.append(json.load(resp)["choices"][0]["text"])
    return out


def _leftovers(docker_daemon, prefix: str) -> list[str]:
    client = docker_daemon.client
    boxes = [c.name for c in client.containers.list(all=True) if c.name.startswith(prefix)]
    nets = [n.name for n in client.networks.list() if n.name.startswith(prefix)]
    return boxes + nets


def test_greedy_outputs_across_two_containers_equal_one(tiny_moe, docker_daemon):
    loaded, image = tiny_moe.loaded, tiny_moe.image
    topo = split_over_nodes(2)
    specs = node_specs(loaded, image.id, topo, host_port=free_port(), host_ip="127.0.0.1", extra_args=EXACT)
    prefix = specs[0].name.rsplit("-node", 1)[0]
    try:
        with NodeGroup(docker_daemon, specs) as group:
            group.start()
            group.wait_healthy(300)
            two_nodes = _greedy(group.url)
            logs = group.leader.logs(tail=100000)
        single = run_spec(loaded, image.id, host_port=free_port(), host_ip="127.0.0.1", extra_args=EXACT)
        with ServingContainer(docker_daemon, single) as box:
            box.start()
            box.wait_healthy(300)
            one_node = _greedy(box.url)
    finally:
        assert _leftovers(docker_daemon, prefix) == []
    assert "world_size=2" in logs and "tensor_parallel_size=2" in logs  # really split, not two servers
    assert all(t.strip() for t in one_node)
    assert two_nodes == one_node


def _smoke(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "kiln", "smoke", NAME, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "300"},
    )


def _group_of(docker_daemon, since: set[str]) -> list:
    return [
        c
        for c in docker_daemon.client.containers.list(all=True, filters={"label": LABEL_RECIPE})
        if c.name not in since and "-node" in c.name
    ]


def test_smoke_passes_against_the_leader_of_two_nodes(tiny_moe, docker_daemon):
    before = {c.name for c in docker_daemon.client.containers.list(all=True)}
    proc = _smoke("--nodes", "2", "--json")
    seen: set[str] = set()
    while proc.poll() is None:  # record the group's containers while they live
        seen |= {c.name for c in _group_of(docker_daemon, before)}
        time.sleep(1)
    out, err = proc.communicate()
    assert proc.returncode == 0, err[-5000:]
    from clijson import validated

    record = validated("smoke", out)
    checks = {c["name"]: c for c in record["checks"]}
    for name in (
        "models",
        "completion",
        "chat",
        "greedy_determinism",
        "metrics",
        "plugin_loaded",
        "patched_runner_imports",
        "engine_info",
        "clean_stop",
    ):
        assert checks[name]["ok"], checks[name]
    assert "spec_decode draft tokens=" in checks["metrics"]["detail"]
    assert record["record"] is None  # an overridden topology vouches for nothing publish trusts
    assert {n.rsplit("-", 1)[1] for n in seen} == {"node0", "node1"}
    prefix = min(seen).rsplit("-node", 1)[0]
    assert _leftovers(docker_daemon, prefix) == []


def test_worker_killed_mid_run_fails_the_smoke_clearly_and_leaves_nothing(tiny_moe, docker_daemon):
    before = {c.name for c in docker_daemon.client.containers.list(all=True)}
    proc = _smoke("--nodes", "2")
    worker = prefix = None
    deadline = time.monotonic() + 600
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            group = {c.name: c for c in _group_of(docker_daemon, before)}
            leader = next((c for n, c in group.items() if n.endswith("-node0")), None)
            worker = next((c for n, c in group.items() if n.endswith("-node1")), None)
            if leader is not None and worker is not None:
                prefix = leader.name.rsplit("-node", 1)[0]
                url = leader.labels["ai.kiln.run.url"]
                try:
                    wait_for_health(url, 1)
                except TimeoutError:
                    continue
                assert worker.attrs["Config"]["Healthcheck"]["Test"] == ["NONE"]  # no /health on a headless node
                worker.kill()  # mid-run: the group is healthy and the checks have begun
                break
            time.sleep(0.5)
        _out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert worker is not None, "the worker container never appeared"
    assert proc.returncode == 70, err[-5000:]
    errors = [ln for ln in err.splitlines() if ln.startswith("kiln: error:")]
    assert len(errors) == 1, err[-3000:]
    assert "worker node 1" in errors[0] and "exited while serving" in errors[0], errors[0]
    assert "internal error" not in err
    assert _leftovers(docker_daemon, prefix) == []


def test_image_prints_each_nodes_command(tiny_moe, docker_daemon, tmp_path):
    """`docker run IMAGE --print-launch` with a multi-node launch config: the image's own
    entrypoint prints one command per node, with the flags kiln renders."""
    from kiln.domain.recipes.recipe import load_recipe
    from kiln.domain.recipes.topology import node_args
    from kiln.domain.serving.launch_command import launch_document

    image = tiny_moe.image
    loaded = load_recipe(REPO / "recipes" / "glm53-kindling-2node")
    launch = tmp_path / "launch.json"
    launch.write_text(json.dumps(launch_document(loaded)))
    launch.chmod(0o644)
    out = (
        docker_daemon.client.containers.run(
            image.id,
            ["--print-launch"],
            remove=True,
            environment={"LWS_LEADER_ADDRESS": "glm-0.glm"},
            volumes={str(launch): {"bind": "/opt/kiln/launch.json", "mode": "ro"}},
        )
        .decode()
        .splitlines()
    )
    topo = loaded.recipe.topology
    assert out[-4:-3] == ["# node 0 (leader: API server + rank 0)"]
    assert out[-3].startswith("vllm serve /models/glm-5.3") and out[-3].endswith(
        " ".join(node_args(topo, 0, "glm-0.glm"))
    )
    assert out[-1].endswith(" ".join(node_args(topo, 1, "glm-0.glm")))
