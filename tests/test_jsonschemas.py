"""src/kiln/schemas/*.json are generated from the `--json` documents' TypedDicts
(kiln.commands.json_schemas): each file is what its type generates now, and documents the
code builds validate against them (the commands the unit tier cannot run: build, smoke,
publish, promote, verify; tests/test_cli.py validates the others' real output)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from typing_extensions import TypedDict

from kiln.basics.errors import RecipeInvalid, SmokeFailed
from kiln.commands import json_schemas
from kiln.commands.images.build import _document
from kiln.domain.images.image_build import BuildOutcome
from kiln.domain.publishing.publish_records import (
    PlatformEntry,
    PromoteResult,
    PublishResult,
    SignatureEvidence,
    SmokeEvidence,
    promote_document,
    publish_document,
)
from kiln.domain.signing.layer_checks import _AttestationCheck
from kiln.domain.signing.signatures import Verification
from kiln.infra.records import CheckEntry, Timings
from kiln.usecases.build import BuildDocument
from kiln.usecases.doctor import DoctorCheck
from kiln.usecases.smoke import SmokeDocument, SmokeSkipped

D = [f"sha256:{c * 64}" for c in "abcdef"]  # six digests


def _validate(name: str, doc: Any) -> None:
    schema = json.loads((json_schemas._SCHEMAS / f"{name}.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(json.loads(json.dumps(doc)), schema, cls=jsonschema.Draft202012Validator)


def test_every_schema_file_is_what_its_type_generates():
    assert json_schemas._stale() == [], (
        "src/kiln/schemas/ differs from the --json documents' types: run `python -m kiln.commands.json_schemas`"
    )
    assert sorted(p.stem for p in json_schemas._SCHEMAS.glob("*.json")) == sorted(json_schemas.DOCUMENTS)


class _DoctorDocumentPlus(TypedDict):
    """A doctor document with one key more than kiln's."""

    ok: bool
    checks: list[DoctorCheck]
    machine: str


def test_a_changed_type_or_file_is_stale_and_regenerating_mends_it(tmp_path: Path):
    """The comparison can fail: a type with another key renders another file; an edited,
    a missing and an extra file are each named, and `write` puts the folder right."""
    doctor = (json_schemas._SCHEMAS / "doctor.json").read_text()
    assert json_schemas._rendered("doctor") == doctor
    assert '"machine"' in json_schemas._rendered("doctor", _DoctorDocumentPlus) != doctor
    folder = tmp_path / "schemas"
    shutil.copytree(json_schemas._SCHEMAS, folder)
    (folder / "build.json").write_text(doctor)
    (folder / "list.json").unlink()
    (folder / "old.json").write_text("{}\n")
    assert json_schemas._stale(folder) == ["build.json", "list.json", "old.json"]
    assert json_schemas._write(folder) == ["build.json", "list.json", "old.json"]
    assert json_schemas._stale(folder) == [] and not (folder / "old.json").exists()


def test_what_the_types_say_beyond_python_reaches_the_schemas():
    """Patterns, minimums, closed objects and descriptions come from the types
    (kiln.basics.json_types), so a document that breaks them is refused."""
    good = _document(BuildOutcome(tag="kiln/x:1", image_id=D[0], digest=D[1], size=1, seconds=2.0, skipped=False), "x")
    _validate("build", good)
    for bad in ({"image_id": "sha256:short"}, {"size_bytes": -1}, {"seconds": -0.5}):
        with pytest.raises(jsonschema.ValidationError):
            _validate("build", {**good, **bad})
    verify = Verification(
        reference="r/x:1",
        repository="r/x",
        digest=D[0],
        key_fingerprint=D[1],
        signature_tag=f"sha256-{'a' * 64}.sig",
        signature_manifest=D[2],
        signature_layer=D[3],
        signed_identity="r/x",
    ).as_dict()
    _validate("verify", verify)
    with pytest.raises(jsonschema.ValidationError, match="Additional properties"):
        _validate("verify", {**verify, "private_key": "x"})
    outdated = json.loads((json_schemas._SCHEMAS / "outdated.json").read_text())
    assert outdated["properties"]["index"]["description"].startswith("The simple index asked")


def test_build_and_smoke_documents_validate():
    one = _document(
        BuildOutcome(
            tag="kiln/x:1", image_id=D[0], digest=D[1], size=10, seconds=1.5, skipped=True, steps=4, cached_steps=4
        ),
        "x",
    )
    _validate("build", BuildDocument(**one, platforms={"linux/amd64": one, "linux/arm64": one}))
    ran = SmokeDocument(
        recipe="x",
        image_id=D[0],
        tag="kiln/x:1",
        input_digest=D[1],
        platform="linux/amd64",
        emulation_factor=None,
        level="served",
        passed=True,
        started_at="2026-01-01T00:00:00+00:00",
        checks=[CheckEntry(name="health", ok=True, detail="200", seconds=0.1)],
        timings=Timings(startup_s=None, total_s=3.0),
        record=None,
    )
    _validate("smoke", ran)
    _validate("smoke", SmokeSkipped(recipe="x", skipped=True, reason="no GPU visible on this host", passed=None))
    with pytest.raises(jsonschema.ValidationError):
        _validate("smoke", {**ran, "level": "imagined"})


def _signature(attested: bool) -> SignatureEvidence:
    sig = SignatureEvidence(
        key_fingerprint=D[3],
        signature_tag=f"sha256-{'a' * 64}.sig",
        verified=True,
        signature_manifest=D[4],
        attestation_tag=None,
        attestation_manifest=None,
    )
    if attested:
        sig.update(
            attestation_tag=f"sha256-{'a' * 64}.att",
            attestation_manifest=D[5],
            signature_reused=False,
            predicate_types=["https://cyclonedx.org/bom"],
            attestations=[
                {"predicate_type": "https://cyclonedx.org/bom", "layer_digest": D[0], "verified": True, "problem": None}
            ],
        )
    return sig


@pytest.mark.parametrize("signed", [False, True])
def test_publish_and_promote_documents_validate(signed: bool):
    platform = PlatformEntry(
        image_id=D[0],
        input_digest=D[1],
        manifest_digest=D[2],
        tag="r/x:abc-linux-amd64",
        smoke_record="/state/smoke/a.json",
        smoke_level="in-image",
    )
    if signed:
        platform["signature"] = _signature(True)
    published = PublishResult(
        recipe="x",
        image_id=D[0],
        input_digest=D[1],
        manifest_digest=D[2],
        registry="r:5000",
        repository="kiln/x",
        channel="stable",
        tags=["r:5000/kiln/x:stable"],
        pushed=True,
        smoke=SmokeEvidence(status="passed", record="/state/smoke/a.json", level="served"),
        record="/state/publish/x.json",
        signature=_signature(signed) if signed else None,
        platforms={"linux/amd64": platform},
    )
    _validate("publish", publish_document(published))
    unsmoked = PublishResult(
        recipe="x",
        image_id=D[0],
        input_digest=D[1],
        manifest_digest=D[2],
        registry="r:5000",
        repository="kiln/x",
        channel=None,
        tags=["r:5000/kiln/x:aaaa-unsmoked"],
        pushed=True,
        smoke=SmokeEvidence(status="skipped"),
    )
    _validate("publish", publish_document(unsmoked))
    promoted = PromoteResult(
        recipe="x",
        image_id=D[0],
        manifest_digest=D[2],
        registry="r:5000",
        repository="kiln/x",
        from_channel="experimental",
        to_channel="stable",
        moved=False,
        signature=_signature(signed) if signed else None,
    )
    _validate("promote", promote_document(promoted))
    with pytest.raises(jsonschema.ValidationError):
        _validate("publish", {**publish_document(unsmoked), "tags": []})


def test_verify_documents_of_an_index_and_errors_validate():
    leaf = Verification(
        reference="r/x@" + D[1],
        repository="r/x",
        digest=D[1],
        key_fingerprint=D[2],
        signature_tag=f"sha256-{'b' * 64}.sig",
        signature_manifest=D[3],
        signature_layer=D[4],
        signed_identity="r/x",
        attestation_tag=f"sha256-{'b' * 64}.att",
        attestation_manifest=D[5],
        attestations=[_AttestationCheck("https://slsa.dev/provenance/v1", D[0], False, "subject")],
    )
    index = Verification(
        reference="r/x:1",
        repository="r/x",
        digest=D[0],
        key_fingerprint=D[2],
        signature_tag=f"sha256-{'a' * 64}.sig",
        signature_manifest=D[3],
        signature_layer=D[4],
        signed_identity="r/x",
        platforms={"linux/amd64": leaf},
    )
    _validate("verify", index.as_dict())
    with pytest.raises(jsonschema.ValidationError):
        _validate("verify", {**index.as_dict(), "signature_tag": "latest"})
    _validate("error", RecipeInvalid(["a.yaml:1: x: bad", "a.yaml:2: y: bad"]).document())
    _validate("error", SmokeFailed("smoke x: failed checks: health").document())


def test_no_schema_falls_back_to_anything():
    """A field typed Any would generate `{}` (anything): each property names a type, a
    reference or its alternatives."""
    loose: list[str] = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            for key, prop in node.get("properties", {}).items():
                if not ({"type", "$ref", "anyOf", "enum", "const"} & set(prop)):
                    loose.append(f"{where}/{key}")
            for key, value in node.items():
                walk(value, f"{where}/{key}")
        elif isinstance(node, list):
            for item in node:
                walk(item, where)

    for name in json_schemas.DOCUMENTS:
        walk(json_schemas._json_schema(name), name)
    assert loose == []
