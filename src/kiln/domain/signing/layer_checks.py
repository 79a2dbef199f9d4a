"""Checking cosign's signature (`.sig`) and attestation (`.att`) images, layer by layer:
each layer against the key, the image digest and the repository identity it must name,
its blobs fetched with a size cap. When a manifest holds several layers, one good layer
is enough (cosign's rule); when none is, the most telling failure is raised."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from kiln.basics.errors import (
    AttestationSubjectMismatch,
    KilnError,
    SignatureInvalid,
    SignatureMalformed,
    SignatureMissing,
    SignedByOtherKey,
    SignedDigestMismatch,
    SignedIdentityMismatch,
    one_line,
)
from kiln.domain.signing import cosign
from kiln.domain.signing.keys import PublicKey
from kiln.infra.registry import BlobTooLarge, RegistryClient, Target

_MAX_PAYLOAD_BYTES = 64 * 1024  # a simple-signing payload is ~300 bytes
_MAX_ENVELOPE_BYTES = 64 * 1024 * 1024  # an SBOM of a large image is a few MB; cosign's own cap is 128 MiB


# the failures a layer can have, least telling first (the last one seen of the highest
# rank is what a verification that found no good layer reports)
_RANK: tuple[type[KilnError], ...] = (
    SignatureMalformed,
    SignatureInvalid,
    SignedByOtherKey,
    SignedIdentityMismatch,
    AttestationSubjectMismatch,
    SignedDigestMismatch,
)
_LayerFailure = _RANK  # what one layer can fail with: the ranked kinds, no other
_Fetch = Callable[[cosign.LayerRef, int], bytes]


# -- the identity a signature names ---------------------------------------------------------------
_DOCKER_HUB = ("docker.io", "index.docker.io", "registry-1.docker.io")


def identity(target: Target) -> str:
    """The `docker-reference` a signature names: HOST/PATH as go-containerregistry spells a
    repository (cosign writes `digest.Repository.String()`; Docker Hub is index.docker.io)."""
    host = "index.docker.io" if target.host in _DOCKER_HUB else target.host
    return f"{host}/{target.path}"


def _same_identity(signed: str, expected: str) -> bool:
    def norm(ref: str) -> str:
        host, _, path = ref.partition("/")
        return f"{'docker.io' if host in _DOCKER_HUB else host}/{path}"

    return norm(signed) == norm(expected)


# -- checking one layer ---------------------------------------------------------------------------
def _check_signature_layer(
    layer: cosign.LayerRef, payload: bytes, key: PublicKey, digest: str, repository: str, where: str
) -> cosign.SimpleSigning:
    """One simple-signing layer against the key, the image digest and the repository."""
    if layer.media_type != cosign.SIMPLE_SIGNING:
        raise SignatureMalformed(
            f"{where} is of media type {one_line(layer.media_type)[:80]}, not {cosign.SIMPLE_SIGNING}"
        )
    annotation = layer.annotations.get(cosign.SIGNATURE_ANNOTATION)
    if annotation is None:
        raise SignatureMalformed(f"{where} has no {cosign.SIGNATURE_ANNOTATION} annotation")
    signature = cosign.decode_signature(annotation, f"{where} annotation {cosign.SIGNATURE_ANNOTATION}")
    claims = cosign.parse_simple_signing(payload, f"{where} payload")
    if not key.verifies(signature, payload):
        hint = claims.signer_hint
        if hint and hint != key.fingerprint:
            raise SignedByOtherKey(f"{where} is signed by key {hint}, not by {key.source} ({key.fingerprint})")
        raise SignatureInvalid(
            f"{where} does not verify with {key.source} ({key.fingerprint}): "
            "the payload or the signature was altered, or another key signed it"
        )
    if claims.manifest_digest != digest:
        raise SignedDigestMismatch(
            f"{where} is a genuine signature of {claims.manifest_digest}, not of "
            f"{digest}: the image under this reference is not the one that was signed"
        )
    if not _same_identity(claims.docker_reference, repository):
        raise SignedIdentityMismatch(
            f"{where} was signed for {one_line(claims.docker_reference)[:200]}, not for {repository}"
        )
    return claims


def _dsse_verifies(env: cosign.Envelope, key: PublicKey) -> bool:
    """Any of the envelope's signatures verifies over PAE(payloadType, body)."""
    message = cosign.pae(env.payload_type, env.body)
    return any(key.verifies(sig, message) for sig in env.signatures)


def _check_attestation_layer(
    layer: cosign.LayerRef, data: bytes, key: PublicKey, digest: str, where: str
) -> cosign.Statement:
    """One DSSE layer: envelope form, payload type, signature, then the in-toto subject."""
    if layer.media_type != cosign.DSSE:
        raise SignatureMalformed(f"{where} is of media type {one_line(layer.media_type)[:80]}, not {cosign.DSSE}")
    env = cosign.parse_envelope(data, f"{where} envelope")
    if env.payload_type != cosign.IN_TOTO:
        # cosign's verifyOCIAttestation refuses these before it looks at the signature
        raise SignatureMalformed(
            f"{where} envelope has payloadType {one_line(env.payload_type)[:80]!r}; "
            f"cosign accepts only {cosign.IN_TOTO}"
        )
    statement = cosign.parse_statement(env.body, f"{where} statement")
    if not _dsse_verifies(env, key):
        raise SignatureInvalid(
            f"{where} ({statement.predicate_type}) does not verify with {key.source} "
            f"({key.fingerprint}): the statement or its signature was altered, or another key signed it"
        )
    if digest not in statement.subject_digests:
        subjects = ", ".join(statement.subject_digests) or "no sha256 digest"
        raise AttestationSubjectMismatch(
            f"{where} ({statement.predicate_type}) is a genuine attestation about {subjects[:200]}, not about {digest}"
        )
    return statement


def _most_telling(failures: list[KilnError]) -> KilnError:
    return max(reversed(failures), key=lambda exc: _RANK.index(type(exc)) if type(exc) in _RANK else -1)


# -- checking a .sig / .att image ----------------------------------------------------------------------
@dataclass(frozen=True)
class _AttestationCheck:
    predicate_type: str
    layer_digest: str
    verified: bool
    problem: str | None = None


class _VerifiedSignature(NamedTuple):
    """The layer of a .sig manifest that verified, and what its payload claims."""

    layer: cosign.LayerRef
    claims: cosign.SimpleSigning


def _verify_signature_image(
    body: bytes, fetch: _Fetch, key: PublicKey, digest: str, repository: str, where: str
) -> _VerifiedSignature:
    """The first layer of a .sig manifest that verifies, or the most telling failure."""
    layers = cosign.parse_artefact_manifest(body, where)
    failures: list[KilnError] = []
    for i, layer in enumerate(layers):
        at = f"{where} layer {i}" if len(layers) > 1 else where
        try:
            payload = fetch(layer, _MAX_PAYLOAD_BYTES)
            return _VerifiedSignature(layer, _check_signature_layer(layer, payload, key, digest, repository, at))
        except _LayerFailure as exc:
            failures.append(exc)
    raise _most_telling(failures)


def _verify_attestation_image(
    body: bytes, fetch: _Fetch, key: PublicKey, digest: str, required: Sequence[str], where: str
) -> list[_AttestationCheck]:
    """Every layer of a .att manifest checked; each required predicate type needs one good
    layer (cosign's rule for verify-attestation --type)."""
    layers = cosign.parse_artefact_manifest(body, where)
    checks: list[_AttestationCheck] = []
    failures: dict[str, list[KilnError]] = {}
    for i, layer in enumerate(layers):
        at = f"{where} layer {i}"
        # the annotation is unsigned: it only labels a layer that fails; a good layer's type
        # is its signed statement's
        label = layer.annotations.get(cosign.PREDICATE_TYPE_ANNOTATION, "(no predicateType)")
        try:
            statement = _check_attestation_layer(layer, fetch(layer, _MAX_ENVELOPE_BYTES), key, digest, at)
        except _LayerFailure as exc:
            failures.setdefault(label, []).append(exc)
            checks.append(_AttestationCheck(label, layer.digest, False, exc.message))
            continue
        checks.append(_AttestationCheck(statement.predicate_type, layer.digest, True))
    for kind in required:
        if any(c.verified and c.predicate_type == kind for c in checks):
            continue
        if kind in failures:
            raise _most_telling(failures[kind])
        others = [f for fs in failures.values() for f in fs]
        if others and not any(c.verified for c in checks):
            raise _most_telling(others)
        found = ", ".join(sorted({c.predicate_type for c in checks})) or "none"
        raise SignatureMissing(f"{where} holds no {kind} attestation (found: {found})")
    return checks


# -- fetching a layer's blob -----------------------------------------------------------------------
def _fetcher(client: RegistryClient, where: str) -> _Fetch:
    def fetch(layer: cosign.LayerRef, limit: int) -> bytes:
        if layer.size > limit:
            raise SignatureMalformed(
                f"{where}: layer {layer.digest} claims {layer.size} bytes, more than "
                f"any signature artefact ({limit} bytes)"
            )
        try:
            data = client.blob(layer.digest, limit)
        except BlobTooLarge:
            raise SignatureMalformed(f"{where}: layer {layer.digest} is larger than {limit} bytes") from None
        if data is None:
            raise SignatureMalformed(f"{where}: layer blob {layer.digest} is missing from the registry")
        if len(data) != layer.size:
            raise SignatureMalformed(
                f"{where}: layer {layer.digest} is {len(data)} bytes, its descriptor says {layer.size}"
            )
        return data

    return fetch
