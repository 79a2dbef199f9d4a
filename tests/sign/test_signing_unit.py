"""The signing and verification logic on an in-memory repository (unit tier): references,
the other-key hint, and that secrets stay inside the key object."""

from __future__ import annotations

import json

import pytest
from signtest import FakeRepository

from kiln.basics.errors import (
    RegistryInvalid,
    SignatureMissing,
    SignedByOtherKey,
    SignedIdentityMismatch,
)
from kiln.domain.signing import cosign, keys, signatures


def signed_repo(key: keys.PrivateKey) -> tuple[FakeRepository, str]:
    repo = FakeRepository("registry.example.com", "kiln/demo")
    image = repo.put("stable", b'{"schemaVersion":2,"layers":[]}')
    statement = cosign.statement(cosign.CYCLONEDX_PREDICATE, {}, [("registry.example.com/kiln/demo", image)])
    signatures.sign_image(
        repo,
        image,
        key,
        [signatures.Attestation(cosign.CYCLONEDX_PREDICATE, statement)],  # type: ignore[arg-type]
        creator="kiln test",
    )
    return repo, image


def test_a_kiln_signature_names_its_key_so_another_key_is_reported_as_such():
    signer, other = keys.generate(), keys.generate()
    repo, image = signed_repo(signer)
    with pytest.raises(SignedByOtherKey) as exc:
        signatures.verify_image(repo, image, other.public, required=())  # type: ignore[arg-type]
    assert signer.public.fingerprint in exc.value.message and other.public.fingerprint in exc.value.message
    assert exc.value.exit_code == 84


def test_missing_signature_and_attestation_and_mirrored_identity():
    key = keys.generate()
    repo, image = signed_repo(key)
    unsigned = repo.put("other", b'{"schemaVersion":2,"layers":[{}]}')
    with pytest.raises(SignatureMissing, match="is not signed"):
        signatures.verify_image(repo, unsigned, key.public)  # type: ignore[arg-type]
    with pytest.raises(SignatureMissing, match=r"no https://slsa.dev/provenance/v1 attestation"):
        signatures.verify_image(repo, image, key.public)  # type: ignore[arg-type]
    # copied to a mirror: the identity is the origin's unless told otherwise
    mirror = FakeRepository("mirror.local", "kiln/demo")
    mirror.blobs, mirror.manifests = repo.blobs, repo.manifests
    with pytest.raises(SignedIdentityMismatch):
        signatures.verify_image(mirror, image, key.public, required=())  # type: ignore[arg-type]
    done = signatures.verify_image(
        mirror,
        image,
        key.public,
        required=(cosign.CYCLONEDX_PREDICATE,),  # type: ignore[arg-type]
        signed_repository="registry.example.com/kiln/demo",
    )
    assert done.verified and json.loads(json.dumps(done.as_dict()))["key_fingerprint"] == key.public.fingerprint


@pytest.mark.parametrize(
    "ref, tag, digest",
    [
        ("registry.example.com/kiln/demo:stable", "stable", None),
        ("127.0.0.1:5000/kiln/demo@sha256:" + "a" * 64, None, "sha256:" + "a" * 64),
        ("http://localhost:5000/a/b/c:v1@sha256:" + "b" * 64, "v1", "sha256:" + "b" * 64),
    ],
)
def test_references(ref, tag, digest):
    parsed = signatures.parse_reference(ref)
    assert (parsed.tag, parsed.digest) == (tag, digest)
    assert str(parsed).endswith(ref.split("://")[-1].split("/", 1)[1])


@pytest.mark.parametrize(
    "ref",
    [
        "kiln/demo:stable",
        "registry.example.com/kiln/demo",
        "registry.example.com/kiln/demo@sha256:12",
        "r.example/x:bad tag",
    ],
)
def test_bad_references_are_one_line(ref):
    with pytest.raises(RegistryInvalid) as exc:
        signatures.parse_reference(ref)
    assert exc.value.exit_code == 40 and "\n" not in exc.value.message


def test_a_private_key_never_prints_its_secret():
    key = keys.generate()
    secret = key._key.private_numbers().private_value  # the test looks inside on purpose
    text = f"{key!r} {key!s} {key.public!r}"
    assert str(secret) not in text and f"{secret:x}" not in text
    assert key.public.fingerprint in repr(key)
