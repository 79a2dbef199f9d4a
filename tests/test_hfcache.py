"""Weights from a shared Hugging Face cache (`model.*.source: hf`), at unit level: the
snapshot check (what is missing, one line), the cache layout kiln writes when it seeds a
cache, `kiln fetch` with a fake downloader (the hub is not reachable here), the recipe
schema, the launch command and mounts, and the Kubernetes render with its fetch Job.

Served for real, offline, from such a cache: tests/e2e/test_hf_cache.py."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kilntest import REPO, run_kiln

from kiln.basics.errors import FetchFailed, HfSnapshotMissing
from kiln.domain.serving.hf_fetch import fetch
from kiln.inimage import hf_cache
from kiln.inimage.hf_cache import HfModel, _repo_folder, check, seed, snapshot_dir

# `kiln check`, `run --print` and `render k8s` ask a daemon when there is one: not here
pytestmark = pytest.mark.usefixtures("no_docker")

REPO_ID, REV = "org/tiny", "0123456789abcdef0123456789abcdef01234567"
TARGET = HfModel("target", REPO_ID, REV)


def _model_dir(root: Path, *, shards: int = 1) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    (root / "tokenizer.json").write_text("{}")
    if shards == 1:
        (root / "model.safetensors").write_bytes(b"\0" * 64)
    else:
        names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
        for name in names:
            (root / name).write_bytes(name.encode())
        (root / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": {f"w{i}": n for i, n in enumerate(names)}})
        )
    return root


def test_seeded_cache_has_the_hub_clients_layout(tmp_path):
    src = _model_dir(tmp_path / "src")
    cache = tmp_path / "cache"
    snap = seed(src, cache, REPO_ID, REV)
    root = cache / "models--org--tiny"
    assert snap == root / "snapshots" / REV
    assert (root / "refs" / "main").read_text() == REV
    weights = snap / "model.safetensors"
    # a relative link into ../../blobs, named by the LFS sha256 of the file
    lfs_sha256 = hashlib.sha256(bytes(64)).hexdigest()
    assert weights.is_symlink() and os.readlink(weights) == f"../../blobs/{lfs_sha256}"
    config = (src / "config.json").read_bytes()
    git_sha1 = hashlib.sha1(b"blob %d\0" % len(config) + config).hexdigest()  # a regular (non-LFS) file's etag
    assert os.readlink(snap / "config.json") == f"../../blobs/{git_sha1}"
    assert check(cache, TARGET) is None


def test_missing_snapshot_names_repo_revision_and_what_is_cached(tmp_path):
    cache = tmp_path / "cache"
    seed(_model_dir(tmp_path / "src"), cache, REPO_ID, "f" * 40)
    problem = check(cache, TARGET)
    assert problem is not None
    line = problem.line
    assert REPO_ID in line and REV in line and f"snapshots/{REV}/" in line
    assert "cached revisions: ffffffffffff" in line and "kiln fetch" in line and "\n" not in line


def test_partial_snapshot_names_the_missing_file(tmp_path):
    cache = tmp_path / "cache"
    snap = seed(_model_dir(tmp_path / "src", shards=3), cache, REPO_ID, REV)
    blob = (snap / "model-00002-of-00003.safetensors").resolve()
    blob.rename(blob.with_name(blob.name + ".incomplete"))  # what an interrupted download leaves
    problem = check(cache, TARGET)
    assert problem is not None and problem.file == "model-00002-of-00003.safetensors"
    assert "broken link" in problem.why and "of the 3 shards" in problem.why and "1 unfinished download" in problem.why


@pytest.mark.parametrize(
    "remove, named",
    [
        ("config.json", "config.json"),
        ("tokenizer.json", "tokenizer.json"),
        ("model.safetensors", "model.safetensors"),
    ],
)
def test_each_required_file_is_checked(tmp_path, remove, named):
    cache = tmp_path / "cache"
    snap = seed(_model_dir(tmp_path / "src"), cache, REPO_ID, REV)
    (snap / remove).unlink()
    problem = check(cache, TARGET)
    assert problem is not None and problem.file == named and problem.why.startswith("is missing")


def test_a_draft_model_needs_no_tokenizer(tmp_path):
    cache = tmp_path / "cache"
    snap = seed(_model_dir(tmp_path / "src"), cache, REPO_ID, REV)
    (snap / "tokenizer.json").unlink()
    assert check(cache, HfModel("draft", REPO_ID, REV, tokenizer=False)) is None


def test_an_index_naming_a_file_outside_the_snapshot_is_refused(tmp_path):
    cache = tmp_path / "cache"
    src = _model_dir(tmp_path / "src", shards=2)
    index = json.loads((src / "model.safetensors.index.json").read_text())
    index["weight_map"]["evil"] = "../../../../etc/passwd"
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    seed(src, cache, REPO_ID, REV)
    problem = check(cache, TARGET)
    assert problem is not None and "outside the snapshot" in problem.why


def test_in_image_check_runs_alone_and_exits_93_with_one_line(tmp_path):
    """The copy in every engine image (/opt/kiln/lib/kiln_hfcache.py) runs without kiln."""
    cache = tmp_path / "cache"
    seed(_model_dir(tmp_path / "src"), cache, REPO_ID, REV)
    script = Path(hf_cache.__file__)
    models = json.dumps([TARGET.to_json()])
    ok = subprocess.run(
        [sys.executable, "-I", str(script), str(cache), models], capture_output=True, text=True, check=False
    )
    assert ok.returncode == 0, ok.stderr
    (snapshot_dir(cache, REPO_ID, REV) / "model.safetensors").resolve().unlink()
    bad = subprocess.run(
        [sys.executable, "-I", str(script), str(cache), models], capture_output=True, text=True, check=False
    )
    assert bad.returncode == 93
    assert bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
    assert REPO_ID in bad.stderr and REV in bad.stderr and "model.safetensors" in bad.stderr


def test_fetch_failure_is_one_line_naming_the_model(tmp_path):
    def offline(repo, revision, into):
        raise ConnectionError("Failed to resolve 'huggingface.co'\n  (a long traceback-ish tail)")

    with pytest.raises(FetchFailed) as err:
        fetch([TARGET], tmp_path / "cache", download=offline)
    assert err.value.exit_code == 94
    assert err.value.message == (
        f"target model {REPO_ID} at revision {REV}: download failed: "
        "ConnectionError: Failed to resolve 'huggingface.co'"
    )


def test_a_download_that_leaves_the_snapshot_incomplete_is_refused(tmp_path):
    def half(repo, revision, into):
        snap = seed(_model_dir(tmp_path / "src"), into, repo, revision)
        (snap / "model.safetensors").unlink()

    with pytest.raises(HfSnapshotMissing, match=r"after the download: .*model.safetensors is missing"):
        fetch([TARGET], tmp_path / "cache", download=half)


# -- recipes ------------------------------------------------------------------------------------
def _recipe(tmp_path: Path, model: str) -> Path:
    src = (REPO / "recipes" / "tiny-moe-hf" / "recipe.yaml").read_text()
    head, rest = src.split("model:\n", 1)
    _, after = rest.split("launch:\n", 1)
    folder = tmp_path / "recipes" / "tiny-moe-hf"
    folder.mkdir(parents=True)
    (folder / "Dockerfile").write_text("ARG KILN_ENGINE_IMAGE\nFROM ${KILN_ENGINE_IMAGE}\n")
    (folder / "recipe.yaml").write_text(
        head
        + "model:\n"
        + model
        + "launch:\n"
        + after.replace("  speculative_config:\n    method: draft_model\n    num_speculative_tokens: 3\n", "")
    )
    for part in ("docker-images", "engine", "patches"):
        (tmp_path / part).symlink_to(REPO / part)
    return tmp_path


@pytest.mark.parametrize(
    "model, message",
    [
        ("  target:\n    source: hf\n    repo: org/x\n", "revision (a 40-hex commit) is required"),
        ("  target:\n    source: hf\n    repo: org/x\n    revision: main\n", "model.target.revision: must match"),
        (
            "  target:\n    source: hf\n    repo: org/x\n    revision: " + "a" * 40 + "\n    path: /models/x\n",
            "path is not used",
        ),
        ("  target:\n    source: hf\n    revision: " + "a" * 40 + "\n", "repo is required"),
        ("  target:\n    source: baked\n    path: /m\n    repo: org/x\n", "only allowed when source is hf"),
        (
            "  target:\n    source: hf\n    repo: ../x\n    revision: " + "a" * 40 + "\n",
            "model.target.repo: must match",
        ),
    ],
)
def test_hf_source_fields_are_checked(tmp_path, model, message):
    root = _recipe(tmp_path, model)
    result = run_kiln("check", "tiny-moe-hf", env={"KILN_ROOT": str(root)}, cwd=root)
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_launch_names_the_repo_and_revision_and_runs_offline():
    from kiln.domain.recipes.recipe import load_recipe
    from kiln.domain.serving.launch_command import launch_document

    doc = launch_document(load_recipe(REPO / "recipes" / "tiny-moe-hf"))
    argv = doc["argv"]
    assert argv[:3] == ["vllm", "serve", "kiln-test/tiny-qwen3moe"]
    assert argv[argv.index("--revision") + 1] == "2c5e1f0d4b8a7e6f9d3c2b1a0f9e8d7c6b5a4f3e"
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert (
        spec["model"] == "kiln-test/tiny-qwen3-draft" and spec["revision"] == "7a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d"
    )
    assert doc["env"]["HF_HUB_OFFLINE"] == "1" and doc["env"]["HF_HUB_CACHE"] == "/hf-cache"
    assert [m["role"] for m in doc["hf_models"]] == ["target", "draft"]
    assert doc["hf_models"][1]["tokenizer"] is False


def test_run_print_mounts_the_cache_read_only(tmp_path):
    result = run_kiln("run", "tiny-moe-hf", "--print", env={"KILN_HF_CACHE": str(tmp_path / "hub")})
    assert result.returncode == 0, result.stderr
    assert f"-v {tmp_path / 'hub'}:/hf-cache:ro" in result.stdout
    assert "-e HF_HUB_OFFLINE=1" in result.stdout and "-e HF_HUB_CACHE=/hf-cache" in result.stdout


def test_run_refuses_an_incomplete_cache_before_docker_with_one_line_per_model(tmp_path):
    cache = tmp_path / "hub"
    seed(_model_dir(tmp_path / "src"), cache, "kiln-test/tiny-qwen3moe", "2c5e1f0d4b8a7e6f9d3c2b1a0f9e8d7c6b5a4f3e")
    result = run_kiln("run", "tiny-moe-hf", env={"KILN_HF_CACHE": str(cache), "DOCKER_HOST": "unix:///nonexistent"})
    assert result.returncode == 93, result.stderr
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("kiln: error:")]
    assert len(errors) == 1 and "kiln-test/tiny-qwen3-draft at revision 7a1b2c3d" in errors[0]
    assert "recipes/tiny-moe-hf/recipe.yaml:" in errors[0] and "Traceback" not in result.stderr


def test_render_mounts_the_pvc_waits_for_the_weights_and_fetches_with_a_job(tmp_path):
    import sys as _sys

    _sys.path.insert(0, str(REPO / "tests" / "k8s"))
    from test_render_k8s import validate  # the strict schemas the k8s tests validate with

    image = "registry.example.com/kiln/qwen3-30b-a3b@sha256:" + "ab" * 32
    result = run_kiln(
        "render", "k8s", "qwen3-30b-a3b", "--image", image, "-o", str(tmp_path), "--hf-cache-pvc", "shared-hf"
    )
    assert result.returncode == 0, result.stderr
    objects = {yaml.safe_load(p.read_text())["kind"]: yaml.safe_load(p.read_text()) for p in tmp_path.glob("*.yaml")}
    assert set(objects) == {"Deployment", "Service", "Job"}
    for obj in objects.values():
        validate(obj)
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["hf-cache"]["persistentVolumeClaim"] == {"claimName": "shared-hf", "readOnly": True}
    [init] = pod["initContainers"]
    assert init["args"] == ["--check-models", "--wait-models"] and init["image"] == image
    [serve] = pod["containers"]
    env = {e["name"]: e.get("value") for e in serve["env"]}
    assert env["HF_HUB_OFFLINE"] == "1" and env["HF_HUB_CACHE"] == "/hf-cache"
    assert {m["mountPath"]: m.get("readOnly") for m in serve["volumeMounts"]}["/hf-cache"] is True
    job = objects["Job"]["spec"]["template"]["spec"]
    [fetcher] = job["containers"]
    assert fetcher["args"] == ["--fetch-models"]
    jenv = {e["name"]: e for e in fetcher["env"]}
    assert jenv["HF_HUB_OFFLINE"]["value"] == "0"
    assert jenv["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["optional"] is True  # never a literal token
    assert {v["name"]: v for v in job["volumes"]}["hf-cache"]["persistentVolumeClaim"] == {"claimName": "shared-hf"}
    assert fetcher["securityContext"]["readOnlyRootFilesystem"] is True


def test_render_of_a_recipe_without_hf_models_has_no_job(tmp_path):
    image = "registry.example.com/kiln/glm53-kindling-2node@sha256:" + "ab" * 32
    result = run_kiln("render", "k8s", "glm53-kindling-2node", "--image", image, "-o", str(tmp_path))
    assert result.returncode == 0, result.stderr
    kinds = {yaml.safe_load(p.read_text())["kind"] for p in tmp_path.glob("*.yaml")}
    assert kinds == {"LeaderWorkerSet", "Service"}


def test_repo_folder_is_the_hub_clients():
    assert _repo_folder("Qwen/Qwen3-30B-A3B") == "models--Qwen--Qwen3-30B-A3B"
