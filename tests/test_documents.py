"""Every document kiln reads back goes through the TypedDict that writes it
(kiln.basics.documents). For each reader: the document as its writer writes it is read as
before; one with a field of the wrong type, one with a required field missing and one that
is not JSON (or YAML) at all each stop the reader with one line naming the file (or the
answer) and the field, and the exit code of the reader's family, never a traceback."""

from __future__ import annotations

import base64
import json

import pytest
import yaml
from document_readers import (
    BASE_LOCK,
    CPU_LOCK,
    IMAGE_CONFIG,
    IMAGE_ID,
    SAVED_MANIFEST,
    Reader,
    build_record,
    drop_field,
    publish_record,
    read_base_lock,
    read_base_spec,
    read_builds,
    read_docker_config,
    read_engine_lock,
    read_engine_probe,
    read_index,
    read_inventory,
    read_manifest,
    read_measured,
    read_model_config,
    read_patches_label,
    read_probe,
    read_project_page,
    read_proofs,
    read_published,
    read_quilt,
    read_rebuilt_show,
    read_save_config,
    read_save_manifest,
    read_smoke,
    read_token,
    set_field,
)
from kilntest import REPO, passing_smoke_record

from kiln.basics.documents import _field_path
from kiln.basics.errors import (
    BaseLockMismatch,
    BuildFailed,
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

READERS = [
    Reader(
        "smoke record",
        lambda: passing_smoke_record(IMAGE_ID, "tiny-moe"),
        read_smoke,
        RecordInvalid,
        47,
        "smoke/",
        (("checks", 0, "ok"), "yes"),
        ("timings",),
    ),
    Reader(
        "build record",
        build_record,
        read_builds,
        RecordInvalid,
        47,
        ".jsonl: line 2",
        (("layers", 0), 3),
        ("revision",),
    ),
    Reader(
        "publish record",
        publish_record,
        read_published,
        RecordInvalid,
        47,
        "tiny-moe-publish-",
        (("smoke", "status"), 1),
        ("pinned",),
    ),
    Reader(
        "engine lock",
        lambda: json.loads(CPU_LOCK.read_text()),
        read_engine_lock,
        LockInvalid,
        27,
        "vllm-0.32.0.lock.json",
        (("python_packages", 0, "wheels", "linux/amd64", "file"), 5),
        ("engine", "distribution"),
    ),
    Reader(
        "base lock",
        lambda: json.loads(BASE_LOCK.read_text()),
        read_base_lock,
        BaseLockMismatch,
        33,
        "bookworm.lock.json",
        (("packages", "apt:amd64"), 2),
        ("packages",),
    ),
    Reader(
        "base spec",
        lambda: yaml.safe_load((REPO / "docker-images/base/base.yaml").read_text()),
        read_base_spec,
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
        read_probe,
        BuildFailed,
        5,
        "its answer",
        (("flags", "max-num-seqs", "takes_value"), "yes"),
        ("jobs",),
    ),
    Reader(
        "engine probe answer",
        lambda: {"torch": "2.13.0", "cuda": None, "nccl": None},
        read_engine_probe,
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
        read_proofs,
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
        read_inventory,
        SbomReadFailed,
        96,
        "SBOM read in sha256:",
        (("model_files", 0, "size"), "2"),
        ("model_files", 0, "sha256"),
    ),
    Reader(
        "patches label",
        lambda: {"0001-x.patch": "sha256:" + "34" * 32},
        read_patches_label,
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
        read_quilt,
        PatchInvalid,
        30,
        "kiln.json",
        (("patches", 0, "exact"), "yes"),
        ("final",),
    ),
    Reader(
        "docker save manifest",
        lambda: SAVED_MANIFEST,
        read_save_manifest,
        BuildFailed,
        5,
        "docker save: manifest.json",
        ((0, "Layers"), "layer.tar"),
        (0, "Config"),
    ),
    Reader(
        "docker save config",
        lambda: IMAGE_CONFIG,
        read_save_config,
        BuildFailed,
        5,
        "docker save: cfg.json",
        (("rootfs", "diff_ids"), "sha256:x"),
        None,
    ),
    Reader(
        "rebuilt revision's kiln show",
        lambda: {"engine_image": {"tag": "kiln/engine-cpu:x", "input_digest": "d"}},
        read_rebuilt_show,
        BuildFailed,
        5,
        "kiln show tiny-moe --json at that revision",
        (("engine_image", "tag"), None),
        ("engine_image", "input_digest"),
    ),
    Reader(
        "docker config",
        lambda: {"auths": {"reg.example": {"auth": base64.b64encode(b"u:p").decode()}}},
        read_docker_config,
        RegistryAuthFailed,
        11,
        "config.json",
        (("auths", "reg.example"), "u:p"),
        None,
    ),
    Reader(
        "token answer",
        lambda: {"token": "t0k"},
        read_token,
        RegistryAuthFailed,
        11,
        "token service for reg.example",
        (("token",), 7),
        None,
    ),
    Reader(
        "image manifest",
        lambda: {"schemaVersion": 2, "config": {"digest": IMAGE_ID}},
        read_manifest,
        ManifestMismatch,
        43,
        "manifest sha256:",
        (("config", "digest"), 5),
        ("config", "digest"),
    ),
    Reader(
        "image index",
        lambda: {"manifests": [{"digest": IMAGE_ID, "platform": {"os": "linux"}}]},
        read_index,
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
        read_project_page,
        PackageIndexInvalid,
        38,
        "package index https://index.example/simple/six/",
        (("files", 0, "yanked"), 1),
        ("files", 0, "url"),
    ),
    Reader(
        "model config.json",
        lambda: {"hidden_size": 64},
        read_model_config,
        ModelShapeUnknown,
        95,
        "config.json",
        ((), ["hidden_size"]),
        None,
    ),
    Reader(
        "measured build",
        lambda: {"engine": "0.33.0", "platform": None, "engine_build": {"size": 7 << 30}},
        read_measured,
        RecordInvalid,
        47,
        "build-cuda.json",
        (("engine_build", "size"), "7 GB"),
        ("engine",),
    ),
]


def _corrupt(reader: Reader, kind: str) -> tuple[bytes, str]:
    """(the corrupted document, what its message must say about the field)."""
    if kind == "wrong type":
        loc, value = reader.wrong
        return reader.dump(set_field(reader.valid(), loc, value)), (
            f"{_field_path(loc)}: " if loc else ": Input should be"
        )
    if kind == "missing field":
        assert reader.missing is not None
        parent = _field_path(reader.missing[:-1])
        return reader.dump(
            drop_field(reader.valid(), reader.missing)
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
