"""Weights from a shared Hugging Face cache, served for real on CPU: tiny-moe's generated
models laid out as hub snapshots (blobs + relative links, refs/main) in a host folder,
mounted read-only into tiny-moe-hf (an image that bakes no model), served offline by
vLLM through the hub client; a missing or partial snapshot stops with one line.

The hub itself is not reachable here: the cache is seeded by kiln (kiln.inimage.hf_cache.seed),
and the engine image's own huggingface_hub proves it reads that layout offline."""

from __future__ import annotations

import io
import json
import tarfile

import pytest
from kilntest import run_kiln

from kiln.inimage.hf_cache import seed, snapshot_dir

# its own image and containers (tiny-moe's image only read): beside the daemon group (tests/kilntest.py)
pytestmark = [pytest.mark.e2e, pytest.mark.docker, pytest.mark.xdist_group("tiny-moe-hf")]

TARGET = ("kiln-test/tiny-qwen3moe", "2c5e1f0d4b8a7e6f9d3c2b1a0f9e8d7c6b5a4f3e")
DRAFT = ("kiln-test/tiny-qwen3-draft", "7a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d")


@pytest.fixture(scope="module")
def models(tiny_moe, docker_daemon, tmp_path_factory):
    """tiny-moe's two generated models, copied out of its image."""
    img = tiny_moe.image
    out = tmp_path_factory.mktemp("models")
    box = docker_daemon.client.containers.create(img.id)
    try:
        stream, _ = box.get_archive("/models")
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            tar.extractall(out, filter="data")
    finally:
        box.remove(force=True)
    return out / "models"


@pytest.fixture(scope="module")
def hf_image(docker_daemon, base_image):
    from kiln.domain.images.definitions import require_built

    result = run_kiln("build", "tiny-moe-hf")
    assert result.returncode == 0, result.stderr[-4000:]
    return require_built(docker_daemon, "tiny-moe-hf")


@pytest.fixture
def cache(models, tmp_path):
    hub = tmp_path / "hub"
    seed(models / "tiny-qwen3moe", hub, *TARGET)
    seed(models / "tiny-qwen3-draft", hub, *DRAFT)
    return hub


def _run(docker_daemon, image_id, cache, **kw):
    return docker_daemon.client.containers.run(
        image_id, volumes={str(cache): {"bind": "/hf-cache", "mode": "ro"}}, network_disabled=True, detach=True, **kw
    )


def test_the_hub_client_in_the_image_reads_the_cache_offline(hf_image, docker_daemon, cache):
    img = hf_image.image
    script = (
        "import json; from huggingface_hub import snapshot_download, try_to_load_from_cache\n"
        f"snap = snapshot_download({TARGET[0]!r}, revision={TARGET[1]!r}, cache_dir='/hf-cache')\n"
        f"cfg = try_to_load_from_cache({DRAFT[0]!r}, 'config.json', cache_dir='/hf-cache', revision={DRAFT[1]!r})\n"
        "print(json.dumps([snap, cfg]))\n"
    )
    box = _run(docker_daemon, img.id, cache, entrypoint=["python", "-c", script], environment={"HF_HUB_OFFLINE": "1"})
    try:
        assert box.wait(timeout=120)["StatusCode"] == 0, box.logs().decode()[-2000:]
        snap, cfg = json.loads(box.logs().decode().strip().splitlines()[-1])
    finally:
        box.remove(force=True)
    assert snap == f"/hf-cache/models--kiln-test--tiny-qwen3moe/snapshots/{TARGET[1]}"
    assert cfg == f"/hf-cache/models--kiln-test--tiny-qwen3-draft/snapshots/{DRAFT[1]}/config.json"


def test_smoke_serves_the_cached_snapshots_offline(hf_image, cache, tmp_path):
    result = run_kiln(
        "smoke",
        "tiny-moe-hf",
        "--json",
        env={"KILN_HF_CACHE": str(cache), "KILN_RESULTS_DIR": str(tmp_path / "results")},
    )
    assert result.returncode == 0, result.stderr[-5000:]
    record = json.loads(result.stdout)
    names = {c["name"]: c for c in record["checks"]}
    assert record["passed"] is True
    assert names["completion"]["ok"] and names["chat"]["ok"]
    assert "spec_decode draft tokens=" in names["metrics"]["detail"]  # the draft came from the cache too


def test_plain_docker_run_with_a_partial_snapshot_exits_93_with_one_line(hf_image, docker_daemon, cache):
    img = hf_image.image
    weights = snapshot_dir(cache, *DRAFT) / "model.safetensors"
    weights.resolve().unlink()  # the blob is gone, the link stays: an interrupted copy
    box = _run(docker_daemon, img.id, cache)
    try:
        assert box.wait(timeout=120)["StatusCode"] == 93
        log = box.logs().decode()
    finally:
        box.remove(force=True)
    lines = [ln for ln in log.splitlines() if ln.startswith("kiln-serve: ")]
    assert lines == [
        (
            f"kiln-serve: draft model {DRAFT[0]} at revision {DRAFT[1]}: model.safetensors is a broken "
            "link (its blob is missing: the download did not finish) in the Hugging Face cache /hf-cache"
        )
    ]
    assert "Traceback" not in log and "vllm" not in log.lower().replace("kiln-serve", "")


def test_kiln_run_refuses_a_missing_snapshot_before_start(hf_image, tmp_path):
    empty = tmp_path / "empty-hub"
    empty.mkdir()
    result = run_kiln("run", "tiny-moe-hf", "--detach", env={"KILN_HF_CACHE": str(empty)})
    assert result.returncode == 93, result.stderr
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("kiln: error:")]
    assert len(errors) == 2  # one per model
    assert f"{TARGET[0]} at revision {TARGET[1]}: snapshots/{TARGET[1]}/ is missing" in errors[0]
    assert "Traceback" not in result.stderr


def test_check_models_mode_answers_without_serving(hf_image, docker_daemon, cache):
    img = hf_image.image
    box = _run(docker_daemon, img.id, cache, command=["--check-models"])
    try:
        assert box.wait(timeout=60)["StatusCode"] == 0, box.logs().decode()
    finally:
        box.remove(force=True)
