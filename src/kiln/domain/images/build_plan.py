"""What a build of a resolved recipe needs, checked before anything builds: the platform
is declared and runs here, the images the recipe's inputs make for it, the engine
builds ahead fit on the daemon's disk (the patch series' own pre-flight is
`domain/patching/series.py` `preflight`)."""

from __future__ import annotations

import os
import shutil

from kiln.basics import log
from kiln.basics.errors import PlatformNotDeclared, PlatformUnsupported
from kiln.domain.images import disk_space
from kiln.domain.images.definitions import RecipeImages, images_on, local_image_for
from kiln.domain.images.engine_image import for_engine
from kiln.domain.locks import engine_lock
from kiln.domain.recipes.recipe import LoadedRecipe
from kiln.domain.recipes.resolved import ResolvedRecipe
from kiln.infra import binfmt
from kiln.infra.docker import DockerDaemon


def images_for(recipe: ResolvedRecipe, ca_flag: str | None = None, platform: str | None = None) -> RecipeImages:
    """The engine image and recipe image the recipe's inputs make for `platform` (None:
    the host's; another one is checked first, as `check_platform` does)."""
    if platform is not None:
        check_platform(recipe.loaded, platform)
    engine_image = for_engine(recipe.engine, ca_flag, platform)  # the engine first: the recipe image is FROM it
    return images_on(recipe, engine_image)


def check_platform(loaded: LoadedRecipe, platform: str) -> None:
    """`--platform P`: P is declared in engine.platforms, and runs here (natively, or
    under qemu for another architecture's RUN steps and in-image checks)."""
    engine = loaded.recipe.engine
    if platform not in engine.platforms:
        raise PlatformNotDeclared(
            f"{loaded.where('engine')}: engine.platforms: {loaded.name} is declared for "
            f"{', '.join(engine.platforms)}, not {platform}"
        )
    lock = engine_lock.for_image(engine_lock.engine_image_dir(engine.flavour), engine.name, engine.version, loaded.name)
    gaps = engine_lock.platform_gaps(lock, platform, engine.torch) if lock is not None else []
    if gaps:
        i = list[str](engine.platforms).index(platform)
        raise PlatformUnsupported(
            [
                (
                    f"{loaded.where('engine', 'platforms', i)}: engine.platforms[{i}]: {platform}: "
                    f"the engine lock has no {platform} {', '.join(gaps)}"
                )
            ]
        )
    binfmt.require(platform, min_major=binfmt.QEMU_MIN_MAJOR)


def check_build_space(
    docker: DockerDaemon,
    recipe: ResolvedRecipe,
    platforms: list[str | None],
    *,
    force: bool = False,
    force_engine: bool = False,
    ca_flag: str | None = None,
) -> None:
    """Before anything builds: the engine builds ahead (one per platform whose recipe and
    engine images are missing, or forced) fit on the daemon's disk, or DiskSpaceShort
    says so in one line (domain/images/disk_space.py has the figures)."""

    def engine_build_for(platform: str | None) -> disk_space.EngineBuild | None:
        images = images_for(recipe, ca_flag, platform)
        recipe_image, engine_image = images.recipe_image, images.engine_image
        if not force and local_image_for(docker, recipe_image.tag, recipe_image.digest) is not None:
            return None  # build_recipe reuses it, and builds no engine
        if not force_engine and local_image_for(docker, engine_image.tag, engine_image.digest) is not None:
            return None
        return disk_space.EngineBuild(engine_image.engine.flavour, engine_image.platform)

    builds = [b for p in platforms if (b := engine_build_for(p))]
    if not builds:
        return
    root = _local_root(docker)
    if root is not None:
        disk_space.require_space(recipe.name, builds, shutil.disk_usage(root).free, root)


def _local_root(docker: DockerDaemon) -> str | None:
    """The daemon's data root when it is a path on this host; None (said once) when kiln
    cannot see the daemon's disk: a daemon on another host, or a root outside this
    filesystem view (kiln itself in a container)."""
    host = os.environ.get("DOCKER_HOST", "")
    if host and not host.startswith("unix://"):
        log.info(f"disk: not checked before building: the daemon at {host} keeps its data on another host")
        return None
    root = docker.root_dir()
    if not root or not os.path.isdir(root):
        log.info(f"disk: not checked before building: the daemon's data root {root or '(none named)'} is not here")
        return None
    return root
