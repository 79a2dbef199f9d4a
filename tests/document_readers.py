"""The readers of tests/test_documents*.py: each kind of document kiln reads back, put where
its reader reads it (a file, a daemon's or a registry's answer) and read."""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Self

import pytest
from kilntest import REPO

from kiln.basics.errors import (
    KilnError,
)
from kiln.domain.imagecheck import engine_stamp, in_image_smoke, launch_arg_check
from kiln.domain.locks import base_lock
from kiln.domain.locks import engine_lock as L
from kiln.domain.patching import bump_report, quilt_state
from kiln.domain.planning import model_shape
from kiln.domain.publishing import publish_records
from kiln.domain.reproducible import save_archive
from kiln.domain.supplychain import cyclonedx, sbom
from kiln.infra import credentials, package_index, records, registry_auth
from kiln.infra.docker import DockerDaemon
from kiln.infra.manifests import Manifest, index_children
from kiln.inimage import launch_arg_probe
from kiln.usecases import rebuild

IMAGE_ID = "sha256:" + "5c" * 32
CPU_LOCK = REPO / "docker-images" / "engine-cpu" / "locks" / "vllm-0.32.0.lock.json"
BASE_LOCK = REPO / "docker-images" / "base" / "locks" / "bookworm.lock.json"
GARBAGE = b"{not json at all"
Loc = tuple[str | int, ...]


# -- the readers ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Reader:
    """One reader of one kind of document: `run(data, tmp_path, monkeypatch)` puts `data`
    where the reader reads it and reads it."""

    name: str
    valid: Callable[[], Any]  # the document as its writer writes it
    run: Callable[[bytes, Path, pytest.MonkeyPatch], object]
    error: type[KilnError]
    exit_code: int
    where: str  # what the message names as the source
    wrong: tuple[Loc, object]  # a field and a value of the wrong type for it
    missing: Loc | None  # a required field (None: the type has none)
    dump: Callable[[Any], bytes] = lambda doc: json.dumps(doc).encode()
    garbage: bytes = GARBAGE
    garbage_says: str = "not JSON ("


def write_at(tmp_path: Path, rel: str, data: bytes) -> Path:
    path = tmp_path / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def results_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("KILN_RESULTS_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def read_smoke(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    results_dir(mp, tmp_path)
    records.record_path(IMAGE_ID).write_bytes(data)
    return records.passing_smoke_record(IMAGE_ID)


def build_record() -> dict[str, Any]:
    return {
        "image_id": IMAGE_ID,
        "built_id": "sha256:" + "1" * 64,
        "tags": ["kiln/tiny-moe:latest"],
        "input_digest": "sha256:" + "2" * 64,
        "source_date": 1700000000,
        "revision": "abc123",
        "layers": ["sha256:" + "3" * 64],
        "started": "2026-01-01T00:00:00Z",
        "finished": "2026-01-01T00:01:00Z",
        "build_seconds": 60.0,
        "normalise_seconds": 1,
    }


def read_builds(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    results_dir(mp, tmp_path)
    records._build_record_path(IMAGE_ID).write_bytes(json.dumps(build_record()).encode() + b"\n" + data + b"\n")
    return records.build_records(IMAGE_ID)


def publish_record() -> dict[str, Any]:
    doc = publish_records.publish_document(
        publish_records.PublishResult(
            recipe="tiny-moe",
            image_id=IMAGE_ID,
            input_digest="sha256:" + "2" * 64,
            manifest_digest="sha256:" + "4" * 64,
            registry="registry.example.com",
            repository="kiln/tiny-moe",
            channel="experimental",
            tags=["experimental"],
            pushed=True,
        )
    )
    return {"kind": "publish", **doc}


def read_published(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    write_at(results_dir(mp, tmp_path), "publish/tiny-moe-publish-20260101T000000Z.json", data)
    return publish_records.published_image("tiny-moe", "sha256:" + "2" * 64)


def read_engine_lock(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    return L.load(write_at(tmp_path, "vllm-0.32.0.lock.json", data))


def read_base_lock(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    packages = json.loads(BASE_LOCK.read_text())["packages"]
    base_lock.check_lock(base_lock.BaseSpec.load(), packages, write_at(tmp_path, "bookworm.lock.json", data))
    return None


def read_base_spec(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    return base_lock.BaseSpec.load(write_at(tmp_path, "base.yaml", data))


def answering_daemon(marker: str, data: bytes) -> DockerDaemon:
    """A daemon whose throwaway container prints `marker data` and exits 0."""
    box = SimpleNamespace(
        name="probe-1",
        short_id="abc",
        start=lambda: None,
        wait=lambda timeout: {"StatusCode": 0},
        logs=lambda: marker.encode() + b" " + data + b"\n",
        remove=lambda force: None,
    )
    return DockerDaemon(SimpleNamespace(containers=SimpleNamespace(create=lambda **kw: box)))


def read_probe(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    return launch_arg_check._probe(answering_daemon(launch_arg_probe.MARKER, data), IMAGE_ID, dump=True, jobs=[])


def read_engine_probe(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    return engine_stamp._probe(answering_daemon("KILN-PROBE", data), IMAGE_ID)


def read_proofs(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    return in_image_smoke.gather(answering_daemon(in_image_smoke._MARKER, data), IMAGE_ID, ["vllm"])


def read_inventory(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    return sbom._read_inventory(answering_daemon(sbom._MARKER, data), IMAGE_ID)


def read_patches_label(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    return cyclonedx._patch_components(None, {"ai.kiln.patches": data.decode()})


def read_quilt(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    write_at(tmp_path, f"scratch/.pc/{quilt_state.STATE_FILE}", data)
    return quilt_state.read_state(tmp_path / "scratch")


def saved_archive(manifest: bytes, config: bytes, tmp_path: Path) -> object:
    write_at(tmp_path, "saved/manifest.json", manifest)
    write_at(tmp_path, "saved/cfg.json", config)
    return save_archive.normalise_saved(tmp_path / "saved", 1700000000)


SAVED_MANIFEST = [{"Config": "cfg.json", "RepoTags": None, "Layers": []}]
IMAGE_CONFIG = {
    "architecture": "amd64",
    "os": "linux",
    "rootfs": {"type": "layers", "diff_ids": []},
    "history": [{"created_by": "FROM scratch"}],
    "config": {"Hostname": "builder"},
}


def read_save_manifest(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    return saved_archive(data, json.dumps(IMAGE_CONFIG).encode(), tmp_path)


def read_save_config(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    return saved_archive(json.dumps(SAVED_MANIFEST).encode(), data, tmp_path)


def read_rebuilt_show(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    mp.setattr(rebuild, "_kiln", lambda tree, *args: subprocess.CompletedProcess(args, 0, stdout=data.decode()))
    return rebuild._reuse_local(SimpleNamespace(image=lambda ref: None), tmp_path, "tiny-moe")


def read_docker_config(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    mp.setenv("DOCKER_CONFIG", str(tmp_path))
    write_at(tmp_path, "config.json", data)
    return credentials._from_docker_config("reg.example")


def read_token(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    answer = SimpleNamespace(status_code=200, content=data)
    session = SimpleNamespace(get=lambda *a, **k: answer, post=lambda *a, **k: answer)
    return registry_auth._token(
        session,
        {"realm": "https://auth.example/token"},
        host="reg.example",
        path="kiln/x",
        credentials=None,
        timeout=(1, 1),
    )


def read_manifest(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    return Manifest("sha256:" + "6" * 64, "application/vnd.oci.image.manifest.v1+json", data).config_digest


def read_index(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    return index_children(Manifest("sha256:" + "7" * 64, "application/vnd.oci.image.index.v1+json", data))


class FakePage:
    """What urlopen returns: a context manager whose read() is the page."""

    def __init__(self, data: bytes):
        self.data = data

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> bool:
        return False

    def read(self) -> bytes:
        return self.data


def read_project_page(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    mp.setattr(package_index.urllib.request, "urlopen", lambda req, **kw: FakePage(data))
    return package_index.project("six", cafile=None, index="https://index.example/simple")


def read_model_config(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    return model_shape._from_file(write_at(tmp_path, "model/config.json", data))


def read_measured(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    return bump_report.measured_sizes([write_at(tmp_path, "build-cuda.json", data)], "0.33.0", "0.34.0")


def set_field(doc: Any, loc: Loc, value: object) -> Any:
    if not loc:
        return value
    out = copy.deepcopy(doc)
    node = out
    for step in loc[:-1]:
        node = node[step]
    node[loc[-1]] = value
    return out


def drop_field(doc: Any, loc: Loc) -> Any:
    out = copy.deepcopy(doc)
    node = out
    for step in loc[:-1]:
        node = node[step]
    del node[loc[-1]]
    return out
