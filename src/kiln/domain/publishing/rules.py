"""The rules of publishing, apart from the pushing and the smoke test.

Which registry and repository, which channels a recipe has, the tags a publish writes
and their order, the built images of a multi-platform set and its input digest.
`kiln publish` / `kiln promote` (usecases/publish.py) do the pushing
(domain/publishing/registry_push.py); the smoke evidence is domain/publishing/smoke_gate.py's,
the records and --json documents domain/publishing/publish_records.py's.
"""

from __future__ import annotations

import hashlib
import re

from kiln.basics import log
from kiln.basics.errors import ChannelInvalid, ImageNotBuilt, RegistryInvalid
from kiln.domain.images.definitions import BuiltRecipe, require_built
from kiln.domain.recipes.recipe import LoadedRecipe
from kiln.domain.recipes.resolved import ResolvedRecipe
from kiln.infra.docker import DockerDaemon
from kiln.infra.registry import Target

_DEFAULT_CHANNELS = ("experimental", "stable")


def consumer_tags(loaded: LoadedRecipe, short: str, channel: str) -> list[str]:
    """The tags consumers follow or pin, in write order: engine, channel, then the input
    digest tag last (its presence means the publish completed)."""
    return [_engine_tag(loaded), channel, short]


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
    """The channel to publish to: the one named if the recipe allows it, else its default (experimental when
    allowed)."""
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


def index_input_digest(members: list[tuple[str, BuiltRecipe]]) -> str:
    """The input digest of a multi-platform publish: over each platform and its image's
    input digest, so the digest tag names exactly the set of builds the index holds."""
    text = "".join(f"{plat} {built.recipe_image.digest}\n" for plat, built in sorted(members, key=lambda m: m[0]))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def platform_tag(built: BuiltRecipe) -> str:
    """The per-platform tag the daemon pushes each image under (`<digest12>-arm64`):
    pins one architecture; the index's tags are the ones consumers follow."""
    return f"{built.recipe_image.short}-{built.recipe_image.platform.split('/', 1)[1]}"


def built_platforms(
    docker: DockerDaemon, resolved: ResolvedRecipe, declared: list[str]
) -> list[tuple[str, BuiltRecipe]]:
    """(platform, built image) for each declared platform built from the current inputs;
    ImageNotBuilt when none is, a warning for each one that is not."""
    name = resolved.name
    members: list[tuple[str, BuiltRecipe]] = []
    missing: list[str] = []
    for plat in declared:
        try:
            members.append((plat, require_built(docker, resolved, plat)))
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
