"""The smoke test an image needs before it is published or promoted: the evidence a
publish records (per platform for an index), the refusals when there is none, and the
one way out, --skip-smoke-check (an image labelled as never smoke-tested, pushed under
its own tag only, which never moves a channel)."""

from __future__ import annotations

from kiln.basics import image_ref, log
from kiln.basics.errors import ChannelEmpty, ChannelInvalid, NotSmokeTested
from kiln.basics.paths import results_dir, shown_home
from kiln.domain.images.build_context import BuildContext
from kiln.domain.images.definitions import BuiltRecipe
from kiln.domain.images.image_naming import LABEL_NS
from kiln.domain.publishing.publish_records import SmokeEvidence
from kiln.domain.recipes.recipe import LoadedRecipe
from kiln.infra.docker import DockerDaemon, id_of
from kiln.infra.manifests import Manifest, index_children
from kiln.infra.records import SmokeLevel, SmokeRecord, passing_smoke_record, record_path
from kiln.infra.registry import RegistryClient

SMOKE_LABEL = f"{LABEL_NS}.smoke-check"
UNSMOKED_SUFFIX = "-unsmoked"


def unsmoked_tag(short: str) -> str:
    """The one tag an image without a passing smoke record is pushed under."""
    return f"{short}{UNSMOKED_SUFFIX}"


def unsmoked_image(docker: DockerDaemon, loaded: LoadedRecipe, short: str, image_id: str) -> str:
    """The built image plus `ai.kiln.smoke-check=skipped`, so whoever pulls it can see it
    was never smoke-tested. A label (not a manifest annotation) because `docker inspect`
    shows it after any pull. Its own image id means the built image's future smoke
    record can never vouch for it."""
    ctx = BuildContext()
    ctx.add_bytes("Dockerfile", f"FROM {image_id}\n".encode())
    result = docker.build(ctx, label=f"{loaded.name} (smoke-check label)", labels={SMOKE_LABEL: "skipped"}, quiet=True)
    # the local tag mirrors the registry's: it keeps the derived image (and its layer
    # cache) between runs, so a rerun derives the same id and "already published" holds
    docker.tag(result.image_id, f"kiln/{loaded.name}:{short}{UNSMOKED_SUFFIX}")
    return result.image_id


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
