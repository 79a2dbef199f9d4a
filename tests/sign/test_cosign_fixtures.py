"""kiln's verifier against signatures and attestations MADE BY THE REAL COSIGN (sources in
tests/fixtures/cosign/README.md): the genuine ones verify, and each tampered variant fails
with the error (exit code) of its kind, in one line.

Tampering is done as an attacker who can write to the registry would: the altered blob is
re-uploaded and the manifest rewritten to reference it, so only the cryptography (or the
claim checks) can catch it."""

from __future__ import annotations

import base64
import json

import pytest
from signtest import FakeRepository, containers_image_signature, fixture, sha256

from kiln.basics.errors import (
    AttestationSubjectMismatch,
    KilnError,
    SignatureInvalid,
    SignatureMalformed,
    SignedDigestMismatch,
    SignedIdentityMismatch,
    SigningKeyInvalid,
)
from kiln.domain.signing import cosign, keys, layer_checks

# cosign v3.0.4, `cosign sign --key`, classic .sig layout (fixtures/cosign/cosign-v3)
V3_SUBJECT = "sha256:f20c43161d73848408ef247f0ec7111b19fe58ffebc0cbcaa0d2c8bda4967268"
V3_IDENTITY = "localhost:15381/tobby/fixture"
# cosign v3.0.4 DSSE envelope (bundle format), subject an image index
V3_BUNDLE_SUBJECT = "sha256:d7d5640c741c60b47fa4b5530daa20a6469b55754a89dd42adbadadb59f9093c"
CI_IDENTITY = "192.168.64.2:5000/cosign-signed-single-sample"  # containers/image fixtures_info_test.go
OTHER = "sha256:" + "0" * 64


def v3_key() -> keys.PublicKey:
    return keys.load_public_key(fixture("cosign-v3", "cosign.pub"))


def v3_repository() -> tuple[FakeRepository, bytes]:
    """The captured .sig image, stored exactly: payload blob, config blob (which kiln's own
    builder reproduces byte for byte: test_formats), manifest."""
    repo = FakeRepository("localhost:15381", "tobby/fixture")
    payload = fixture("cosign-v3", "sig-payload.json").read_bytes()
    repo.add_blob(payload)
    repo.add_blob(cosign.artefact_image([cosign.signature_layer(payload, b"x")]).config.data)
    body = fixture("cosign-v3", "sig-manifest.json").read_bytes()
    repo.put(cosign.signature_tag(V3_SUBJECT), body)
    return repo, body


def verify_sig(
    repo: FakeRepository, body: bytes, key: keys.PublicKey, digest: str = V3_SUBJECT, identity: str = V3_IDENTITY
):
    fetch = layer_checks._fetcher(repo, "test")  # type: ignore[arg-type]
    return layer_checks._verify_signature_image(body, fetch, key, digest, identity, "test .sig")


def _rewritten(
    body: bytes, *, payload: bytes | None = None, signature: str | None = None, repo: FakeRepository
) -> bytes:
    """The .sig manifest after an attacker replaced the payload and/or the annotation."""
    doc = json.loads(body)
    layer = doc["layers"][0]
    if payload is not None:
        layer["digest"], layer["size"] = repo.add_blob(payload), len(payload)
    if signature is not None:
        layer["annotations"][cosign.SIGNATURE_ANNOTATION] = signature
    return json.dumps(doc).encode()


# -- cosign v3.0.4 .sig -----------------------------------------------------------------------
def test_a_real_cosign_v3_signature_verifies():
    repo, body = v3_repository()
    layer, claims = verify_sig(repo, body, v3_key())
    assert claims.manifest_digest == V3_SUBJECT and claims.docker_reference == V3_IDENTITY
    assert claims.optional is None  # cosign writes "optional": null
    assert layer.digest == sha256(fixture("cosign-v3", "sig-payload.json").read_bytes())


def test_one_payload_byte_changed_is_a_bad_signature():
    repo, body = v3_repository()
    payload = fixture("cosign-v3", "sig-payload.json").read_bytes()
    i = payload.index(b"f20c") + 1
    tampered = payload[:i] + (b"1" if payload[i : i + 1] != b"1" else b"2") + payload[i + 1 :]
    with pytest.raises(SignatureInvalid) as exc:
        verify_sig(repo, _rewritten(body, payload=tampered, repo=repo), v3_key())
    assert exc.value.exit_code == 83 and "\n" not in exc.value.message


def test_one_signature_byte_changed_is_a_bad_signature():
    repo, body = v3_repository()
    sig = bytearray(base64.b64decode(json.loads(body)["layers"][0]["annotations"][cosign.SIGNATURE_ANNOTATION]))
    sig[-1] ^= 1
    with pytest.raises(SignatureInvalid):
        verify_sig(repo, _rewritten(body, signature=base64.b64encode(bytes(sig)).decode(), repo=repo), v3_key())


def test_another_image_digest_is_a_digest_mismatch():
    repo, body = v3_repository()
    with pytest.raises(SignedDigestMismatch) as exc:
        verify_sig(repo, body, v3_key(), digest=OTHER)
    assert exc.value.exit_code == 85 and V3_SUBJECT in exc.value.message


def test_another_repository_is_an_identity_mismatch():
    repo, body = v3_repository()
    with pytest.raises(SignedIdentityMismatch) as exc:
        verify_sig(repo, body, v3_key(), identity="registry.example.com/tobby/fixture")
    assert exc.value.exit_code == 86


def test_another_key_fails_and_a_damaged_key_is_refused(tmp_path):
    repo, body = v3_repository()
    other = keys.load_public_key(fixture("containers-image", "cosign.pub"))
    with pytest.raises(SignatureInvalid):  # cosign names no key in its payload: kiln cannot tell more
        verify_sig(repo, body, other)
    pem = fixture("cosign-v3", "cosign.pub").read_text().splitlines()
    line = pem[1]
    pem[1] = line[:40] + ("A" if line[40] != "A" else "B") + line[41:]  # one byte of the point
    damaged = tmp_path / "damaged.pub"
    damaged.write_text("\n".join(pem) + "\n")
    try:
        key = keys.load_public_key(damaged)
    except SigningKeyInvalid as exc:  # most flips leave the curve: the key is refused outright
        assert exc.exit_code == 80 and "damaged.pub" in exc.message
    else:  # the rest make another valid key, which does not verify
        with pytest.raises(SignatureInvalid):
            verify_sig(repo, body, key)


@pytest.mark.parametrize(
    "body, problem",
    [
        (b'{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+js', "not JSON"),
        (b"\x00\xff garbage", "not JSON"),
        (b'{"schemaVersion":2,"layers":[]}', "no layers"),
        (b'{"schemaVersion":2,"manifests":[]}', "image index"),
        (b'{"schemaVersion":2,"layers":[{"mediaType":"x","digest":"sha256:12","size":1}]}', "sha256:<64 hex>"),
    ],
)
def test_garbage_sig_manifests_are_one_line_malformed(body, problem):
    repo, _ = v3_repository()
    with pytest.raises(SignatureMalformed, match=problem) as exc:
        verify_sig(repo, body, v3_key())
    assert exc.value.exit_code == 87 and "\n" not in exc.value.message


def test_garbage_payload_and_annotation_are_malformed():
    repo, body = v3_repository()
    with pytest.raises(SignatureMalformed, match="not JSON"):
        verify_sig(repo, _rewritten(body, payload=b'{"critical":{"identity"', repo=repo), v3_key())
    with pytest.raises(SignatureMalformed, match="not a base64 signature"):
        verify_sig(repo, _rewritten(body, signature="%%%not base64", repo=repo), v3_key())
    missing = json.loads(body)
    missing["layers"][0]["digest"] = OTHER
    with pytest.raises(SignatureMalformed, match="missing"):
        verify_sig(repo, json.dumps(missing).encode(), v3_key())


# -- containers/image's cosign fixtures (cosign 1.x, 2022) -----------------------------------
def ci_image_digest(name: str = "dir-img-cosign-valid.manifest.json") -> str:
    return sha256(fixture("containers-image", name).read_bytes())


@pytest.mark.parametrize(
    "signature, key, manifest",
    [
        ("dir-img-cosign-valid.signature-1", "cosign.pub", "dir-img-cosign-valid.manifest.json"),
        ("dir-img-cosign-valid-2.signature-2", "cosign.pub", "dir-img-cosign-valid.manifest.json"),
        ("dir-img-cosign-key-rekor-valid.signature-1", "cosign2.pub", "dir-img-cosign-key-rekor-valid.manifest.json"),
    ],
)
def test_containers_image_cosign_signatures_verify_against_the_image_manifest(signature, key, manifest):
    sig = containers_image_signature(signature)
    layer = cosign.LayerRef(sig.media_type, sha256(sig.payload), len(sig.payload), sig.annotations)
    public = keys.load_public_key(fixture("containers-image", key))
    identity = "192.168.64.2:5000/cosign-signed/key-1" if "rekor" in signature else CI_IDENTITY
    # the signed digest is the sha256 of the stored image manifest: the whole chain
    claims = layer_checks._check_signature_layer(
        layer, sig.payload, public, ci_image_digest(manifest), identity, signature
    )
    assert claims.manifest_digest == ci_image_digest(manifest)


def test_containers_image_negative_fixtures_fail_with_their_kind():
    public = keys.load_public_key(fixture("containers-image", "cosign.pub"))
    unknown = containers_image_signature("unknown-cosign-key.signature")
    layer = cosign.LayerRef(unknown.media_type, sha256(unknown.payload), len(unknown.payload), unknown.annotations)
    with pytest.raises(SignatureInvalid):
        layer_checks._check_signature_layer(layer, unknown.payload, public, ci_image_digest(), CI_IDENTITY, "unknown")
    good = containers_image_signature("dir-img-cosign-valid.signature-1")
    layer = cosign.LayerRef(good.media_type, sha256(good.payload), len(good.payload), good.annotations)
    modified = ci_image_digest("dir-img-cosign-modified-manifest.manifest.json")
    with pytest.raises(SignedDigestMismatch):
        layer_checks._check_signature_layer(layer, good.payload, public, modified, CI_IDENTITY, "modified manifest")


def test_of_several_layers_one_good_one_is_enough_and_none_reports_the_most_telling():
    # cosign appends signatures as layers; a .sig holding an unknown key's layer and a good one verifies
    repo = FakeRepository("192.168.64.2:5000", "cosign-signed-single-sample")
    layers = []
    for name in ("unknown-cosign-key.signature", "dir-img-cosign-valid.signature-1"):
        sig = containers_image_signature(name)
        repo.add_blob(sig.payload)
        layers.append(cosign.Blob(sig.payload, sig.media_type, sig.annotations))
    body = cosign.artefact_image(layers).manifest
    public = keys.load_public_key(fixture("containers-image", "cosign.pub"))
    fetch = layer_checks._fetcher(repo, "mixed")  # type: ignore[arg-type]
    layer, _ = layer_checks._verify_signature_image(body, fetch, public, ci_image_digest(), CI_IDENTITY, "mixed")
    assert layer.digest == sha256(layers[1].data)
    # for another digest: one layer is a bad signature, the other genuine but for another image
    with pytest.raises(SignedDigestMismatch):
        layer_checks._verify_signature_image(body, fetch, public, OTHER, CI_IDENTITY, "mixed")


# -- attestations ----------------------------------------------------------------------------------
def v3_envelope() -> bytes:
    """The DSSE envelope of the captured cosign v3 bundle, written as cosign's .att layer
    holds one (the signature covers PAE(payloadType, payload), not the JSON around it)."""
    doc = json.loads(fixture("cosign-v3", "bundle-sigstore.json").read_bytes())["dsseEnvelope"]
    return json.dumps(
        {
            "payloadType": doc["payloadType"],
            "payload": doc["payload"],
            "signatures": [{"keyid": "", "sig": s["sig"]} for s in doc["signatures"]],
        }
    ).encode()


def att_layer(data: bytes, predicate_type: str = "https://sigstore.dev/cosign/sign/v1") -> cosign.LayerRef:
    return cosign.LayerRef(
        cosign.DSSE,
        sha256(data),
        len(data),
        {cosign.SIGNATURE_ANNOTATION: "", cosign.PREDICATE_TYPE_ANNOTATION: predicate_type},
    )


def bundle_key() -> keys.PublicKey:
    return keys.load_public_key(fixture("cosign-v3", "bundle-cosign.pub"))


def test_a_real_cosign_v3_dsse_envelope_verifies():
    data = v3_envelope()
    statement = layer_checks._check_attestation_layer(att_layer(data), data, bundle_key(), V3_BUNDLE_SUBJECT, "v3 dsse")
    assert statement.predicate_type == "https://sigstore.dev/cosign/sign/v1"
    assert V3_BUNDLE_SUBJECT in statement.subject_digests


def test_tampered_dsse_envelopes_fail_with_their_kind():
    doc = json.loads(v3_envelope())
    body = base64.b64decode(doc["payload"])
    flipped = body.replace(b"d7d5640c", b"d7d5640d")
    cases = [
        ({**doc, "payload": base64.b64encode(flipped).decode()}, SignatureInvalid),
        (
            {
                **doc,
                "signatures": [
                    {
                        "keyid": "",
                        "sig": base64.b64encode(base64.b64decode(doc["signatures"][0]["sig"])[:-1] + b"\x00").decode(),
                    }
                ],
            },
            SignatureInvalid,
        ),
        ({**doc, "payloadType": "application/json"}, SignatureMalformed),  # cosign refuses it before the signature
        ({k: v for k, v in doc.items() if k != "signatures"}, SignatureMalformed),
    ]
    for envelope, error in cases:
        data = json.dumps(envelope).encode()
        with pytest.raises(error) as exc:
            layer_checks._check_attestation_layer(att_layer(data), data, bundle_key(), V3_BUNDLE_SUBJECT, "tampered")
        assert "\n" not in exc.value.message
    data = v3_envelope()
    with pytest.raises(AttestationSubjectMismatch) as exc:
        layer_checks._check_attestation_layer(att_layer(data), data, bundle_key(), OTHER, "moved")
    assert exc.value.exit_code == 88
    with pytest.raises(SignatureInvalid):
        layer_checks._check_attestation_layer(att_layer(data), data, v3_key(), V3_BUNDLE_SUBJECT, "other key")


def test_kyverno_fixture_attestations_made_by_cosign_verify_but_carry_a_payload_type_cosign_now_refuses():
    public = keys.load_public_key(fixture("kyverno", "cosign.pub"))
    lines = fixture("kyverno", "attestation-payloads.jsonl").read_text().splitlines()
    assert len(lines) == 3
    for line in lines:
        env = cosign.parse_envelope(line.encode(), "kyverno")
        assert layer_checks._dsse_verifies(env, public)  # genuine DSSE signatures by that key
        assert not layer_checks._dsse_verifies(env, bundle_key())
        # written by cosign 1.x with the predicate type as payloadType; cosign's
        # verifyOCIAttestation now requires application/vnd.in-toto+json, and so does kiln
        with pytest.raises(SignatureMalformed, match="payloadType"):
            layer_checks._check_attestation_layer(att_layer(line.encode()), line.encode(), public, OTHER, "kyverno")


def test_attestation_image_needs_one_good_layer_per_required_type():
    repo = FakeRepository()
    data = v3_envelope()
    repo.add_blob(data)
    body = cosign.artefact_image([cosign.Blob(data, cosign.DSSE, att_layer(data).annotations)]).manifest
    fetch = layer_checks._fetcher(repo, "att")  # type: ignore[arg-type]
    checks = layer_checks._verify_attestation_image(
        body, fetch, bundle_key(), V3_BUNDLE_SUBJECT, ["https://sigstore.dev/cosign/sign/v1"], "att"
    )
    assert [c.verified for c in checks] == [True]
    with pytest.raises(KilnError) as exc:
        layer_checks._verify_attestation_image(
            body, fetch, bundle_key(), V3_BUNDLE_SUBJECT, [cosign.CYCLONEDX_PREDICATE], "att"
        )
    assert exc.value.exit_code == 82 and "no https://cyclonedx.org/bom attestation" in exc.value.message
