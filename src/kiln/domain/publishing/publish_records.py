"""The documents a publish or promote writes: its record (publish/<recipe>-<kind>-<time>.json
in the records folder) and its --json, and the image a publish record pins (what
`kiln render k8s` deploys)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, NotRequired

from pydantic import with_config
from typing_extensions import TypedDict

from kiln.basics import clock
from kiln.basics.documents import Shape, read_document
from kiln.basics.errors import ImageNotPublished, RecordInvalid
from kiln.basics.files import write_atomic
from kiln.basics.json_types import CLOSED, DESCRIBED, Sha256, Strings1
from kiln.basics.paths import results_dir, shown_home
from kiln.infra.records import SmokeLevel


@with_config(DESCRIBED)
class SmokeEvidence(TypedDict):
    """The smoke test behind a publish or promote."""

    status: Literal["passed", "skipped"]
    """skipped: --skip-smoke-check."""
    record: NotRequired[str]
    """The passing smoke record, when there is one."""
    level: NotRequired[SmokeLevel]
    """The record's level: served, or in-image (a GPU image proved without a GPU)."""


@with_config(DESCRIBED)
class PlatformEntry(TypedDict):
    """One platform of a multi-platform publish: what the image index holds for it."""

    image_id: Sha256
    input_digest: Sha256
    manifest_digest: Sha256
    tag: str
    smoke_record: str
    smoke_level: NotRequired[SmokeLevel]
    """The smoke record's level: in-image = proved inside the image without serving (kiln smoke --in-image, no GPU)."""
    signature: NotRequired[SignatureEvidence]
    """--sign: this platform's image signed and attested (its own SBOM and provenance), verified from the registry."""


@with_config(CLOSED)
class AttestationEntry(TypedDict):
    """One attestation of the signed image, and whether it verified."""

    predicate_type: str
    layer_digest: Sha256
    verified: bool
    problem: str | None


@with_config(CLOSED)
class SignatureEvidence(TypedDict):
    """--sign / --key: what was signed or verified (a key fingerprint, never key material)."""

    key_fingerprint: Sha256
    signature_tag: str
    verified: Literal[True]
    signature_manifest: NotRequired[Sha256]
    attestation_tag: NotRequired[str | None]
    attestation_manifest: NotRequired[Sha256 | None]
    predicate_types: NotRequired[list[str]]
    signature_reused: NotRequired[bool]
    attestations: NotRequired[list[AttestationEntry]]


@dataclass
class PublishResult:
    """What a publish did: the image pushed, its manifest, the channel moved and the tags written."""

    recipe: str
    image_id: str  # what was pushed (differs from the built id only with --skip-smoke-check)
    input_digest: str
    manifest_digest: str
    registry: str
    repository: str
    channel: str | None  # None: --skip-smoke-check moves no channel
    tags: list[str]  # full references, in the order they were written
    pushed: bool  # False: the registry already held this image, only tags were checked
    smoke: SmokeEvidence = field(default_factory=lambda: SmokeEvidence(status="passed"))
    record: str = ""
    signature: SignatureEvidence | None = None  # --sign: tags, manifests, key fingerprint (never key material)
    # a multi-platform recipe: per platform, its image id, input digest and manifest digest
    # (manifest_digest is then the image index's, input_digest the digest of the set)
    platforms: dict[str, PlatformEntry] = field(default_factory=dict)

    @property
    def pinned(self) -> str:
        """The pushed image's reference by digest."""
        return f"{self.registry}/{self.repository}@{self.manifest_digest}"


@dataclass
class PromoteResult:
    """What a promote did: the image, the channels it moved between and whether the tag moved."""

    recipe: str
    image_id: str
    manifest_digest: str
    registry: str
    repository: str
    from_channel: str
    to_channel: str
    moved: bool  # False: the target channel already pointed there
    smoke: SmokeEvidence = field(default_factory=lambda: SmokeEvidence(status="passed"))
    record: str = ""
    signature: SignatureEvidence | None = None  # the verification done before the channel moved

    @property
    def pinned(self) -> str:
        """The promoted image's reference by digest."""
        return f"{self.registry}/{self.repository}@{self.manifest_digest}"


@with_config(DESCRIBED)
class PublishDocument(TypedDict):
    """`kiln publish --json` (src/kiln/schemas/publish.json): the PublishResult and `pinned`."""

    recipe: str
    image_id: Sha256
    input_digest: Sha256
    manifest_digest: Sha256
    registry: str
    repository: str
    channel: str | None
    """null: --skip-smoke-check moves no channel."""
    tags: Strings1
    pushed: bool
    smoke: SmokeEvidence
    record: str
    pinned: str
    """HOST/REPOSITORY@sha256:..."""
    signature: NotRequired[SignatureEvidence | None]
    """--sign: what was signed, verified from the registry (a key fingerprint, never key material)."""
    platforms: NotRequired[dict[str, PlatformEntry]]
    """A multi-platform publish (an OCI image index): per platform, what the index holds."""


@with_config(DESCRIBED)
class PromoteDocument(TypedDict):
    """`kiln promote --json` (src/kiln/schemas/promote.json): the PromoteResult and `pinned`."""

    recipe: str
    image_id: Sha256
    manifest_digest: Sha256
    registry: str
    repository: str
    from_channel: str
    to_channel: str
    moved: bool
    """false: the target channel already pointed there."""
    smoke: SmokeEvidence
    record: str
    pinned: str
    """HOST/REPOSITORY@sha256:..."""
    signature: NotRequired[SignatureEvidence | None]
    """--sign / --key: what was signed or verified before the channel moved (a key fingerprint, never key material)."""


# a publish record (publish/<recipe>-publish-<time>.json) is {"kind": "publish", **PublishDocument}
_PUBLISH_RECORD = Shape(PublishDocument)


def published_image(name: str, input_digest: str) -> str:
    """REGISTRY/REPO@sha256:... of the newest publish record of `name` built from the
    recipe's current inputs (for a multi-platform recipe: the index holding them).
    RecordInvalid when one of its records is not a publish record as kiln writes it."""
    folder = results_dir() / "publish"
    records: list[PublishDocument] = []
    for path in sorted(folder.glob(f"{name}-publish-*.json")):
        doc = read_document(path, _PUBLISH_RECORD, RecordInvalid, source=shown_home(path))
        if doc["recipe"] == name and doc["manifest_digest"]:
            records.append(doc)
    # a multi-platform publish (an image index) holds this image as one of its platforms
    current = [
        d
        for d in records
        if d["input_digest"] == input_digest
        or input_digest in {p["input_digest"] for p in d.get("platforms", {}).values()}
    ]
    if current:
        doc = current[-1]
        return f"{doc['registry']}/{doc['repository']}@{doc['manifest_digest']}"
    if records:
        raise ImageNotPublished(
            f"{name}: the published images ({len(records)} in {shown_home(folder)}) were built from "
            f"other inputs than the recipe's current ones (input digest {input_digest[:19]})",
            hint=f"`kiln publish {name}` the current inputs, or pass --image REPO@sha256:...",
        )
    raise ImageNotPublished(f"{name} was never published (no publish record in {shown_home(folder)})")


def publish_document(result: PublishResult) -> PublishDocument:
    """The `kiln publish --json` document of a publish."""
    return PublishDocument(
        recipe=result.recipe,
        image_id=result.image_id,
        input_digest=result.input_digest,
        manifest_digest=result.manifest_digest,
        registry=result.registry,
        repository=result.repository,
        channel=result.channel,
        tags=result.tags,
        pushed=result.pushed,
        smoke=result.smoke,
        record=result.record,
        signature=result.signature,
        platforms=result.platforms,
        pinned=result.pinned,
    )


def promote_document(result: PromoteResult) -> PromoteDocument:
    """The `kiln promote --json` document of a promote."""
    return PromoteDocument(
        recipe=result.recipe,
        image_id=result.image_id,
        manifest_digest=result.manifest_digest,
        registry=result.registry,
        repository=result.repository,
        from_channel=result.from_channel,
        to_channel=result.to_channel,
        moved=result.moved,
        smoke=result.smoke,
        record=result.record,
        signature=result.signature,
        pinned=result.pinned,
    )


def write_record(kind: str, name: str, doc: Mapping[str, object]) -> Path:
    """publish/<recipe>-<kind>-<time>.json in the records folder. Holds digests, tags and the smoke
    evidence; never credentials (not even the user name)."""
    d = results_dir() / "publish"
    d.mkdir(parents=True, exist_ok=True)
    stamp = clock.file_stamp()
    path = d / f"{name}-{kind}-{stamp}.json"
    write_atomic(path, json.dumps({"kind": kind, **doc}, indent=2, sort_keys=True) + "\n")
    return path
