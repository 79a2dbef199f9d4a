"""`kiln run glm53-kindling`: the printed docker command, and a clear stop without a GPU."""

from __future__ import annotations

import shlex

import pytest
from kilntest import run_kiln

# daemon-optional commands run with no daemon, on purpose (conftest no_docker): unit tests
pytestmark = pytest.mark.usefixtures("no_docker")


@pytest.fixture(scope="module")
def printed() -> list[str]:
    result = run_kiln("run", "glm53-kindling", "--print")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("docker run")]
    assert len(lines) == 1, result.stdout
    return shlex.split(lines[0])


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, tok in enumerate(argv[:-1]) if tok == flag]


def test_print_gives_gpus_ipc_host_and_shared_memory(printed):
    assert _pairs(printed, "--gpus") == ["all"]
    assert "--ipc=host" in printed
    assert _pairs(printed, "--shm-size"), "no --shm-size"


def test_print_mounts_both_models_read_only(printed):
    mounts = _pairs(printed, "-v")
    assert "/data/models/GLM-5.3:/models/glm-5.3:ro" in mounts
    assert "/data/models/GLM-5.3-kindling:/models/kindling:ro" in mounts


def test_print_spells_out_env_and_port(printed):
    env = dict(e.split("=", 1) for e in _pairs(printed, "-e"))
    assert env["VLLM_MOE_SKIP_PADDING"] == "1"
    assert env["KILN_DRAFT_TRUNC"] == "1"
    assert _pairs(printed, "-p") == ["8000:8000"]


def test_print_names_the_image_by_content(printed):
    image = printed[-1]
    # the image id when built here, else the tag that carries the input digest
    assert image.startswith(("sha256:", "kiln/glm53-kindling:")), image
    assert not image.endswith(":latest")


def test_run_without_gpu_stops_early_with_nogpu():
    import os

    env = {k: v for k, v in os.environ.items() if k != "KILN_ASSUME_GPU"}
    env["PATH"] = "/usr/bin:/bin"  # no nvidia-smi
    result = run_kiln("run", "glm53-kindling", env=env)
    assert result.returncode == 16, (result.returncode, result.stderr[-1500:])
    assert "no NVIDIA GPU" in result.stderr
