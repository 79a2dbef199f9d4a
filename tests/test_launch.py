"""LaunchConfig -> vLLM argv, the image entrypoint's merge rules, and docker run specs."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json

import pytest
from kilntest import REPO, run_kiln

from kiln.domain.recipes.recipe import load_recipe
from kiln.domain.serving.launch_command import RunSpec, _vllm_argv, launch_document

# daemon-optional commands run with no daemon, on purpose (conftest no_docker): unit tests
pytestmark = pytest.mark.usefixtures("no_docker")


def _load_entrypoint():
    path = REPO / "docker-images" / "common" / "kiln-serve"
    loader = importlib.machinery.SourceFileLoader("kiln_serve", str(path))
    spec = importlib.util.spec_from_loader("kiln_serve", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


serve = _load_entrypoint()


def test_tiny_moe_argv():
    loaded = load_recipe(REPO / "recipes" / "tiny-moe")
    argv = _vllm_argv(loaded.recipe)
    assert argv[:2] == ["serve", "/models/tiny-qwen3moe"]
    assert argv[argv.index("--served-model-name") + 1] == "tiny-moe"
    assert "--enforce-eager" in argv
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "draft_model", "model": "/models/tiny-qwen3-draft", "num_speculative_tokens": 3}
    doc = launch_document(loaded)
    assert doc["argv"][0] == "vllm" and doc["env"]["HF_HUB_OFFLINE"] == "1"


@pytest.mark.parametrize(
    ("user", "expect_in", "expect_out"),
    [
        (["--max-model-len", "1024"], ["--max-model-len", "1024"], ["512"]),
        (["--max_model_len=2048"], ["--max_model_len=2048"], ["512"]),
        (["--no-enforce-eager"], ["--no-enforce-eager"], ["--enforce-eager"]),
        (["--seed", "7"], ["--seed", "7", "--max-model-len", "512"], []),
    ],
)
def test_user_args_replace_baked_flags(user, expect_in, expect_out):
    baked = ["vllm", "serve", "/m", "--max-model-len", "512", "--enforce-eager", "--port", "8000"]
    merged = serve.merge(baked, user)
    assert merged[:3] == ["vllm", "serve", "/m"]
    text = " ".join(merged)
    for token in expect_in:
        assert token in merged, text
    for token in expect_out:
        assert token not in merged, text
    assert merged[-len(user) :] == user  # appended: last wins for anything argparse sees twice


def test_positional_user_args_are_refused():
    with pytest.raises(SystemExit):
        serve.merge(["vllm", "serve", "/m"], ["other-model"])


def test_port_follows_overrides():
    assert serve.port_of(["--port", "9000"], 8000) == 9000
    assert serve.port_of(["--port=9001"], 8000) == 9001
    assert serve.port_of([], 8000) == 8000


def test_run_spec_flags_per_flavour():
    cpu = RunSpec(
        image="img", name="n", host_port=8000, container_port=8000, flavour="cpu", mounts=[("/data/m", "/models/m")]
    ).docker_cli()
    assert cpu[cpu.index("--cap-add") : cpu.index("--cap-add") + 2] == ["--cap-add", "SYS_NICE"]
    assert "--shm-size" in cpu and "--gpus" not in cpu
    assert "/data/m:/models/m:ro" in cpu
    gpu = RunSpec(image="img", name="n", host_port=8000, container_port=8000, flavour="cuda").docker_cli()
    assert gpu[gpu.index("--gpus") : gpu.index("--gpus") + 2] == ["--gpus", "all"]
    assert "--ipc=host" in gpu


def test_kiln_run_print_only_prints(tmp_path):
    result = run_kiln("run", "tiny-moe", "--print", "--port", "8123")
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip().splitlines()[-1]
    assert line.startswith("docker run --rm --name kiln-tiny-moe-")
    assert "-p 8123:8000" in line and "--cap-add SYS_NICE" in line and "--shm-size 4g" in line
