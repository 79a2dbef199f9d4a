"""Signing a pushed image and verifying one, in cosign's registry layout (domain/signing/cosign.py).

Signing writes two small OCI images next to the signed one, by tag:

    sha256-<hex>.sig   one simple-signing layer per signature (cosign appends; so does kiln,
                       keeping other signers' layers)
    sha256-<hex>.att   one DSSE-envelope layer per attestation (kiln replaces its own
                       predicate types and keeps the rest, as `cosign attest --replace`)

Verification reads them back and checks, in order: the signature over the payload with
the given key; the payload's manifest digest against the image's; its repository
identity against the repository verified; then every attestation's DSSE signature and
in-toto subject. Each failure is its own error class (exit code) and one line. When a
manifest holds several layers, one good layer is enough (cosign's rule); when none is,
the most telling failure is reported (a genuine signature for another digest says more
than a broken one).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Annotated, Literal, NamedTuple, cast

from pydantic import StringConstraints, with_config
from typing_extensions import TypedDict

from kiln.basics import image_ref, log
from kiln.basics.errors import (
    AttestationSubjectMismatch,
    ChannelEmpty,
    KilnError,
    RegistryInvalid,
    SignatureInvalid,
    SignatureMalformed,
    SignatureMissing,
    SignedByOtherKey,
    SignedDigestMismatch,
    SignedIdentityMismatch,
    one_line,
)
from kiln.basics.json_types import CLOSED, Sha256
from kiln.domain.signing import cosign
from kiln.domain.signing.keys import PrivateKey, PublicKey
from kiln.infra.manifests import index_children
from kiln.infra.registry import TAG, BlobTooLarge, RegistryClient, Target

_MAX_PAYLOAD_BYTES = 64 * 1024  # a simple-signing payload is ~300 bytes
_MAX_ENVELOPE_BYTES = 64 * 1024 * 1024  # an SBOM of a large image is a few MB; cosign's own cap is 128 MiB
KILN_PREDICATES = (cosign.CYCLONEDX_PREDICATE, cosign.SLSA_PROVENANCE_V1)

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
_LayerFailure = (
    SignatureMalformed,
    SignatureInvalid,
    SignedByOtherKey,
    SignedIdentityMismatch,
    AttestationSubjectMismatch,
    SignedDigestMismatch,
)
_Fetch = Callable[[cosign.LayerRef, int], bytes]


@dataclass(frozen=True)
class Attestation:
    """An in-toto statement to sign and attach, and its predicate type."""

    predicate_type: str
    statement: cosign.InTotoStatement


# -- identities and references ----------------------------------------------------------------
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


@dataclass(frozen=True)
class _ImageRef:
    """What `kiln verify` was asked about: a repository and a tag, a digest, or both
    (`REPO:TAG@sha256:...`: the tag must still point at that digest)."""

    target: Target
    tag: str | None
    digest: str | None

    def __str__(self) -> str:
        tag = f":{self.tag}" if self.tag else ""
        digest = f"@{self.digest}" if self.digest else ""
        return f"{self.target.host}/{self.target.path}{tag}{digest}"


def parse_reference(ref: str, *, plain_http: bool = False) -> _ImageRef:
    """`[http://|https://]HOST[:PORT]/PATH[:TAG][@sha256:HEX]`."""
    text = ref.strip()
    scheme, sep, rest = text.partition("://")
    prefix = f"{scheme}://" if sep else ""
    rest = rest if sep else text
    parts = image_ref.parse(rest)
    if parts.digest is not None and not re.match(r"^sha256:[0-9a-f]{64}$", parts.digest):
        raise RegistryInvalid(f"{one_line(ref)}: {one_line(parts.digest)[:80]!r} is not a sha256:<64 hex> digest")
    if parts.host is None or not parts.path:
        raise RegistryInvalid(
            f"{one_line(ref)} names no registry host; write HOST[:PORT]/REPOSITORY[:TAG]",
            hint="kiln has no default registry: e.g. registry.example.com/kiln/tiny-moe:stable",
        )
    if parts.tag is not None and not TAG.match(parts.tag):
        raise RegistryInvalid(f"{one_line(ref)}: {one_line(parts.tag)!r} is not a valid tag")
    if parts.tag is None and parts.digest is None:
        raise RegistryInvalid(
            f"{one_line(ref)} names neither a tag nor a digest",
            hint="append :TAG or @sha256:DIGEST (kiln does not assume :latest)",
        )
    target = Target.parse(prefix + parts.host, parts.path, plain_http=plain_http)
    return _ImageRef(target, parts.tag, parts.digest)


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


# -- against a registry -------------------------------------------------------------------------------
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


# cosign's tags of a digest's signature and attestations (cosign.signature_tag, attestation_tag)
_SignatureTag = Annotated[str, StringConstraints(pattern=r"^sha256-[0-9a-f]{64}\.sig$")]
_AttestationTag = Annotated[str, StringConstraints(pattern=r"^sha256-[0-9a-f]{64}\.att$")]


@with_config(CLOSED)
class AttestationCheckJson(TypedDict):
    """One attestation of the verified image, and whether it verified."""

    predicate_type: str
    layer_digest: Sha256
    verified: bool
    problem: str | None


@with_config(CLOSED)
class VerificationJson(TypedDict):
    """`kiln verify --json` (src/kiln/schemas/verify.json): a Verification as its fields."""

    reference: str
    repository: str
    digest: Sha256
    key_fingerprint: Sha256
    signature_tag: _SignatureTag
    signature_manifest: Sha256
    signature_layer: Sha256
    signed_identity: str
    attestation_tag: _AttestationTag | None
    attestation_manifest: Sha256 | None
    attestations: list[AttestationCheckJson]
    verified: Literal[True]
    platforms: dict[str, VerificationJson]
    """An image index: each platform's image (OS/ARCH), verified as the index is; {} for a single image."""


@dataclass
class Verification:
    """What `kiln verify` and a signed publish found (no key material: a fingerprint)."""

    reference: str
    repository: str
    digest: str
    key_fingerprint: str
    signature_tag: str
    signature_manifest: str
    signature_layer: str
    signed_identity: str
    attestation_tag: str | None = None
    attestation_manifest: str | None = None
    attestations: list[_AttestationCheck] = field(default_factory=list)
    verified: bool = True
    platforms: dict[str, Verification] = field(default_factory=dict)

    def as_dict(self) -> VerificationJson:
        return cast("VerificationJson", asdict(self))  # asdict of exactly these fields


def resolve(client: RegistryClient, ref: _ImageRef) -> str:
    """The manifest digest `ref` names now; a pinned digest its tag no longer points at fails."""
    where = f"{ref.target.host}/{ref.target.path}"
    if ref.tag:
        manifest = client.manifest(ref.tag)
        if manifest is None:
            raise ChannelEmpty(
                f"{where}:{ref.tag} does not exist; nothing to verify",
                hint="check the reference (`kiln publish` prints the pinned one)",
            )
        if ref.digest and manifest.digest != ref.digest:
            raise SignedDigestMismatch(
                f"{where}:{ref.tag} now points at {manifest.digest}, not at the pinned {ref.digest}: the tag moved"
            )
        return manifest.digest
    assert ref.digest is not None  # for mypy: a resolved ref has a digest  # noqa: S101
    if client.manifest(ref.digest) is None:
        raise ChannelEmpty(
            f"{where}@{ref.digest} does not exist; nothing to verify",
            hint="check the reference (`kiln publish` prints the pinned one)",
        )
    return ref.digest


def verify_image(
    client: RegistryClient,
    digest: str,
    key: PublicKey,
    *,
    required: Sequence[str] = KILN_PREDICATES,
    reference: str | None = None,
    signed_repository: str | None = None,
) -> Verification:
    """Verify the signature (and, for each `required` predicate type, an attestation) of
    `digest` in the client's repository; raises the failure's error class.
    `signed_repository` accepts signatures made for another repository name (an image
    copied to a mirror keeps the signature it was given at its origin)."""
    target = client.target
    repository = signed_repository or identity(target)
    sig_tag = cosign.signature_tag(digest)
    where = f"{target.host}/{target.path}:{sig_tag}"
    manifest = client.manifest(sig_tag)
    if manifest is None:
        raise SignatureMissing(f"{digest} in {target.host}/{target.path} is not signed: no {sig_tag}")
    layer, claims = _verify_signature_image(manifest.body, _fetcher(client, where), key, digest, repository, where)
    result = Verification(
        reference or target.pinned(digest),
        repository,
        digest,
        key.fingerprint,
        sig_tag,
        manifest.digest,
        layer.digest,
        claims.docker_reference,
    )
    if required:
        att_tag = cosign.attestation_tag(digest)
        at = f"{target.host}/{target.path}:{att_tag}"
        att = client.manifest(att_tag)
        if att is None:
            raise SignatureMissing(f"{digest} in {target.host}/{target.path} has no attestations: no {att_tag}")
        result.attestation_tag, result.attestation_manifest = att_tag, att.digest
        result.attestations = _verify_attestation_image(att.body, _fetcher(client, at), key, digest, required, at)
    result.platforms = _verify_platforms(client, digest, key, required, signed_repository)
    return result


# buildx lists its own attestation manifests in an index under this platform; they are no image
_NOT_A_PLATFORM = "unknown/unknown"


def _verify_platforms(
    client: RegistryClient, digest: str, key: PublicKey, required: Sequence[str], signed_repository: str | None
) -> dict[str, Verification]:
    """For an image index, each platform's image verified as the index was: a signed index
    whose arm64 image is unsigned, or lacks its own SBOM, fails (`kiln publish --sign`
    signs and attests each, as `cosign sign --recursive` does). {} for a single image."""
    manifest = client.manifest(digest)
    if manifest is None or not manifest.is_index:
        return {}
    checked = {}
    for plat, child in index_children(manifest):
        if plat == _NOT_A_PLATFORM:
            continue
        try:
            checked[plat] = verify_image(client, child, key, required=required, signed_repository=signed_repository)
        except KilnError as exc:
            exc.message = f"{plat} image of index {digest}: {exc.message}"
            raise
    return checked


# -- signing --------------------------------------------------------------------------------------------
@dataclass
class _SigningResult:
    key_fingerprint: str
    signature_tag: str
    signature_manifest: str
    attestation_tag: str | None
    attestation_manifest: str | None
    predicate_types: list[str]
    signature_reused: bool  # the .sig already held a good signature by this key


def _existing_layers(client: RegistryClient, tag: str) -> list[cosign.LayerRef]:
    manifest = client.manifest(tag)
    if manifest is None:
        return []
    try:
        return cosign.parse_artefact_manifest(manifest.body, f"{client.target.ref(tag)}")
    except SignatureMalformed as exc:
        log.warn(f"{exc.message}; replacing it")
        return []


def _push(client: RegistryClient, tag: str, image: cosign.ArtefactImage) -> str:
    for blob in (image.config, *image.layers):
        if isinstance(blob, cosign.Blob):
            client.upload_blob(blob.data)
    return client.put_raw_manifest(tag, image.manifest, cosign.OCI_MANIFEST).digest


def sign_image(
    client: RegistryClient, digest: str, key: PrivateKey, attestations: Sequence[Attestation], *, creator: str
) -> _SigningResult:
    """Sign `digest` and attach `attestations` in the client's repository (see module doc).
    The payload's optional claims carry the creator, the time and the signing key's
    fingerprint (public; it lets a verifier name the key that signed)."""
    target = client.target
    repository = identity(target)
    fingerprint = key.public.fingerprint
    sig_tag = cosign.signature_tag(digest)
    kept: list[cosign.LayerRef] = []
    reused = False
    fetch = _fetcher(client, target.ref(sig_tag))
    for layer in _existing_layers(client, sig_tag):
        try:
            payload = fetch(layer, _MAX_PAYLOAD_BYTES)
        except SignatureMalformed as exc:  # a damaged layer is dropped, not carried along
            log.warn(f"{exc.message}; dropping that layer")
            continue
        try:
            _check_signature_layer(layer, payload, key.public, digest, repository, sig_tag)
            reused = True
        except _LayerFailure:
            pass
        kept.append(layer)  # other signers' signatures stay, as `cosign sign` appends
    present = client.manifest(sig_tag) if reused else None  # None too when it went meanwhile
    if present is not None:
        signature_manifest = present.digest
    else:
        payload = cosign.simple_signing_payload(
            repository, digest, {"creator": creator, "timestamp": int(time.time()), cosign.SIGNER_CLAIM: fingerprint}
        )
        ours = cosign.signature_layer(payload, key.sign(payload))
        signature_manifest = _push(client, sig_tag, cosign.artefact_image([*kept, ours]))
    att_tag, att_manifest = None, None
    types = [a.predicate_type for a in attestations]
    if attestations:
        att_tag = cosign.attestation_tag(digest)
        # other predicate types stay (`cosign attest --replace` keeps them too), if their blobs still exist
        others = [
            layer
            for layer in _existing_layers(client, att_tag)
            if layer.annotations.get(cosign.PREDICATE_TYPE_ANNOTATION) not in types and client.has_blob(layer.digest)
        ]
        layers: list[cosign.Blob | cosign.LayerRef] = list(others)
        for att in attestations:
            body = cosign.compact(att.statement)
            env = cosign.envelope(body, key.sign(cosign.pae(cosign.IN_TOTO, body)))
            layers.append(cosign.attestation_layer(env, att.predicate_type))
        att_manifest = _push(client, att_tag, cosign.artefact_image(layers))
    return _SigningResult(fingerprint, sig_tag, signature_manifest, att_tag, att_manifest, types, reused)
