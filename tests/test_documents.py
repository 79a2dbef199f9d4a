"""Every document kiln reads back goes through the TypedDict that writes it
(kiln.basics.documents). For each reader: the document as its writer writes it is read as
before; one with a field of the wrong type, one with a required field missing and one that
is not JSON (or YAML) at all each stop the reader with one line naming the file (or the
answer) and the field, and the exit code of the reader's family, never a traceback."""

from __future__ import annotations

import base64
import copy
import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NotRequired, Self, TypedDict

import pytest
import yaml
from kilntest import REPO, passing_smoke_record, run_kiln

from kiln.basics import documents
from kiln.basics.documents import Shape, _field_path, read_document
from kiln.basics.errors import (
    BaseLockMismatch,
    BuildFailed,
    KilnError,
    LockInvalid,
    ManifestMismatch,
    ModelShapeUnknown,
    PackageIndexInvalid,
    PatchInvalid,
    RecipeInvalid,
    RecordInvalid,
    RegistryAuthFailed,
    SbomReadFailed,
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
from kiln.infra.registry import _error_code
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


def _at(tmp_path: Path, rel: str, data: bytes) -> Path:
    path = tmp_path / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _results(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("KILN_RESULTS_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def _smoke(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    _results(mp, tmp_path)
    records.record_path(IMAGE_ID).write_bytes(data)
    return records.passing_smoke_record(IMAGE_ID)


def _build_record() -> dict[str, Any]:
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


def _builds(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    _results(mp, tmp_path)
    records._build_record_path(IMAGE_ID).write_bytes(json.dumps(_build_record()).encode() + b"\n" + data + b"\n")
    return records.build_records(IMAGE_ID)


def _publish_record() -> dict[str, Any]:
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


def _published(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    _at(_results(mp, tmp_path), "publish/tiny-moe-publish-20260101T000000Z.json", data)
    return publish_records.published_image("tiny-moe", "sha256:" + "2" * 64)


def _engine_lock(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    return L.load(_at(tmp_path, "vllm-0.32.0.lock.json", data))


def _base_lock(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    packages = json.loads(BASE_LOCK.read_text())["packages"]
    base_lock.check_lock(base_lock.BaseSpec.load(), packages, _at(tmp_path, "bookworm.lock.json", data))
    return None


def _base_spec(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    return base_lock.BaseSpec.load(_at(tmp_path, "base.yaml", data))


def _answering(marker: str, data: bytes) -> DockerDaemon:
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


def _probe(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    return launch_arg_check._probe(_answering(launch_arg_probe.MARKER, data), IMAGE_ID, dump=True, jobs=[])


def _engine_probe(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    return engine_stamp._probe(_answering("KILN-PROBE", data), IMAGE_ID)


def _proofs(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    return in_image_smoke.gather(_answering(in_image_smoke._MARKER, data), IMAGE_ID, ["vllm"])


def _inventory(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    return sbom._read_inventory(_answering(sbom._MARKER, data), IMAGE_ID)


def _patches_label(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    return cyclonedx._patch_components(None, {"ai.kiln.patches": data.decode()})


def _quilt(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    _at(tmp_path, f"scratch/.pc/{quilt_state.STATE_FILE}", data)
    return quilt_state.read_state(tmp_path / "scratch")


def _saved(manifest: bytes, config: bytes, tmp_path: Path) -> object:
    _at(tmp_path, "saved/manifest.json", manifest)
    _at(tmp_path, "saved/cfg.json", config)
    return save_archive.normalise_saved(tmp_path / "saved", 1700000000)


SAVED_MANIFEST = [{"Config": "cfg.json", "RepoTags": None, "Layers": []}]
IMAGE_CONFIG = {
    "architecture": "amd64",
    "os": "linux",
    "rootfs": {"type": "layers", "diff_ids": []},
    "history": [{"created_by": "FROM scratch"}],
    "config": {"Hostname": "builder"},
}


def _save_manifest(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    return _saved(data, json.dumps(IMAGE_CONFIG).encode(), tmp_path)


def _save_config(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    return _saved(json.dumps(SAVED_MANIFEST).encode(), data, tmp_path)


def _rebuilt_show(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    mp.setattr(rebuild, "_kiln", lambda tree, *args: subprocess.CompletedProcess(args, 0, stdout=data.decode()))
    return rebuild._reuse_local(SimpleNamespace(image=lambda ref: None), tmp_path, "tiny-moe")


def _docker_config(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    mp.setenv("DOCKER_CONFIG", str(tmp_path))
    _at(tmp_path, "config.json", data)
    return credentials._from_docker_config("reg.example")


def _token(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
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


def _manifest(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    return Manifest("sha256:" + "6" * 64, "application/vnd.oci.image.manifest.v1+json", data).config_digest


def _index(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    return index_children(Manifest("sha256:" + "7" * 64, "application/vnd.oci.image.index.v1+json", data))


class _Page:
    """What urlopen returns: a context manager whose read() is the page."""

    def __init__(self, data: bytes):
        self.data = data

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> bool:
        return False

    def read(self) -> bytes:
        return self.data


def _project_page(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    mp.setattr(package_index.urllib.request, "urlopen", lambda req, **kw: _Page(data))
    return package_index.project("six", cafile=None, index="https://index.example/simple")


def _model_config(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    return model_shape._from_file(_at(tmp_path, "model/config.json", data))


def _measured(data: bytes, tmp_path: Path, mp: pytest.MonkeyPatch) -> object:
    return bump_report.measured_sizes([_at(tmp_path, "build-cuda.json", data)], "0.33.0", "0.34.0")


READERS = [
    Reader(
        "smoke record",
        lambda: passing_smoke_record(IMAGE_ID, "tiny-moe"),
        _smoke,
        RecordInvalid,
        47,
        "smoke/",
        (("checks", 0, "ok"), "yes"),
        ("timings",),
    ),
    Reader(
        "build record", _build_record, _builds, RecordInvalid, 47, ".jsonl: line 2", (("layers", 0), 3), ("revision",)
    ),
    Reader(
        "publish record",
        _publish_record,
        _published,
        RecordInvalid,
        47,
        "tiny-moe-publish-",
        (("smoke", "status"), 1),
        ("pinned",),
    ),
    Reader(
        "engine lock",
        lambda: json.loads(CPU_LOCK.read_text()),
        _engine_lock,
        LockInvalid,
        27,
        "vllm-0.32.0.lock.json",
        (("python_packages", 0, "wheels", "linux/amd64", "file"), 5),
        ("engine", "distribution"),
    ),
    Reader(
        "base lock",
        lambda: json.loads(BASE_LOCK.read_text()),
        _base_lock,
        BaseLockMismatch,
        33,
        "bookworm.lock.json",
        (("packages", "apt:amd64"), 2),
        ("packages",),
    ),
    Reader(
        "base spec",
        lambda: yaml.safe_load((REPO / "docker-images/base/base.yaml").read_text()),
        _base_spec,
        RecipeInvalid,
        2,
        "base.yaml",
        (("include",), "ca-certificates"),
        ("suite",),
        dump=lambda doc: yaml.safe_dump(doc).encode(),
        garbage=b"suite: [unclosed",
        garbage_says="cannot be read as YAML",
    ),
    Reader(
        "launch probe answer",
        lambda: {
            "version": "0.32.0",
            "kiln_engine": None,
            "jobs": [],
            "flags": {"max-num-seqs": {"takes_value": True, "default_on": False}},
        },
        _probe,
        BuildFailed,
        5,
        "its answer",
        (("flags", "max-num-seqs", "takes_value"), "yes"),
        ("jobs",),
    ),
    Reader(
        "engine probe answer",
        lambda: {"torch": "2.13.0", "cuda": None, "nccl": None},
        _engine_probe,
        BuildFailed,
        5,
        "engine probe in sha256:",
        (("cuda",), 12.8),
        ("nccl",),
    ),
    Reader(
        "in-image proofs",
        lambda: {
            "machine": "aarch64",
            "torch": None,
            "cuda": None,
            "vllm": None,
            "imports": {"vllm": "ok"},
            "plugins": [],
            "draft_trunc": None,
        },
        _proofs,
        BuildFailed,
        5,
        "in-image proofs in sha256:",
        (("imports", "vllm"), False),
        ("machine",),
    ),
    Reader(
        "SBOM inventory",
        lambda: {
            "python": "3.11.2",
            "model_files": [{"path": "/models/m/config.json", "root": "/models", "size": 2, "sha256": "ab" * 32}],
        },
        _inventory,
        SbomReadFailed,
        96,
        "SBOM read in sha256:",
        (("model_files", 0, "size"), "2"),
        ("model_files", 0, "sha256"),
    ),
    Reader(
        "patches label",
        lambda: {"0001-x.patch": "sha256:" + "34" * 32},
        _patches_label,
        SbomReadFailed,
        96,
        "label ai.kiln.patches",
        (("0001-x.patch",), 1),
        None,
    ),
    Reader(
        "quilt state",
        lambda: {
            "engine": "0.32.0",
            "flavour": "cpu",
            "series_from": "patches/vllm/0.32.0",
            "feature": None,
            "final": {"vllm/x.py": "ab" * 32},
            "patches": [
                {
                    "name": "0001-x.patch",
                    "sha256": "cd" * 32,
                    "exact": True,
                    "before": {"vllm/x.py": None},
                    "after": {"vllm/x.py": "ab" * 32},
                }
            ],
        },
        _quilt,
        PatchInvalid,
        30,
        "kiln.json",
        (("patches", 0, "exact"), "yes"),
        ("final",),
    ),
    Reader(
        "docker save manifest",
        lambda: SAVED_MANIFEST,
        _save_manifest,
        BuildFailed,
        5,
        "docker save: manifest.json",
        ((0, "Layers"), "layer.tar"),
        (0, "Config"),
    ),
    Reader(
        "docker save config",
        lambda: IMAGE_CONFIG,
        _save_config,
        BuildFailed,
        5,
        "docker save: cfg.json",
        (("rootfs", "diff_ids"), "sha256:x"),
        None,
    ),
    Reader(
        "rebuilt revision's kiln show",
        lambda: {"engine_image": {"tag": "kiln/engine-cpu:x", "input_digest": "d"}},
        _rebuilt_show,
        BuildFailed,
        5,
        "kiln show tiny-moe --json at that revision",
        (("engine_image", "tag"), None),
        ("engine_image", "input_digest"),
    ),
    Reader(
        "docker config",
        lambda: {"auths": {"reg.example": {"auth": base64.b64encode(b"u:p").decode()}}},
        _docker_config,
        RegistryAuthFailed,
        11,
        "config.json",
        (("auths", "reg.example"), "u:p"),
        None,
    ),
    Reader(
        "token answer",
        lambda: {"token": "t0k"},
        _token,
        RegistryAuthFailed,
        11,
        "token service for reg.example",
        (("token",), 7),
        None,
    ),
    Reader(
        "image manifest",
        lambda: {"schemaVersion": 2, "config": {"digest": IMAGE_ID}},
        _manifest,
        ManifestMismatch,
        43,
        "manifest sha256:",
        (("config", "digest"), 5),
        ("config", "digest"),
    ),
    Reader(
        "image index",
        lambda: {"manifests": [{"digest": IMAGE_ID, "platform": {"os": "linux"}}]},
        _index,
        ManifestMismatch,
        43,
        "image index sha256:",
        (("manifests", 0, "platform", "os"), ["linux"]),
        ("manifests", 0, "digest"),
    ),
    Reader(
        "package index page",
        lambda: {
            "name": "six",
            "files": [{"filename": "six-1.17.0-py3-none-any.whl", "url": "u", "hashes": {"sha256": "ab" * 32}}],
        },
        _project_page,
        PackageIndexInvalid,
        38,
        "package index https://index.example/simple/six/",
        (("files", 0, "yanked"), 1),
        ("files", 0, "url"),
    ),
    Reader(
        "model config.json",
        lambda: {"hidden_size": 64},
        _model_config,
        ModelShapeUnknown,
        95,
        "config.json",
        ((), ["hidden_size"]),
        None,
    ),
    Reader(
        "measured build",
        lambda: {"engine": "0.33.0", "platform": None, "engine_build": {"size": 7 << 30}},
        _measured,
        RecordInvalid,
        47,
        "build-cuda.json",
        (("engine_build", "size"), "7 GB"),
        ("engine",),
    ),
]


def _set(doc: Any, loc: Loc, value: object) -> Any:
    if not loc:
        return value
    out = copy.deepcopy(doc)
    node = out
    for step in loc[:-1]:
        node = node[step]
    node[loc[-1]] = value
    return out


def _drop(doc: Any, loc: Loc) -> Any:
    out = copy.deepcopy(doc)
    node = out
    for step in loc[:-1]:
        node = node[step]
    del node[loc[-1]]
    return out


def _corrupt(reader: Reader, kind: str) -> tuple[bytes, str]:
    """(the corrupted document, what its message must say about the field)."""
    if kind == "wrong type":
        loc, value = reader.wrong
        return reader.dump(_set(reader.valid(), loc, value)), (f"{_field_path(loc)}: " if loc else ": Input should be")
    if kind == "missing field":
        assert reader.missing is not None
        parent = _field_path(reader.missing[:-1])
        return reader.dump(
            _drop(reader.valid(), reader.missing)
        ), f"{parent + ': ' if parent else ''}missing field {str(reader.missing[-1])!r}"
    return reader.garbage, reader.garbage_says


CASES = [
    pytest.param(r, kind, id=f"{r.name}-{kind}")
    for r in READERS
    for kind in ("wrong type", "missing field", "not JSON")
    if kind != "missing field" or r.missing is not None
]


@pytest.mark.parametrize("reader", READERS, ids=lambda r: r.name)
def test_the_document_its_writer_writes_reads_as_before(reader, tmp_path, monkeypatch):
    reader.run(reader.dump(reader.valid()), tmp_path, monkeypatch)


@pytest.mark.parametrize(
    ("reader", "kind"), [c for c in CASES if c.values[0].name != "build record" or c.values[1] != "not JSON"]
)
def test_a_corrupt_document_is_one_line_naming_the_file_and_field(reader, kind, tmp_path, monkeypatch):
    data, says = _corrupt(reader, kind)
    with pytest.raises(reader.error) as err:
        reader.run(data, tmp_path, monkeypatch)
    message = err.value.message
    assert err.value.exit_code == reader.exit_code
    assert "\n" not in message and "Traceback" not in message, message
    assert reader.where in message and says in message, message


# -- what is not an error ----------------------------------------------------------------------
def test_a_build_record_line_cut_short_by_a_crash_is_skipped_with_a_warning(tmp_path, monkeypatch, capsys):
    found = _builds(b'{"image_id": "sha256:', tmp_path, monkeypatch)
    assert found == [_build_record()]
    assert ".jsonl: line 2: not JSON (a build record cut short by a crash?): skipped" in capsys.readouterr().err


def test_a_smoke_record_that_did_not_pass_is_no_error_and_none_is_none(tmp_path, monkeypatch):
    assert (
        _smoke(
            json.dumps({**passing_smoke_record(IMAGE_ID, "tiny-moe"), "passed": False}).encode(), tmp_path, monkeypatch
        )
        is None
    )
    records.record_path(IMAGE_ID).unlink()
    assert records.passing_smoke_record(IMAGE_ID) is None


def test_a_damaged_launch_cache_entry_is_asked_again_with_a_warning(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    answer = {
        "version": "0.32.0",
        "kiln_engine": None,
        "jobs": [],
        "flags": {"max-num-seqs": {"takes_value": True, "default_on": False}},
    }
    docker = _answering(launch_arg_probe.MARKER, json.dumps(answer).encode())
    assert launch_arg_check.engine_args(docker, IMAGE_ID).flags == answer["flags"]  # asked, then cached
    cache = launch_arg_check._cache_file(IMAGE_ID)
    entry = json.loads(cache.read_text())
    cache.write_text(json.dumps({**entry, "flags": {"max-num-seqs": {"takes_value": "yes"}}}))
    asked = []
    monkeypatch.setattr(launch_arg_check, "_probe", lambda *a, **k: asked.append(1) or answer)
    assert launch_arg_check.engine_args(docker, IMAGE_ID).flags == answer["flags"]
    assert asked == [1]
    err = capsys.readouterr().err
    assert "argcheck/" in err and "flags[max-num-seqs].takes_value: Input should be a valid boolean" in err
    assert "a damaged cache entry, asked the engine image again" in err
    # an entry of another schema is asked again without a word
    cache.write_text(json.dumps({"schema": launch_arg_check._SCHEMA - 1}))
    assert launch_arg_check.engine_args(docker, IMAGE_ID).flags == answer["flags"]
    assert asked == [1, 1] and "damaged" not in capsys.readouterr().err


def test_a_registry_error_body_that_is_not_one_adds_nothing():
    assert _error_code(SimpleNamespace(content=b'{"errors": [{"code": "DENIED", "message": "no"}]}')) == ": DENIED no"
    for body in (b"<html>502</html>", b"[]", b'{"errors": [{"message": 5}]}'):
        assert _error_code(SimpleNamespace(content=body)) == ""


def test_render_k8s_stops_at_a_damaged_publish_record_with_exit_47(tmp_path):
    """The whole way through the CLI: one `kiln: error:` line naming the file and the field."""
    state = tmp_path / "state"
    doc = _set(_publish_record(), ("smoke", "status"), 1)
    _at(state, "publish/tiny-moe-publish-20260101T000000Z.json", json.dumps(doc).encode())
    result = run_kiln(
        "render",
        "k8s",
        "tiny-moe",
        env={"KILN_RESULTS_DIR": str(state), "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"},
    )
    assert result.returncode == 47, result.stderr
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("kiln: error:")]
    assert errors == [
        "kiln: error: "
        + str(state / "publish" / "tiny-moe-publish-20260101T000000Z.json")
        + ": smoke.status: Input should be 'passed' or 'skipped'"
    ], result.stderr
    assert "Traceback" not in result.stderr


# -- the helper itself ---------------------------------------------------------------------------
class _Inner(TypedDict):
    n: int
    note: NotRequired[str]


class _Outer(TypedDict, total=False):
    inner: _Inner
    flags: dict[str, bool]


OUTER = Shape(_Outer)


def _problem(data: str | bytes) -> str:
    with pytest.raises(KilnError) as err:
        OUTER.parse(data, source="x.json", error=KilnError)
    return err.value.message


def test_types_are_strict_and_only_the_named_keys_are_kept():
    assert OUTER.parse('{"inner": {"n": 1, "extra": 2}, "other": 3}', source="x", error=KilnError) == {
        "inner": {"n": 1}
    }
    assert _problem('{"inner": {"n": "1"}}') == "x.json: inner.n: Input should be a valid integer"
    assert _problem('{"flags": {"a": 1}}') == "x.json: flags.a: Input should be a valid boolean"
    assert _problem('{"inner": {"note": "x"}}') == "x.json: inner: missing field 'n'"  # NotRequired kept its meaning
    assert _problem("[]") == "x.json: Input should be an object"
    assert _problem(b"\xff").startswith("x.json: not JSON (")


def test_a_hostile_key_cannot_split_the_line_and_no_value_is_quoted():
    message = _problem('{"flags": {"a\\nkiln: error: forged\\u001b[31m": "s3cret-token"}}')
    assert "\n" not in message and "\x1b" not in message
    assert "s3cret" not in message  # a value may be a credential: never in the message
    assert message == "x.json: flags[a\\nkiln: error: forged\\x1b[31m]: Input should be a valid boolean"


def test_read_document_names_a_file_it_cannot_read(tmp_path):
    with pytest.raises(RecordInvalid, match=r"^.*/nowhere\.json: cannot read: No such file or directory$"):
        read_document(tmp_path / "nowhere.json", OUTER, RecordInvalid)


def test_field_paths_read_like_kilns_own():
    assert (
        _field_path(("python_packages", 0, "wheels", "linux/amd64", "sha256"))
        == "python_packages[0].wheels[linux/amd64].sha256"
    )
    assert _field_path((0, "Layers")) == "[0].Layers"
    assert _field_path(()) == ""


def test_each_adapter_is_built_once():
    # (no timing here: a loaded CI host makes any bound flaky. Measured on the ~200 kB
    # engine-cuda lock: ~8 ms a load through the adapter, ~7 ms with the hand-written reader
    # before it, ~35 ms once to build the adapter)
    shape = Shape(_Outer)
    assert shape.adapter is shape.adapter
    assert documents._pydantic_type(_Outer) is documents._pydantic_type(_Outer)
    assert L._LOCK.adapter is L._LOCK.adapter


# -- in-image readers: plain checks (an image has no pydantic of kiln's) ------------------------
@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"dump": "yes"}', "KILN_ARGPROBE: dump: must be true or false"),
        ('{"jobs": [{"env": {}}]}', "KILN_ARGPROBE: jobs[0]: missing field 'groups'"),
        ('{"jobs": [{"groups": [["serve", 5]]}]}', "KILN_ARGPROBE: jobs[0].groups: must be lists of strings"),
        ("serve --model x", "KILN_ARGPROBE: not JSON (Expecting value"),
    ],
)
def test_the_launch_probe_refuses_a_request_it_cannot_read_in_one_line(text, says):
    assert launch_arg_probe._read_request(
        '{"dump": true, "jobs": [{"groups": [["serve", "m"]], "env": {"A": "1"}}]}'
    ) == {"dump": True, "jobs": [{"groups": [["serve", "m"]], "env": {"A": "1"}}]}
    with pytest.raises(SystemExit) as exc:
        launch_arg_probe._read_request(text)
    assert str(exc.value.code).startswith(says) and "\n" not in str(exc.value.code)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            '[{"role": "target", "repo": "org/m", "revision": 7}]',
            "kiln-serve: MODELS_JSON[0].revision: must be a string",
        ),
        ('[{"role": "target", "repo": "org/m"}]', "kiln-serve: MODELS_JSON[0].revision: must be a string"),
        ('{"role": "target"}', "kiln-serve: MODELS_JSON: must be a JSON list"),
        ("org/m@main", "kiln-serve: MODELS_JSON: not JSON ("),
    ],
)
def test_the_hf_cache_check_refuses_models_it_cannot_read_in_one_line(text, says):
    from kiln.inimage import hf_cache

    [model] = hf_cache._read_models('[{"role": "target", "repo": "org/m", "revision": "' + "a" * 40 + '"}]')
    assert (model.repo, model.tokenizer) == ("org/m", True)
    with pytest.raises(SystemExit) as exc:
        hf_cache._read_models(text)
    assert str(exc.value.code).startswith(says) and "\n" not in str(exc.value.code)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ('["/models", 3]', "KILN_SBOM_MODEL_ROOTS: must be a JSON list of paths"),
        ("/models", "KILN_SBOM_MODEL_ROOTS: not JSON ("),
    ],
)
def test_the_sbom_reader_refuses_roots_it_cannot_read_in_one_line(monkeypatch, value, says):
    from kiln.inimage import sbom_reader

    monkeypatch.setenv("KILN_SBOM_MODEL_ROOTS", '["/models"]')
    assert sbom_reader._env_paths("KILN_SBOM_MODEL_ROOTS") == ["/models"]
    monkeypatch.setenv("KILN_SBOM_MODEL_ROOTS", value)
    with pytest.raises(SystemExit) as exc:
        sbom_reader._env_paths("KILN_SBOM_MODEL_ROOTS")
    assert str(exc.value.code).startswith(says) and "\n" not in str(exc.value.code)


@pytest.mark.parametrize(
    ("overlay", "manifest", "says"),
    [
        ({"name": 5, "series": None, "replacements": []}, None, "overlay.json: name: must be a string"),
        (
            {"name": "f", "series": None, "replacements": [{"target": "vllm/x.py", "file": "x.py"}]},
            None,
            "overlay.json: replacements[0]: must hold the strings target, file and upstream_sha256",
        ),
        ("{", None, "overlay.json: not JSON ("),
        ({"name": "f", "series": None, "replacements": []}, '{"patches": {}}', "patches.json: patches: must be a list"),
    ],
)
def test_the_patch_applier_refuses_a_document_it_cannot_read_with_exit_30(tmp_path, capsys, overlay, manifest, says):
    from kiln.inimage import patch_applier

    (tmp_path / "root").mkdir()
    _at(tmp_path, "overlays/f/overlay.json", (overlay if isinstance(overlay, str) else json.dumps(overlay)).encode())
    if manifest is not None:
        _at(tmp_path, "patches.json", manifest.encode())
    code = patch_applier.main(
        [
            "apply-overlays",
            "--root",
            str(tmp_path / "root"),
            "--overlays",
            str(tmp_path / "overlays"),
            "--manifest-append",
            str(tmp_path / "patches.json"),
        ]
    )
    err = capsys.readouterr().err.splitlines()
    assert code == 30 and says in err[0] and len(err) == 2 and err[1].startswith("hint: "), err
