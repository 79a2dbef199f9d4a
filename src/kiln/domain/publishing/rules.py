"""The rules of publishing, apart from the pushing.

Which registry and repository, which channels a recipe has, the tags a publish writes
and their order, the smoke evidence an image needs first (per platform for an index),
the input digest of a multi-platform set, and the image a publish record pins (what
`kiln render k8s` deploys). `kiln publish` / `kiln promote`
(commands/publishing/publish.py) do the pushing.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Literal, NotRequired

from pydantic import with_config
from typing_extensions import TypedDict

from kiln.basics import image_ref, log
from kiln.basics.documents import Shape, read_document
from kiln.basics.errors import (
    ChannelEmpty,
    ChannelInvalid,
    ImageNotBuilt,
    ImageNotPublished,
    KilnError,
    NotSmokeTested,
    PushFailed,
    RecordInvalid,
    RegistryAuthFailed,
    RegistryInvalid,
)
from kiln.basics.json_types import CLOSED, DESCRIBED, Sha256, Strings1
from kiln.basics.paths import results_dir, shown_home
from kiln.domain.images.definitions import BuiltRecipe, require_built
from kiln.domain.images.image_naming import LABEL_NS
from kiln.domain.recipes.recipe import LoadedRecipe
from kiln.infra.docker import DockerDaemon, id_of
from kiln.infra.manifests import Manifest, index_children
from kiln.infra.records import SmokeLevel, SmokeRecord, passing_smoke_record, record_path
from kiln.infra.registry import RegistryClient, Target

SMOKE_LABEL = f"{LABEL_NS}.smoke-check"
UNSMOKED_SUFFIX = "-unsmoked"
_DEFAULT_CHANNELS = ("experimental", "stable")


# -- the documents a publish or promote writes (its record and its --json) ----------------
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
        return f"{self.registry}/{self.repository}@{self.manifest_digest}"


@dataclass
class PromoteResult:
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


def publish_document(r: PublishResult) -> PublishDocument:
    return PublishDocument(
        recipe=r.recipe,
        image_id=r.image_id,
        input_digest=r.input_digest,
        manifest_digest=r.manifest_digest,
        registry=r.registry,
        repository=r.repository,
        channel=r.channel,
        tags=r.tags,
        pushed=r.pushed,
        smoke=r.smoke,
        record=r.record,
        signature=r.signature,
        platforms=r.platforms,
        pinned=r.pinned,
    )


def promote_document(r: PromoteResult) -> PromoteDocument:
    return PromoteDocument(
        recipe=r.recipe,
        image_id=r.image_id,
        manifest_digest=r.manifest_digest,
        registry=r.registry,
        repository=r.repository,
        from_channel=r.from_channel,
        to_channel=r.to_channel,
        moved=r.moved,
        smoke=r.smoke,
        record=r.record,
        signature=r.signature,
        pinned=r.pinned,
    )


def consumer_tags(loaded: LoadedRecipe, short: str, channel: str) -> list[str]:
    """The tags consumers follow or pin, in write order: engine, channel, then the input
    digest tag last (its presence means the publish completed)."""
    return [_engine_tag(loaded), channel, short]


def unsmoked_tag(short: str) -> str:
    """The one tag an image without a passing smoke record is pushed under."""
    return f"{short}{UNSMOKED_SUFFIX}"


def target_for(loaded: LoadedRecipe, registry: str | None, *, plain_http: bool = False) -> Target:
    """--registry wins over publish.registry; the repository comes from publish.repository."""
    pub = loaded.recipe.publish
    chosen = registry or (pub.registry if pub else None)
    if not chosen:
        raise RegistryInvalid(f"{loaded.name}: no registry (no --registry and no publish.registry)")
    repository = pub.repository if pub else f"kiln/{loaded.name}"
    return Target.parse(chosen, repository, plain_http=plain_http)


def _channels_of(loaded: LoadedRecipe) -> list[str]:
    pub = loaded.recipe.publish
    return list(pub.channels) if pub else list(_DEFAULT_CHANNELS)


def check_channel(loaded: LoadedRecipe, channel: str | None) -> str:
    allowed = _channels_of(loaded)
    if channel is None:
        return "experimental" if "experimental" in allowed else allowed[0]
    if channel not in allowed:
        raise ChannelInvalid(f"{loaded.name}: channel {channel!r} is not one of {', '.join(allowed)}")
    return channel


def _engine_tag(loaded: LoadedRecipe) -> str:
    e = loaded.recipe.engine
    # a version like 0.32.0+cpu is not a valid tag character set
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{e.name}-{e.version}-{loaded.name}")


def smoke_evidence(tag: str, image_id: str, skip: bool) -> SmokeEvidence:
    """What a publish records of the image's smoke test: its status ("passed" or
    "skipped") and, when passed, the record's file."""
    rec = passing_smoke_record(image_id)
    if rec is not None:
        if skip:
            log.warn("--skip-smoke-check ignored: this image has a passing smoke record")
        level = smoke_level(rec)
        if level != "served":
            log.warn(f"{tag}: its smoke record is of level {level} (proved inside the image, not served)")
        return SmokeEvidence(status="passed", record=str(record_path(image_id)), level=level)
    if not skip:
        raise NotSmokeTested(
            f"{tag} (image {image_id[:19]}) has no passing smoke record in "
            f"{shown_home(record_path(image_id).parent)}; refusing to publish"
        )
    log.warn(
        f"publishing WITHOUT a smoke test (--skip-smoke-check): only the tag "
        f"{image_ref.parse(tag).tag}{UNSMOKED_SUFFIX} is written, and the image gets label {SMOKE_LABEL}=skipped"
    )
    return SmokeEvidence(status="skipped")


def index_input_digest(members: list[tuple[str, BuiltRecipe]]) -> str:
    """The input digest of a multi-platform publish: over each platform and its image's
    input digest, so the digest tag names exactly the set of builds the index holds."""
    text = "".join(f"{plat} {built.recipe_image.digest}\n" for plat, built in sorted(members, key=lambda m: m[0]))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def platform_tag(built: BuiltRecipe) -> str:
    """The per-platform tag the daemon pushes each image under (`<digest12>-arm64`):
    pins one architecture; the index's tags are the ones consumers follow."""
    return f"{built.recipe_image.short}-{built.recipe_image.platform.split('/', 1)[1]}"


def built_platforms(docker: DockerDaemon, name: str, declared: list[str]) -> list[tuple[str, BuiltRecipe]]:
    """(platform, built image) for each declared platform built from the current inputs;
    ImageNotBuilt when none is, a warning for each one that is not."""
    members: list[tuple[str, BuiltRecipe]] = []
    missing: list[str] = []
    for plat in declared:
        try:
            members.append((plat, require_built(docker, name, plat)))
        except ImageNotBuilt:
            missing.append(plat)
    if not members:
        raise ImageNotBuilt(
            f"{name}: none of its platforms ({', '.join(declared)}) is built from the current inputs",
            hint=f"`kiln build {name} --platform all`",
        )
    for plat in missing:
        log.warn(
            f"{name}: {plat} is not built from the current inputs; the index holds "
            f"{', '.join(p for p, _ in members)} only (`kiln build {name} --platform {plat}`)"
        )
    return members


def platform_smoke(name: str, members: list[tuple[str, BuiltRecipe]]) -> dict[str, str]:
    """Every platform entering the index has a passing smoke record of its own image."""
    failing = [(plat, built) for plat, built in members if passing_smoke_record(id_of(built.image)) is None]
    if failing:
        where = shown_home(record_path(id_of(failing[0][1].image)).parent)
        raise NotSmokeTested(
            "; ".join(f"{plat}: {built.recipe_image.tag} (image {id_of(built.image)[:19]})" for plat, built in failing)
            + f" has no passing smoke record in {where}; a platform that has not passed its smoke test cannot "
            "enter the index, nothing was pushed",
            hint=f"`kiln smoke {name} --platform {failing[0][0]}` (or publish without it: "
            f"drop it from engine.platforms)",
        )
    return {plat: str(record_path(id_of(built.image))) for plat, built in members}


def smoke_level(rec: SmokeRecord) -> SmokeLevel:
    """A passing record's level: "served" (records older than the field are) or "in-image"."""
    return rec.get("level", "served")


def platform_smoke_levels(members: list[tuple[str, BuiltRecipe]]) -> dict[str, SmokeLevel]:
    """Each platform's smoke level, said in a warning where it is not "served" (after
    `platform_smoke`: a record gone since is refused, as it would have been there)."""
    levels: dict[str, SmokeLevel] = {}
    for plat, built in members:
        rec = passing_smoke_record(id_of(built.image))
        if rec is None:
            raise NotSmokeTested(
                f"{plat}: {built.recipe_image.tag}: its passing smoke record went away while "
                "publishing; nothing was pushed",
                hint=f"`kiln smoke {built.recipe_image.loaded.name} --platform {plat}`",
            )
        levels[plat] = smoke_level(rec)
        if levels[plat] != "served":
            log.warn(
                f"{plat}: {built.recipe_image.tag}: smoke record of level {levels[plat]} "
                "(proved inside the image, not served)"
            )
    return levels


def refuse_unsmoked_channel(name: str, short: str, explicit_channel: str | None) -> None:
    """An image without a passing smoke record never moves a channel: --channel with
    --skip-smoke-check is refused before anything is pushed."""
    if explicit_channel is not None:
        raise ChannelInvalid(
            f"--channel {explicit_channel}: an image without a passing smoke record never moves a channel",
            hint=f"run `kiln smoke {name}` and publish again, or drop --channel "
            f"to push it as {short}{UNSMOKED_SUFFIX} only",
        )


def push_error(message: str) -> KilnError:
    """The daemon's push error as the kiln error a user can act on."""
    text = f"{message}; no channel or digest tag was written"
    lowered = message.lower()
    if any(word in lowered for word in ("unauthorized", "denied", "authentication required")):
        return RegistryAuthFailed(
            text, hint="the account may read but not push this repository, or the daemon was handed other credentials"
        )
    if "http response to https client" in lowered:
        return PushFailed(
            text,
            hint="the Docker daemon must list this registry in insecure-registries "
            "(/etc/docker/daemon.json) to push over plain HTTP",
        )
    return PushFailed(text)


def promotable_image_id(name: str, client: RegistryClient, ref: str, channel: str, manifest: Manifest) -> str:
    """The image id a channel move vouches for: a single image needs a passing smoke record
    here; an index moves only when each platform's image in it has one (returns the first
    platform's image id)."""
    image_id = _index_smoked(name, client, ref, manifest) if manifest.is_index else manifest.config_digest or ""
    if not image_id or passing_smoke_record(image_id) is None:
        raise NotSmokeTested(
            f"{ref} is image {image_id[:19] or '(an index)'}, "
            f"which has no passing smoke record in {shown_home(results_dir() / 'smoke')}; "
            "refusing to promote",
            hint=f"`kiln smoke {name}`, then `kiln publish {name} --channel {channel}`, "
            "then promote (or run promote where the smoke records are, or point "
            "$KILN_STATE_DIR at them)",
        )
    return image_id


def _index_smoked(name: str, client: RegistryClient, ref: str, index: Manifest) -> str:
    ids: list[str] = []
    for plat, digest in index_children(index):
        child = client.manifest(digest)
        image_id = child.config_digest if child is not None else None
        if not image_id or passing_smoke_record(image_id) is None:
            raise NotSmokeTested(
                f"{ref} is an index whose {plat} image {(image_id or digest)[:19]} has no passing "
                f"smoke record in {shown_home(results_dir() / 'smoke')}; refusing to promote",
                hint=f"`kiln smoke {name} --platform {plat}` where the records are (or point "
                "$KILN_STATE_DIR at them), then promote",
            )
        ids.append(image_id)
    if not ids:
        raise ChannelEmpty(f"{ref} is an empty index; nothing to promote")
    return ids[0]
