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
than a broken one). The checks themselves: domain/signing/layer_checks.py.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Annotated, Literal, cast

from pydantic import StringConstraints, with_config
from typing_extensions import TypedDict

from kiln.basics import image_ref, log
from kiln.basics.errors import (
    ChannelEmpty,
    KilnError,
    RegistryInvalid,
    SignatureMalformed,
    SignatureMissing,
    SignedDigestMismatch,
    one_line,
)
from kiln.basics.json_types import CLOSED, Sha256
from kiln.domain.signing import cosign
from kiln.domain.signing.keys import PrivateKey, PublicKey
from kiln.domain.signing.layer_checks import (
    _MAX_PAYLOAD_BYTES,
    _AttestationCheck,
    _check_signature_layer,
    _fetcher,
    _LayerFailure,
    _verify_attestation_image,
    _verify_signature_image,
    identity,
)
from kiln.infra.manifests import index_children
from kiln.infra.registry import TAG, RegistryClient, Target

KILN_PREDICATES = (cosign.CYCLONEDX_PREDICATE, cosign.SLSA_PROVENANCE_V1)


@dataclass(frozen=True)
class Attestation:
    """An in-toto statement to sign and attach, and its predicate type."""

    predicate_type: str
    statement: cosign.InTotoStatement


# -- references ---------------------------------------------------------------------------------------
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


# -- against a registry -------------------------------------------------------------------------------


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
        """The verification as `kiln verify --json` writes it."""
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
