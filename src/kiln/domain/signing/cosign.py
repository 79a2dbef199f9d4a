"""cosign's on-registry formats: signatures (`.sig`) and attestations (`.att`).

Written from cosign's specifications and source, never from its code (cosign commit
d6d86c22, unless another is named):

- specs/SIGNATURE_SPEC.md, "Tag-based Discovery": the signature of `sha256:<hex>` lives
  under the tag `sha256-<hex>.sig` in the image's repository; attestations under
  `sha256-<hex>.att` (pkg/oci/remote/remote.go `AttestationTagSuffix`).
- An OCI image manifest (pkg/oci/empty `Signatures`: OCI manifest and OCI config media
  types) whose config is go-containerregistry's empty image plus one `rootfs.diff_ids`
  and one history entry per layer (specs/ATTESTATION_SPEC.md shows that config at 233
  bytes for one layer, which is what `_config` below writes).
- A signature layer: media type `application/vnd.dev.cosign.simplesigning.v1+json`
  (pkg/types/media.go `SimpleSigningMediaType`), blob = the simple-signing payload,
  annotation `dev.cosignproject.cosign/signature` = base64 of the ECDSA signature over
  the blob (pkg/oci/static/signature.go `SignatureAnnotationKey`).
- The payload (specs/SIGNATURE_SPEC.md "Simple Signing", containers/image
  docs/containers-signature.5.md): `{"critical": {"identity": {"docker-reference":
  REPO}, "image": {"docker-manifest-digest": DIGEST}, "type": "cosign container image
  signature"}, "optional": ...}`; containers/image accepts exactly those three critical
  fields and ignores unknown optional ones (signature/internal/sigstore_payload.go).
- An attestation layer: media type `application/vnd.dsse.envelope.v1+json`
  (pkg/types/payload.go `DssePayloadType`), blob = a DSSE envelope
  `{"payloadType": "application/vnd.in-toto+json", "payload": base64(statement),
  "signatures": [{"keyid": "", "sig": base64}]}`, annotations `predicateType` and an
  empty `dev.cosignproject.cosign/signature` (cmd/cosign/cli/attest/attest.go;
  static.NewAttestation passes "" as the signature). The DSSE signature is over
  PAE(payloadType, statement) (go-securesystemslib dsse/envelope.go `PAE`), and
  cosign refuses any other payloadType (pkg/cosign/verify.go `verifyOCIAttestation`).

Everything that parses registry content here raises SignatureMalformed with one line
naming what is wrong, never a traceback: the content is attacker-controlled.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

from kiln.basics.errors import SignatureMalformed, one_line

SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
DSSE = "application/vnd.dsse.envelope.v1+json"
IN_TOTO = "application/vnd.in-toto+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
PREDICATE_TYPE_ANNOTATION = "predicateType"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
_SIGNATURE_TYPE = "cosign container image signature"
_STATEMENT_V1 = "https://in-toto.io/Statement/v1"
_STATEMENT_TYPES = (_STATEMENT_V1, "https://in-toto.io/Statement/v0.1")  # cosign itself still writes v0.1
CYCLONEDX_PREDICATE = "https://cyclonedx.org/bom"  # in-toto-golang PredicateCycloneDX; cosign --type cyclonedx
SLSA_PROVENANCE_V1 = "https://slsa.dev/provenance/v1"  # cosign --type slsaprovenance1
# kiln's own optional claim: which key signed, so that "signed by another key" can be told
# apart from "tampered" (ECDSA alone cannot); optional claims are ignored by cosign and
# containers/image, and are unsigned hints until the signature verifies
SIGNER_CLAIM = "dev.kiln/signer"
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_EMPTY_TIME = "0001-01-01T00:00:00Z"  # Go's zero time.Time, what go-containerregistry writes


def _check_digest(digest: object, what: str = "digest") -> str:
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise SignatureMalformed(f"{what} {one_line(repr(digest))[:90]} is not sha256:<64 hex>")
    return digest


def signature_tag(digest: str) -> str:
    """`sha256:abc...` -> `sha256-abc....sig` (SIGNATURE_SPEC.md, tag-based discovery)."""
    return _check_digest(digest).replace(":", "-") + ".sig"


def attestation_tag(digest: str) -> str:
    """The tag cosign stores an image's attestations under: `sha256-<hex>.att`."""
    return _check_digest(digest).replace(":", "-") + ".att"


def sha256(data: bytes) -> str:
    """The `sha256:<hex>` digest of some bytes."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def compact(doc: Any) -> bytes:
    """JSON as Go's encoding/json writes it: no spaces (key order is the caller's)."""
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


# -- layers and manifests -------------------------------------------------------------------
@dataclass(frozen=True)
class Blob:
    """A blob to upload and its descriptor fields."""

    data: bytes
    media_type: str
    annotations: dict[str, str] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        """The blob's digest."""
        return sha256(self.data)

    @property
    def size(self) -> int:
        """The blob's size in bytes."""
        return len(self.data)

    def descriptor(self) -> _Descriptor:
        """The blob's OCI descriptor."""
        return _descriptor(self.media_type, self.size, self.digest, self.annotations)


@dataclass(frozen=True)
class LayerRef:
    """One layer descriptor as read from a .sig/.att manifest."""

    media_type: str
    digest: str
    size: int
    annotations: dict[str, str]

    def descriptor(self) -> _Descriptor:
        """The layer's OCI descriptor."""
        return _descriptor(self.media_type, self.size, self.digest, self.annotations)


class _Descriptor(TypedDict):
    """An OCI content descriptor as kiln writes it into a .sig/.att manifest."""

    mediaType: str
    size: int
    digest: str
    annotations: NotRequired[dict[str, str]]


def _descriptor(media_type: str, size: int, digest: str, annotations: dict[str, str]) -> _Descriptor:
    # OCI descriptor field order as go-containerregistry's v1.Descriptor marshals it
    desc: _Descriptor = {"mediaType": media_type, "size": size, "digest": digest}
    if annotations:
        desc["annotations"] = dict(annotations)
    return desc


@dataclass(frozen=True)
class ArtefactImage:
    """A .sig or .att image ready to upload: config, layers (new blobs, or layers already
    in the registry that are kept), manifest bytes."""

    config: Blob
    layers: list[Blob | LayerRef]
    manifest: bytes

    @property
    def digest(self) -> str:
        """The digest of the image's manifest."""
        return sha256(self.manifest)


def _config(layer_digests: list[str]) -> bytes:
    # go-containerregistry's empty.Image after mutate.Append of each layer: key order as
    # v1.ConfigFile marshals it, one empty-time history entry per layer, the uncompressed
    # layer digest as diff_id (cosign's static layers are not compressed)
    return compact(
        {
            "architecture": "",
            "created": _EMPTY_TIME,
            "history": [{"created": _EMPTY_TIME} for _ in layer_digests],
            "os": "",
            "rootfs": {"type": "layers", "diff_ids": list(layer_digests)},
            "config": {},
        }
    )


def artefact_image(layers: list[Blob | LayerRef]) -> ArtefactImage:
    """The OCI image cosign writes for a .sig or .att tag."""
    config = Blob(_config([layer.digest for layer in layers]), _OCI_CONFIG)
    manifest = compact(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": config.descriptor(),
            "layers": [layer.descriptor() for layer in layers],
        }
    )
    return ArtefactImage(config, list(layers), manifest)


def _load_json(data: bytes, what: str) -> Any:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        reason = f" ({exc.msg} at byte {exc.pos})" if isinstance(exc, json.JSONDecodeError) else ""
        raise SignatureMalformed(f"{what} is not JSON{reason}") from None


def _mapping(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SignatureMalformed(f"{what} is not a JSON object")
    return value


def parse_artefact_manifest(body: bytes, what: str) -> list[LayerRef]:
    """The layers of a .sig/.att manifest, each descriptor checked."""
    doc = _mapping(_load_json(body, what), what)
    if doc.get("schemaVersion") != 2:
        raise SignatureMalformed(
            f"{what} is not an image manifest (schemaVersion {one_line(repr(doc.get('schemaVersion')))})"
        )
    if "manifests" in doc:
        raise SignatureMalformed(f"{what} is an image index, not the image manifest cosign writes")
    layers = doc.get("layers")
    if not isinstance(layers, list) or not layers:
        raise SignatureMalformed(f"{what} has no layers")
    out = []
    for i, desc in enumerate(layers):
        where = f"{what} layer {i}"
        desc = _mapping(desc, where)  # the same entry, now typed  # noqa: PLW2901
        media_type, digest, size = desc.get("mediaType"), desc.get("digest"), desc.get("size")
        annotations = desc.get("annotations") or {}
        if not isinstance(media_type, str):
            raise SignatureMalformed(f"{where} has no mediaType")
        digest = _check_digest(digest, f"{where} digest")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise SignatureMalformed(f"{where} has no valid size")
        if not isinstance(annotations, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()
        ):
            raise SignatureMalformed(f"{where} annotations are not a string map")
        out.append(LayerRef(media_type, digest, size, dict(annotations)))
    return out


# -- signatures -----------------------------------------------------------------------------
def simple_signing_payload(docker_reference: str, manifest_digest: str, optional: dict[str, Any] | None) -> bytes:
    """The bytes cosign signs: field order as cosign's payload.SimpleContainerImage
    marshals it (critical: identity, image, type; then optional, null when empty)."""
    return compact(
        {
            "critical": {
                "identity": {"docker-reference": docker_reference},
                "image": {"docker-manifest-digest": _check_digest(manifest_digest)},
                "type": _SIGNATURE_TYPE,
            },
            "optional": optional or None,
        }
    )


@dataclass(frozen=True)
class SimpleSigning:
    """A cosign simple-signing payload: the image reference, its manifest digest and optional claims."""

    docker_reference: str
    manifest_digest: str
    optional: dict[str, Any] | None

    @property
    def signer_hint(self) -> str | None:
        """The key fingerprint kiln wrote into the optional claims (unverified until the
        signature verifies)."""
        value = (self.optional or {}).get(SIGNER_CLAIM)
        return value if isinstance(value, str) else None


def parse_simple_signing(payload: bytes, what: str) -> SimpleSigning:
    """A simple-signing payload, read as strictly as containers/image does (the three
    critical fields exactly, the type string exactly)."""
    doc = _mapping(_load_json(payload, what), what)
    if set(doc) != {"critical", "optional"}:
        raise SignatureMalformed(f"{what} has fields {sorted(doc)}, expected critical and optional")
    critical = _mapping(doc["critical"], f"{what} critical")
    if set(critical) != {"identity", "image", "type"}:
        raise SignatureMalformed(f"{what} critical has fields {sorted(critical)}, expected identity, image, type")
    if critical["type"] != _SIGNATURE_TYPE:
        raise SignatureMalformed(f"{what} is of type {one_line(repr(critical['type']))[:80]}, not {_SIGNATURE_TYPE!r}")
    image = _mapping(critical["image"], f"{what} critical.image")
    identity = _mapping(critical["identity"], f"{what} critical.identity")
    digest = _check_digest(image.get("docker-manifest-digest"), f"{what} docker-manifest-digest")
    reference = identity.get("docker-reference")
    if not isinstance(reference, str):
        raise SignatureMalformed(f"{what} has no critical.identity.docker-reference")
    optional = doc["optional"]
    if optional is not None and not isinstance(optional, dict):
        raise SignatureMalformed(f"{what} optional is neither null nor an object")
    return SimpleSigning(reference, digest, optional)


def decode_signature(text: str, what: str) -> bytes:
    """The base64 signature annotation, as cosign decodes it (base64.StdEncoding)."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if not raw:
        raise SignatureMalformed(f"{what} is not a base64 signature")
    return raw


def signature_layer(payload: bytes, signature: bytes) -> Blob:
    """The .sig layer of a signature: the payload, its signature in the layer's annotation."""
    return Blob(payload, SIMPLE_SIGNING, {SIGNATURE_ANNOTATION: base64.b64encode(signature).decode()})


# -- attestations (DSSE + in-toto) -------------------------------------------------------------
def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE's pre-authentication encoding: `DSSEv1 <len> <type> <len> <body>` (lengths in
    bytes, ASCII decimal), the exact bytes a DSSE signature covers."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(body), body)


class _StatementDigest(TypedDict):
    sha256: str


class StatementSubject(TypedDict):
    """One subject of an in-toto statement: its name and digests."""

    name: str
    digest: _StatementDigest


class InTotoStatement(TypedDict):
    """An in-toto Statement v1 as kiln writes it (the DSSE payload of an attestation)."""

    _type: str
    subject: list[StatementSubject]
    predicateType: str
    predicate: Mapping[str, object]


def statement(predicate_type: str, predicate: Mapping[str, object], subjects: list[tuple[str, str]]) -> InTotoStatement:
    """An in-toto Statement v1 about `subjects` ((name, "sha256:<hex>") pairs). Only the
    fields of the in-toto v1 protobuf, since cosign parses statements with protojson,
    which refuses unknown fields (pkg/cosign/attestation/attestation.go UnmarshalJSON)."""
    return {
        "_type": _STATEMENT_V1,
        "subject": [
            {"name": name, "digest": {"sha256": _check_digest(digest).removeprefix("sha256:")}}
            for name, digest in subjects
        ],
        "predicateType": predicate_type,
        "predicate": predicate,
    }


def envelope(body: bytes, signature: bytes, payload_type: str = IN_TOTO) -> bytes:
    """A DSSE envelope as go-securesystemslib marshals it (payloadType, payload,
    signatures[{keyid, sig}]); keyid empty, as cosign writes for key-pair signatures."""
    return compact(
        {
            "payloadType": payload_type,
            "payload": base64.b64encode(body).decode(),
            "signatures": [{"keyid": "", "sig": base64.b64encode(signature).decode()}],
        }
    )


def attestation_layer(envelope_bytes: bytes, predicate_type: str) -> Blob:
    """The .att layer of an attestation: the DSSE envelope, its predicate type annotated."""
    return Blob(envelope_bytes, DSSE, {SIGNATURE_ANNOTATION: "", PREDICATE_TYPE_ANNOTATION: predicate_type})


@dataclass(frozen=True)
class Envelope:
    """A DSSE envelope: its payload type, decoded body and signatures."""

    payload_type: str
    body: bytes
    signatures: list[bytes]


def parse_envelope(data: bytes, what: str) -> Envelope:
    """Decode a DSSE envelope; SignatureMalformed naming `what` when it is not one."""
    doc = _mapping(_load_json(data, what), what)
    payload_type, payload, sigs = doc.get("payloadType"), doc.get("payload"), doc.get("signatures")
    if not isinstance(payload_type, str):
        raise SignatureMalformed(f"{what} has no payloadType (not a DSSE envelope)")
    if not isinstance(payload, str):
        raise SignatureMalformed(f"{what} has no payload (not a DSSE envelope)")
    try:
        # go-securesystemslib b64Decode: standard base64 first, then URL-safe
        body = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        try:
            body = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        except (binascii.Error, ValueError):
            raise SignatureMalformed(f"{what} payload is not base64") from None
    if not isinstance(sigs, list) or not sigs:
        raise SignatureMalformed(f"{what} has no signatures")
    out = []
    for i, sig in enumerate(sigs):
        if not isinstance(sig, dict) or not isinstance(sig.get("sig"), str):
            raise SignatureMalformed(f"{what} signature {i} has no sig")
        out.append(decode_signature(sig["sig"], f"{what} signature {i}"))
    return Envelope(payload_type, body, out)


@dataclass(frozen=True)
class Statement:
    """The parts of an in-toto statement that verification reads: predicate type and subjects."""

    predicate_type: str
    subject_digests: list[str]  # "sha256:<hex>" of every subject that names one
    subject_names: list[str]


def parse_statement(body: bytes, what: str) -> Statement:
    """Decode an in-toto statement; SignatureMalformed naming `what` when it is not one."""
    doc = _mapping(_load_json(body, what), what)
    kind, predicate_type, subjects = doc.get("_type"), doc.get("predicateType"), doc.get("subject")
    if kind not in _STATEMENT_TYPES:
        raise SignatureMalformed(f"{what} is not an in-toto statement (_type {one_line(repr(kind))[:80]})")
    if not isinstance(predicate_type, str) or not predicate_type:
        raise SignatureMalformed(f"{what} has no predicateType")
    if not isinstance(subjects, list) or not subjects:
        raise SignatureMalformed(f"{what} has no subject")
    digests, names = [], []
    for i, subject in enumerate(subjects):
        # cosign: "invalid in-toto statement: null subject entry" (IntotoSubjectClaimVerifier)
        subject = _mapping(subject, f"{what} subject {i}")  # the same entry, now typed  # noqa: PLW2901
        hexdigest = (subject.get("digest") or {}).get("sha256") if isinstance(subject.get("digest"), dict) else None
        if isinstance(hexdigest, str):
            digests.append("sha256:" + hexdigest)
        if isinstance(subject.get("name"), str):
            names.append(subject["name"])
    return Statement(predicate_type, digests, names)
