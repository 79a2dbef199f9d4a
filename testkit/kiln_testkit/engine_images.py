"""The engine image of a recipe, for tests that run its parser or probes."""

from __future__ import annotations

from kiln.domain.images.definitions import local_image_for, resolve
from kiln.domain.recipes.resolved import ResolvedRecipe
from kiln.infra.docker import DockerDaemon
from kiln.usecases.build import build_engine


def engine_image_id(docker: DockerDaemon, recipe: ResolvedRecipe, *, build_if_missing: bool) -> str | None:
    """The id of the engine image built from the recipe's current engine inputs (built
    now when missing and `build_if_missing`), None when there is none."""
    engine_image = resolve(recipe).engine_image
    image = local_image_for(docker, engine_image.tag, engine_image.digest)
    if image is not None:
        return image.id
    if not build_if_missing:
        return None
    return build_engine(docker, engine_image, recipe=recipe.name).image_id
