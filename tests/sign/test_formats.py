"""What kiln writes has the structure of what the real cosign writes, field by field:
the .sig manifest (byte for byte, given cosign's payload and signature), the payload, the
.att layer and its DSSE envelope, the in-toto statement. Real artefacts: tests/fixtures/cosign."""

from __future__ import annotations

import base64
import json

from signtest import FakeRepository, containers_image_signature, fixture, sha256

from kiln.domain.signing import cosign, keys, layer_checks, signatures

V3_SUBJECT = "sha256:f20c43161d73848408ef247f0ec7111b19fe58ffebc0cbcaa0d2c8bda4967268"


def shape(value):
    """Keys (recursively, in order) and value types; the structure, not the content."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value[:1]]
    return type(value).__name__


def test_sig_manifest_is_byte_identical_to_cosign_v3_for_the_same_payload_and_signature():
    real = fixture("cosign-v3", "sig-manifest.json").read_bytes()
    payload = fixture("cosign-v3", "sig-payload.json").read_bytes()
    annotation = json.loads(real)["layers"][0]["annotations"][cosign.SIGNATURE_ANNOTATION]
    ours = cosign.artefact_image([cosign.signature_layer(payload, base64.b64decode(annotation))])
    assert ours.manifest == real
    assert ours.config.digest == json.loads(real)["config"]["digest"]  # the 233-byte config, reproduced


def test_payload_is_cosigns_field_for_field():
    real = fixture("cosign-v3", "sig-payload.json").read_bytes()
    assert cosign.simple_signing_payload("localhost:15381/tobby/fixture", V3_SUBJECT, None) == real
    # what kiln signs carries optional claims (creator, time, signer key); the critical
    # part, the only one verifiers read, keeps cosign's exact fields and order
    ours = json.loads(
        cosign.simple_signing_payload(
            "localhost:15381/tobby/fixture",
            V3_SUBJECT,
            {"creator": "kiln 0.1.0", "timestamp": 1, cosign.SIGNER_CLAIM: "sha256:" + "a" * 64},
        )
    )
    theirs = json.loads(real)
    assert list(ours) == list(theirs) == ["critical", "optional"]
    assert ours["critical"] == theirs["critical"]
    # containers/image reads optional.creator as a string and optional.timestamp as an integer
    assert isinstance(ours["optional"]["creator"], str) and isinstance(ours["optional"]["timestamp"], int)
    older = containers_image_signature("dir-img-cosign-valid.signature-1")
    assert shape(json.loads(older.payload)["critical"]) == shape(ours["critical"])
    assert older.media_type == cosign.SIMPLE_SIGNING and list(older.annotations) == [cosign.SIGNATURE_ANNOTATION]


def test_att_layer_and_envelope_have_cosigns_fields():
    key = keys.generate()
    statement = cosign.statement(cosign.CYCLONEDX_PREDICATE, {"bomFormat": "CycloneDX"}, [("r.example/x", V3_SUBJECT)])
    body = cosign.compact(statement)
    envelope = cosign.envelope(body, key.sign(cosign.pae(cosign.IN_TOTO, body)))
    layer = cosign.attestation_layer(envelope, cosign.CYCLONEDX_PREDICATE)
    # cmd/cosign/cli/attest/attest.go: layer media type, predicateType annotation, and the
    # empty signature annotation static.NewAttestation writes (specs/ATTESTATION_SPEC.md)
    desc = layer.descriptor()
    assert list(desc) == ["mediaType", "size", "digest", "annotations"]
    assert desc["mediaType"] == "application/vnd.dsse.envelope.v1+json"
    assert desc["annotations"] == {
        "dev.cosignproject.cosign/signature": "",
        "predicateType": "https://cyclonedx.org/bom",
    }
    # the DSSE envelope: field by field as cosign's (pkg/policy/testdata/valid/custom)
    real = json.loads(fixture("cosign-spec", "policy-testdata-valid-custom.dsse.json").read_bytes())
    ours = json.loads(envelope)
    assert (
        shape(ours)
        == shape(real)
        == {"payloadType": "str", "payload": "str", "signatures": [{"keyid": "str", "sig": "str"}]}
    )
    assert ours["payloadType"] == real["payloadType"] == "application/vnd.in-toto+json"
    assert ours["signatures"][0]["keyid"] == real["signatures"][0]["keyid"] == ""
    # the statement: in-toto v1 as cosign 3 writes it (the bundle fixture), subject by sha256
    v3 = json.loads(fixture("cosign-v3", "bundle-sigstore.json").read_bytes())["dsseEnvelope"]
    v3_statement = json.loads(base64.b64decode(v3["payload"]))
    assert statement["_type"] == v3_statement["_type"] == "https://in-toto.io/Statement/v1"
    assert set(statement) <= {"_type", "subject", "predicateType", "predicate"}  # the in-toto v1 protobuf fields
    assert set(statement["subject"][0]["digest"]) == set(v3_statement["subject"][0]["digest"]) == {"sha256"}
    assert statement["subject"][0]["digest"]["sha256"] == V3_SUBJECT.removeprefix("sha256:")
    # and it verifies as any cosign attestation does
    assert layer_checks._dsse_verifies(cosign.parse_envelope(envelope, "ours"), key.public)


def test_signing_writes_cosigns_layout_and_keeps_other_signers():
    repo = FakeRepository("registry.example.com", "kiln/demo")
    image = repo.put("v1", b'{"schemaVersion":2}')
    # someone signed with cosign before: their layer stays next to kiln's
    theirs = containers_image_signature("dir-img-cosign-valid.signature-1")
    repo.add_blob(theirs.payload)
    existing = cosign.artefact_image([cosign.Blob(theirs.payload, theirs.media_type, theirs.annotations)])
    repo.add_blob(existing.config.data)
    repo.put(cosign.signature_tag(image), existing.manifest)
    key = keys.generate()
    statement = cosign.statement(
        cosign.CYCLONEDX_PREDICATE, {"bomFormat": "CycloneDX"}, [("registry.example.com/kiln/demo", image)]
    )
    result = signatures.sign_image(
        repo, image, key, [signatures.Attestation(cosign.CYCLONEDX_PREDICATE, statement)], creator="kiln test"
    )
    assert result.signature_tag == "sha256-" + image.removeprefix("sha256:") + ".sig"
    assert result.attestation_tag == "sha256-" + image.removeprefix("sha256:") + ".att"
    sig = json.loads(repo.manifest(result.signature_tag).body)
    assert [layer["mediaType"] for layer in sig["layers"]] == [cosign.SIMPLE_SIGNING] * 2
    assert sig["layers"][0]["digest"] == sha256(theirs.payload)
    config = json.loads(repo.blobs[sig["config"]["digest"]])
    assert config["rootfs"]["diff_ids"] == [layer["digest"] for layer in sig["layers"]]
    verified = signatures.verify_image(repo, image, key.public, required=[cosign.CYCLONEDX_PREDICATE])  # type: ignore[arg-type]
    assert verified.signature_layer == sig["layers"][1]["digest"]
    assert verified.signed_identity == "registry.example.com/kiln/demo"
    # signing again reuses the good signature, and replaces kiln's own attestation type only
    again = signatures.sign_image(
        repo, image, key, [signatures.Attestation(cosign.CYCLONEDX_PREDICATE, statement)], creator="kiln test"
    )
    assert again.signature_reused and again.signature_manifest == result.signature_manifest
    att = json.loads(repo.manifest(result.attestation_tag).body)
    assert len(att["layers"]) == 1


def test_docker_hub_identity_is_spelled_as_cosign_spells_it():
    from kiln.infra.registry import Target

    assert layer_checks.identity(Target.parse("docker.io", "kiln/x")) == "index.docker.io/kiln/x"
    assert layer_checks._same_identity("index.docker.io/kiln/x", "docker.io/kiln/x")
    assert not layer_checks._same_identity("index.docker.io/kiln/x", "ghcr.io/kiln/x")
