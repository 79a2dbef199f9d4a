"""The rules of publishing, apart from the pushing: which registry and repository, which
channels a recipe has, the tags a publish writes and their order, the smoke evidence an
image needs first (per platform for an index), and the input digest of a multi-platform
set. `kiln publish` / `kiln promote` (commands/publishing/publish.py) do the pushing.
"""

from __future__ import annotations

import hashlib
import re

from kiln.basics import imageref, log
from kiln.basics.errors import ChannelInvalid, ImageNotBuilt, NotSmokeTested, RegistryInvalid
from kiln.basics.paths import shown_home
from kiln.domain.images.specs import LABEL_NS, BuiltRecipe, require_built
from kiln.domain.recipes.recipe import LoadedRecipe
from kiln.infra.docker import DockerDaemon, id_of
from kiln.infra.records import passing_smoke_record, record_path
from kiln.infra.registry import Target

SMOKE_LABEL = f"{LABEL_NS}.smoke-check"
UNSMOKED_SUFFIX = "-unsmoked"
DEFAULT_CHANNELS = ("experimental", "stable")




def consumer_tags(loaded: LoadedRecipe, short: str, channel: str) -> list[str]:
    """The tags consumers follow or pin, in write order: engine, channel, then the input
    digest tag last (its presence means the publish completed)."""
    return [engine_tag(loaded), channel, short]


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


def channels_of(loaded: LoadedRecipe) -> list[str]:
    pub = loaded.recipe.publish
    return list(pub.channels) if pub else list(DEFAULT_CHANNELS)


def check_channel(loaded: LoadedRecipe, channel: str | None) -> str:
    allowed = channels_of(loaded)
    if channel is None:
        return "experimental" if "experimental" in allowed else allowed[0]
    if channel not in allowed:
        raise ChannelInvalid(f"{loaded.name}: channel {channel!r} is not one of {', '.join(allowed)}")
    return channel


def engine_tag(loaded: LoadedRecipe) -> str:
    e = loaded.recipe.engine
    # a version like 0.32.0+cpu is not a valid tag character set
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{e.name}-{e.version}-{loaded.name}")


def smoke_evidence(tag: str, image_id: str, skip: bool) -> dict:
    rec = passing_smoke_record(image_id)
    if rec is not None:
        if skip:
            log.warn("--skip-smoke-check ignored: this image has a passing smoke record")
        return {"status": "passed", "record": str(record_path(image_id))}
    if not skip:
        raise NotSmokeTested(f"{tag} (image {image_id[:19]}) has no passing smoke record in "
                             f"{shown_home(record_path(image_id).parent)}; refusing to publish")
    log.warn(f"publishing WITHOUT a smoke test (--skip-smoke-check): only the tag "
             f"{imageref.parse(tag).tag}{UNSMOKED_SUFFIX} is written, and the image gets label {SMOKE_LABEL}=skipped")
    return {"status": "skipped"}


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
    members, missing = [], []
    for plat in declared:
        try:
            members.append((plat, require_built(docker, name, plat)))
        except ImageNotBuilt:
            missing.append(plat)
    if not members:
        raise ImageNotBuilt(f"{name}: none of its platforms ({', '.join(declared)}) is built from the current inputs",
                            hint=f"`kiln build {name} --platform all`")
    for plat in missing:
        log.warn(f"{name}: {plat} is not built from the current inputs; the index holds "
                 f"{', '.join(p for p, _ in members)} only (`kiln build {name} --platform {plat}`)")
    return members


def platform_smoke(name: str, members: list[tuple[str, BuiltRecipe]]) -> dict:
    """Every platform entering the index has a passing smoke record of its own image."""
    failing = [(plat, built) for plat, built in members if passing_smoke_record(id_of(built.image)) is None]
    if failing:
        where = shown_home(record_path(id_of(failing[0][1].image)).parent)
        raise NotSmokeTested(
            "; ".join(f"{plat}: {built.recipe_image.tag} (image {id_of(built.image)[:19]})" for plat, built in failing)
            + f" has no passing smoke record in {where}; a platform that has not passed its smoke test cannot "
            "enter the index, nothing was pushed",
            hint=f"`kiln smoke {name} --platform {failing[0][0]}` (or publish without it: drop it from engine.platforms)")
    return {plat: str(record_path(id_of(built.image))) for plat, built in members}
