"""The embedded default, end to end: build engine-cpu + tiny-moe with the harness,
serve a real vLLM from it, and prove the serving contract with real clients."""

from __future__ import annotations

import hashlib
import json
import shlex
import socket
import subprocess
import time

import pytest
from kiln_testkit.health import wait_for_health
from kilntest import REPO, kiln_containers_on, make_tree, run_kiln, saved_image

from kiln.domain.serving.serving_container import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.docker]

NAME = "tiny-moe"


@pytest.fixture(scope="module")
def image(tiny_moe):
    return tiny_moe


def _containers(docker_daemon, image_id, port: int):
    """Containers of `image_id`, in any state, that a `kiln run --port PORT` made: other
    tiny-moe containers may run beside this module (the hub-cache test copies the models
    out of one; tests/kilntest.py's xdist groups)."""
    return [c for c in kiln_containers_on(docker_daemon, port) if c.image.id == image_id]


def test_image_is_labelled_non_root_and_in_budget(image):
    loaded, recipe_image, img = image.loaded, image.recipe_image, image.image
    labels = img.labels
    assert labels["ai.kiln.recipe"] == NAME
    assert labels["ai.kiln.input-digest"] == recipe_image.digest
    assert labels["ai.kiln.engine.flavour"] == "cpu"
    patches = json.loads(labels["ai.kiln.patches"])
    series = (REPO / "patches" / "vllm" / "0.32.0" / "series").read_text().split()
    listed = [n for n in series if n.endswith(".patch")]
    assert sorted(patches) == sorted(listed)
    for name, sha in patches.items():
        data = (REPO / "patches" / "vllm" / "0.32.0" / name).read_bytes()
        assert sha == "sha256:" + hashlib.sha256(data).hexdigest()
    assert img.attrs["Config"]["User"] == "kiln"
    assert img.attrs["Config"]["Healthcheck"]["Test"][-1] == "/opt/kiln/bin/kiln-health"
    assert img.attrs["Size"] <= loaded.recipe.budgets.max_image_size_gb * 1e9


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """One results folder for the module: the smoke record the publish test relies on."""
    return tmp_path_factory.mktemp("results")


def test_smoke_passes_and_writes_a_record(image, results):
    recipe_image, img = image.recipe_image, image.image
    result = run_kiln("smoke", NAME, "--json", env={"KILN_RESULTS_DIR": str(results)})
    assert result.returncode == 0, result.stderr[-5000:]
    record = json.loads((results / "smoke" / f"{img.id.split(':')[1]}.json").read_text())
    from clijson import validated

    assert validated("smoke", result.stdout) == {
        **record,
        "record": str(results / "smoke" / f"{img.id.split(':')[1]}.json"),
    }
    assert record["passed"] is True and record["image_id"] == img.id
    assert record["input_digest"] == recipe_image.digest
    names = {c["name"]: c for c in record["checks"]}
    for check in (
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
        assert names[check]["ok"], names[check]
    assert "spec_decode draft tokens=" in names["metrics"]["detail"]


def test_print_launch_shows_resolved_command_and_overrides(image, docker_daemon):
    img = image.image
    out = docker_daemon.client.containers.run(
        img.id, ["--print-launch", "--max-model-len", "256"], remove=True, environment={"VLLM_CPU_KVCACHE_SPACE": "2"}
    ).decode()
    command = out.strip().splitlines()[-1]
    assert command.startswith("vllm serve /models/tiny-qwen3moe")
    assert "--max-model-len 256" in command and "--max-model-len 512" not in command
    assert '"method":"draft_model"' in command
    assert "VLLM_CPU_KVCACHE_SPACE=2" in out  # env given to docker run wins over baked env


def test_speculation_turns_off_with_speculative_config_none(image, docker_daemon):
    """How an operator turns the baked draft model off (README's serving contract):
    vLLM's own `--speculative-config None` replaces the baked flag; the server then
    answers without proposing a single draft token."""
    from kiln_testkit.twinserve import run_set, serving, spec_decode_stats

    loaded, img = image.loaded, image.image
    with serving(docker_daemon, loaded, img.id, args=["--speculative-config", "None"], startup_timeout_s=180) as box:
        (done,) = run_set(box.url, NAME, ["def fibonacci(n):"], max_tokens=16)
        assert len(done.token_ids) == 16
        assert spec_decode_stats(box.url) is None
        logs = box.logs(tail=100000)
    assert "--speculative-config None" in logs and '"method":"draft_model"' not in logs


def _readme_docker_run() -> list[str]:
    lines = [
        ln for ln in (REPO / "README.md").read_text().splitlines() if ln.startswith("docker run --rm -p 8000:8000")
    ]
    assert len(lines) == 1, lines
    return shlex.split(lines[0])


def test_readme_docker_run_serves_appended_args_and_stops_on_sigterm(image, docker_daemon):
    """The serving contract with the README's own hardened `docker run` line: no kiln on the
    path. Only the port (a free loopback one), -d/--name, and --rm (to read the exit code
    after the stop) differ from the line as printed."""
    from openai import OpenAI

    img = image.image
    port = free_port()
    name = f"kiln-readme-{port}"
    cmd = _readme_docker_run()
    assert cmd[-1] == "kiln/tiny-moe"
    cmd = [t for t in cmd[:-1] if t != "--rm"]
    cmd[cmd.index("8000:8000")] = f"127.0.0.1:{port}:8000"
    cmd[2:2] = ["-d", "--name", name]
    subprocess.run([*cmd, img.id, "--max-model-len", "384"], check=True, capture_output=True)
    box = docker_daemon.client.containers.get(name)
    try:
        wait_for_health(f"http://127.0.0.1:{port}", 180)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=60)
        model = client.models.list().data[0]
        assert model.id == "tiny-moe"
        assert model.model_extra.get("max_model_len") == 384  # the appended arg won
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            box.reload()
            if box.attrs["State"].get("Health", {}).get("Status") == "healthy":
                break
            time.sleep(2)
        assert box.attrs["State"]["Health"]["Status"] == "healthy"  # Docker's HEALTHCHECK agrees
        uid = box.exec_run(["id", "-u"]).output.decode().strip()
        assert uid == "1000"
        t0 = time.monotonic()
        box.stop(timeout=30)
        assert time.monotonic() - t0 < 30
        box.reload()
        assert box.attrs["State"]["ExitCode"] in (0, 143), box.attrs["State"]
    finally:
        box.remove(force=True)


def test_port_in_use_is_refused_and_leaves_no_container(image, docker_daemon):
    img = image.image
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen(1)
        port = s.getsockname()[1]
        result = run_kiln("run", NAME, "--port", str(port), "--detach")
    assert result.returncode == 14, result.stderr
    assert f"port {port}" in result.stderr and "already in use" in result.stderr
    assert _containers(docker_daemon, img.id, port) == []


def test_container_exiting_during_start_is_a_clear_error(image, docker_daemon):
    img = image.image
    port = free_port()
    result = run_kiln("run", NAME, "--port", str(port), "--detach", "--", "--no-such-vllm-flag")
    assert result.returncode == 13, result.stderr[-3000:]
    assert "exited during start" in result.stderr
    assert "no-such-vllm-flag" in result.stderr  # the log tail names the cause
    assert _containers(docker_daemon, img.id, port) == []


def test_missing_model_host_path_is_refused_before_docker(tmp_path):
    tree = make_tree(tmp_path / "tree")
    recipe = tree / "recipes" / "kiln-test-mini" / "recipe.yaml"
    recipe.write_text(
        recipe.read_text().replace(
            "    source: baked\n    path: /models/none",
            f"    source: host_path\n    host_path: {tmp_path}/no-such-weights\n    path: /models/none",
        )
    )
    result = run_kiln("run", "kiln-test-mini", env={"KILN_ROOT": str(tree)}, cwd=tree)
    assert result.returncode == 15, result.stderr
    assert f"{tmp_path}/no-such-weights" in result.stderr and "does not exist" in result.stderr


def test_engine_image_has_no_ca_or_wheels_in_any_layer(image, docker_daemon):
    """The CA bundle the build used and the wheelhouse never reach a layer of the image."""
    from kiln.domain.images.ca_bundle import resolve_ca

    img = image.image
    ca = resolve_ca()
    ca_sha = hashlib.sha256(ca.data).hexdigest() if ca.path else None
    found, files = [], 0
    with saved_image(docker_daemon, img.id) as saved:  # asserts it scanned every layer (> 0)
        for _, f, layer in saved.members():
            name = f.name
            files += f.isfile()
            if "kiln-ca" in name or name.endswith(".whl") or "/wheels/" in name or "99kiln-ca" in name:
                found.append(name)
            # the inner condition keeps its own comment
            if ca_sha and f.isfile() and f.size == len(ca.data):  # noqa: SIM102
                if hashlib.sha256(layer.extractfile(f).read()).hexdigest() == ca_sha:
                    found.append(f"{name} (CA bundle bytes)")
    assert files > 1000, f"only {files} files in the layers: the scan missed the image"
    assert found == []


@pytest.mark.registry
def test_publish_the_smoked_image_and_promote(image, results, tmp_path):
    """The real chain: smoke record from the test above -> push to a registry -> promote."""
    from publish.localregistry import LocalRegistry, available

    if available():
        pytest.skip(available())
    recipe_image, img = image.recipe_image, image.image
    if not (results / "smoke" / f"{img.id.split(':')[1]}.json").is_file():
        pytest.skip("needs the smoke record of test_smoke_passes_and_writes_a_record")
    reg = LocalRegistry(tmp_path / "registry").start()
    try:
        env = {"KILN_RESULTS_DIR": str(results), **reg.env()}
        pushed = run_kiln("publish", NAME, "--registry", f"{reg.host}/team", "--channel", "experimental", env=env)
        assert pushed.returncode == 0, pushed.stderr[-3000:]
        repo = "team/kiln/tiny-moe"
        tags = set(reg.tags(repo))
        assert {recipe_image.short, "experimental", "vllm-0.32.0-tiny-moe"} <= tags, tags
        digest, manifest = reg.manifest(repo, recipe_image.short)
        assert manifest["config"]["digest"] == img.id
        assert digest in pushed.stdout + pushed.stderr
        promoted = run_kiln(
            "promote", NAME, "--registry", f"{reg.host}/team", "--from", "experimental", "--to", "stable", env=env
        )
        assert promoted.returncode == 0, promoted.stderr[-3000:]
        assert reg.manifest(repo, "stable")[0] == digest
        again = run_kiln("publish", NAME, "--registry", f"{reg.host}/team", env=env)
        assert again.returncode == 0 and "skip" in (again.stdout + again.stderr).lower()
    finally:
        reg.stop()


def test_plugin_refuses_unsafe_feature_combination_at_start(image, docker_daemon):
    """In a real vLLM process: draft-trunc without MoE padding skip must not serve."""
    img = image.image
    box = docker_daemon.client.containers.run(
        img.id,
        detach=True,
        cap_add=["SYS_NICE"],
        shm_size="4g",
        environment={"KILN_DRAFT_TRUNC": "1", "VLLM_MOE_SKIP_PADDING": "0"},
    )
    try:
        status = box.wait(timeout=180)
        logs = box.logs().decode(errors="replace")
        assert status["StatusCode"] != 0, logs[-2000:]
        assert "KILN_DRAFT_TRUNC=1 needs VLLM_MOE_SKIP_PADDING=1" in logs
    finally:
        box.remove(force=True)
