"""Signed publishing and `kiln verify` against a real distribution registry on 127.0.0.1
(Debian's docker-registry, request log at info level so the order of writes and what
reached the registry can be read back), with the mini stand-in image.

Each test works in its own namespace of the registry. The attacks are done with plain
HTTP against the registry, as anyone holding push rights could."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import secrets

import pytest
import requests
from clijson import validated
from localregistry import OCI_MANIFEST
from pubtest import NAME, REPOSITORY
from signing import (
    SIGNING_PASSWORD,
    completed_manifest_requests,
    publish_signed,
    put_manifest,
    run_verify,
    sig_tag,
    upload_blob,
)

pytestmark = [pytest.mark.docker, pytest.mark.registry]


# -- the signed publish ------------------------------------------------------------------------
def test_signed_publish_writes_signature_and_attestations_before_any_consumer_tag(mini, reg, signed, signing_keys):
    ours, _ = signing_keys
    _, doc = signed
    digest, repo = doc["manifest_digest"], f"signed/{REPOSITORY}"
    assert doc["signature"]["key_fingerprint"] == ours.fingerprint and doc["signature"]["verified"] is True
    assert sorted(doc["signature"]["predicate_types"]) == [
        "https://cyclonedx.org/bom",
        "https://slsa.dev/provenance/v1",
    ]
    tags = reg.tags(repo)
    consumer = {mini.short, mini.engine_tag, "experimental"}
    assert set(tags) == consumer | {f"{mini.short}-staging", sig_tag(digest), sig_tag(digest, "att")}
    # the registry's own request log: the order in which manifests were written and read
    requests_done = completed_manifest_requests(reg, repo)
    written = [ref for method, ref in requests_done if method == "PUT"]
    assert written[0] == f"{mini.short}-staging", written  # the daemon's push: no consumer tag
    first_consumer = min(requests_done.index(("PUT", t)) for t in consumer)
    att_put = requests_done.index(("PUT", sig_tag(digest, "att")))
    assert requests_done.index(("PUT", sig_tag(digest))) < first_consumer and att_put < first_consumer
    # ... and between the last signing write and the first consumer tag, kiln read it all back
    assert ("GET", sig_tag(digest)) in requests_done[att_put:first_consumer]
    assert ("GET", sig_tag(digest, "att")) in requests_done[att_put:first_consumer]
    # the .sig image is cosign's: one simple-signing layer, signature annotation, OCI types
    _, sig = reg.manifest(repo, sig_tag(digest))
    assert sig["mediaType"] == OCI_MANIFEST and sig["config"]["mediaType"] == "application/vnd.oci.image.config.v1+json"
    [layer] = sig["layers"]
    assert layer["mediaType"] == "application/vnd.dev.cosign.simplesigning.v1+json"
    payload = json.loads(reg.blob(repo, layer["digest"]))
    assert payload["critical"] == {
        "identity": {"docker-reference": f"{reg.host}/signed/{REPOSITORY}"},
        "image": {"docker-manifest-digest": digest},
        "type": "cosign container image signature",
    }
    _, att = reg.manifest(repo, sig_tag(digest, "att"))
    assert {la["annotations"]["predicateType"] for la in att["layers"]} == set(doc["signature"]["predicate_types"])
    # the SBOM attestation's predicate is a CycloneDX document about this image
    sbom_layer = next(la for la in att["layers"] if la["annotations"]["predicateType"] == "https://cyclonedx.org/bom")
    envelope = json.loads(reg.blob(repo, sbom_layer["digest"]))
    statement = json.loads(base64.b64decode(envelope["payload"]))
    assert statement["subject"][0]["digest"]["sha256"] == digest.removeprefix("sha256:")
    assert statement["predicate"]["bomFormat"] == "CycloneDX"
    assert any(c.get("name") == "python3" for c in statement["predicate"].get("components", []))


def test_a_signed_image_verifies_by_tag_and_digest(mini, reg, signed, signing_keys):
    ours, _ = signing_keys
    _, doc = signed
    for ref in (
        f"{reg.host}/signed/{REPOSITORY}:experimental",
        f"{reg.host}/signed/{REPOSITORY}@{doc['manifest_digest']}",
        f"{reg.host}/signed/{REPOSITORY}:{mini.short}@{doc['manifest_digest']}",
    ):
        result = run_verify(mini, reg, ref, ours.public, "--json")
        assert result.returncode == 0, result.stderr
        out = validated("verify", result.stdout)
        assert out["digest"] == doc["manifest_digest"] and out["key_fingerprint"] == ours.fingerprint
        assert [a["verified"] for a in out["attestations"]] == [True, True]
    plain = run_verify(mini, reg, f"{reg.host}/signed/{REPOSITORY}:experimental", ours.public)
    assert plain.stdout.strip() == f"{reg.host}/signed/{REPOSITORY}@{doc['manifest_digest']}"


def test_an_unsigned_image_fails(mini, reg, signing_keys):
    ours, _ = signing_keys
    mini.pass_smoke()
    result = mini.kiln("publish", NAME, "--registry", f"{reg.host}/unsigned", registry=reg)
    assert result.returncode == 0, result.stderr[-2000:]
    check = run_verify(mini, reg, f"{reg.host}/unsigned/{REPOSITORY}:experimental", ours.public)
    assert check.returncode == 82, check.stderr
    assert "is not signed" in check.stderr and "Traceback" not in check.stderr


def test_an_image_signed_by_another_key_fails(mini, reg, signed, signing_keys):
    _, other = signing_keys
    check = run_verify(mini, reg, f"{reg.host}/signed/{REPOSITORY}:experimental", other.public)
    assert check.returncode == 84, check.stderr
    assert other.fingerprint in check.stderr and signing_keys[0].fingerprint in check.stderr


def test_a_moved_tag_fails(mini, reg, signed, signing_keys):
    ours, _ = signing_keys
    _, _doc = signed
    ns = f"moved/{REPOSITORY}"
    publish_signed(mini, reg, "moved", ours.private)
    signed_digest, _ = reg.manifest(ns, "experimental")
    sig_body = requests.get(
        f"http://{reg.host}/v2/{ns}/manifests/{sig_tag(signed_digest)}",
        auth=reg.auth,
        headers={"Accept": OCI_MANIFEST},
        timeout=10,
    ).content
    # someone pushes another image under the channel tag
    other, _ = reg.push_tiny(ns, "experimental")
    moved = run_verify(mini, reg, f"{reg.host}/{ns}:experimental", ours.public)
    assert moved.returncode == 82 and other in moved.stderr, moved.stderr
    # the digest the user pinned no longer matches the tag
    pinned = run_verify(mini, reg, f"{reg.host}/{ns}:experimental@{signed_digest}", ours.public)
    assert pinned.returncode == 85 and "the tag moved" in pinned.stderr, pinned.stderr
    # and copying the genuine signature next to the new image does not help
    assert put_manifest(reg, ns, sig_tag(other), sig_body).status_code == 201
    copied = run_verify(mini, reg, f"{reg.host}/{ns}:experimental", ours.public, "--signature-only")
    assert copied.returncode == 85 and f"genuine signature of {signed_digest}" in copied.stderr, copied.stderr


def test_a_repushed_image_with_one_changed_layer_fails(mini, reg, signing_keys):
    from kiln.domain.signing import keys, signatures
    from kiln.infra.credentials import Credentials
    from kiln.infra.registry import RegistryClient, Target

    ours, _ = signing_keys
    ns = f"repushed/{REPOSITORY}"
    publish_signed(mini, reg, "repushed", ours.private)
    original, manifest = reg.manifest(ns, "experimental")
    # one layer replaced (an attacker's file in it), everything else as published
    evil = gzip.compress(b"one changed layer " + secrets.token_bytes(16))
    manifest["layers"][-1] = {**manifest["layers"][-1], "digest": upload_blob(reg, ns, evil), "size": len(evil)}
    body = json.dumps(manifest).encode()
    assert put_manifest(reg, ns, "experimental", body, manifest["mediaType"]).status_code == 201
    changed = "sha256:" + hashlib.sha256(body).hexdigest()
    assert changed != original
    assert run_verify(mini, reg, f"{reg.host}/{ns}:experimental", ours.public).returncode == 82
    # with the original signature and attestations copied to the changed image
    for kind in ("sig", "att"):
        got = requests.get(
            f"http://{reg.host}/v2/{ns}/manifests/{sig_tag(original, kind)}",
            auth=reg.auth,
            headers={"Accept": OCI_MANIFEST},
            timeout=10,
        ).content
        assert put_manifest(reg, ns, sig_tag(changed, kind), got).status_code == 201
    copied = run_verify(mini, reg, f"{reg.host}/{ns}:experimental", ours.public)
    assert copied.returncode == 85, copied.stderr
    # even a genuine new signature of the changed digest leaves the copied attestations
    # describing the original: their subject does not match
    client = RegistryClient(Target.parse(reg.host, ns), Credentials(reg.user, reg.password, None, "test"))
    key = keys.load_private_key(ours.private, SIGNING_PASSWORD.encode())
    signatures.sign_image(client, changed, key, [], creator="attacker with the key, but no SBOM")
    mixed = run_verify(mini, reg, f"{reg.host}/{ns}:experimental", ours.public)
    assert mixed.returncode == 88 and f"not about {changed}" in mixed.stderr, mixed.stderr


@pytest.mark.parametrize("kind", ["sig", "att"])
def test_garbage_signature_manifests_are_one_line_errors(mini, reg, signing_keys, kind):
    ours, _ = signing_keys
    ns = f"garbage-{kind}/{REPOSITORY}"
    image, _ = reg.push_tiny(ns, "v1")
    if kind == "att":  # a genuine signature, so that verification reaches the attestations
        _sign_only(reg, ns, image, ours)
    tag = sig_tag(image, kind)
    config_bytes = b'{"architecture":"","os":"","rootfs":{"type":"layers","diff_ids":[]},"config":{}}'
    config = upload_blob(reg, ns, config_bytes)
    media = (
        "application/vnd.dev.cosign.simplesigning.v1+json" if kind == "sig" else "application/vnd.dsse.envelope.v1+json"
    )
    truncated = (
        b'{"critical":{"identity":{"docker-reference":"x"},"ima'
        if kind == "sig"
        else b'{"payloadType":"application/vnd.in-toto+json","payload":"eyJf'
    )

    def manifest(layers):
        return json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "config": {
                    "mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": config,
                    "size": len(config_bytes),
                },
                "layers": layers,
            }
        ).encode()

    def layer(data: bytes, media_type: str = media, annotations=None):
        return {
            "mediaType": media_type,
            "digest": upload_blob(reg, ns, data),
            "size": len(data),
            "annotations": annotations
            if annotations is not None
            else {"dev.cosignproject.cosign/signature": "MEUCIQ=="},
        }

    cases = {
        "truncated payload": manifest([layer(truncated)]),
        "binary garbage": manifest([layer(b"\x00\xff\xfe garbage " + secrets.token_bytes(8))]),
        "wrong media type": manifest([layer(b"{}", "application/vnd.oci.image.layer.v1.tar+gzip")]),
        "no layers": manifest([]),
        "no signature annotation": manifest([layer(b'{"critical":{},"optional":null}', annotations={})]),
    }
    # a truncated or garbage manifest itself is refused by the registry (MANIFEST_INVALID),
    # so it cannot be served; tests/sign unit-tests kiln on such bytes
    assert (
        put_manifest(
            reg, ns, tag, b'{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+js'
        ).status_code
        == 400
    )
    for what, body in cases.items():
        assert put_manifest(reg, ns, tag, body).status_code == 201, what
        result = run_verify(mini, reg, f"{reg.host}/{ns}:v1", ours.public)
        assert result.returncode == 87, (what, result.stderr)
        errors = [ln for ln in result.stderr.splitlines() if ln.startswith("kiln: error:")]
        assert len(errors) == 1 and "Traceback" not in result.stderr, (what, result.stderr)


def _sign_only(reg, ns: str, digest: str, key_files) -> None:
    from kiln.domain.signing import keys, signatures
    from kiln.infra.credentials import Credentials
    from kiln.infra.registry import RegistryClient, Target

    client = RegistryClient(Target.parse(reg.host, ns), Credentials(reg.user, reg.password, None, "test"))
    signatures.sign_image(
        client, digest, keys.load_private_key(key_files.private, SIGNING_PASSWORD.encode()), [], creator="test"
    )


def test_real_cosign_artefacts_verify_from_the_registry(reg):
    """The .sig image the real cosign v3.0.4 wrote (tests/fixtures/cosign/cosign-v3),
    stored in the registry byte for byte and verified over HTTP."""
    from kilntest import FIXTURES

    from kiln.basics.errors import SignedIdentityMismatch
    from kiln.domain.signing import cosign, keys, signatures
    from kiln.infra.credentials import Credentials
    from kiln.infra.registry import RegistryClient, Target

    d = FIXTURES / "cosign" / "cosign-v3"
    subject = "sha256:f20c43161d73848408ef247f0ec7111b19fe58ffebc0cbcaa0d2c8bda4967268"
    ns = "tobby/fixture"
    payload = (d / "sig-payload.json").read_bytes()
    upload_blob(reg, ns, payload)
    upload_blob(reg, ns, cosign.artefact_image([cosign.signature_layer(payload, b"-")]).config.data)
    assert put_manifest(reg, ns, sig_tag(subject), (d / "sig-manifest.json").read_bytes()).status_code == 201
    client = RegistryClient(Target.parse(reg.host, ns), Credentials(reg.user, reg.password, None, "test"))
    key = keys.load_public_key(d / "cosign.pub")
    done = signatures.verify_image(client, subject, key, required=(), signed_repository="localhost:15381/tobby/fixture")
    assert done.signed_identity == "localhost:15381/tobby/fixture" and done.key_fingerprint == key.fingerprint
    with pytest.raises(SignedIdentityMismatch):  # kiln checks the identity cosign ignores
        signatures.verify_image(client, subject, key, required=())
