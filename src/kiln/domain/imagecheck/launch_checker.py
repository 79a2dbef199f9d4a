"""Which engine code checks a recipe's launch command for `kiln check`, and its answer.

The engine image built from the recipe's current engine inputs when it exists; else,
for a CUDA engine, the parser environment of the same pin (parser_env: the same probe,
the same caches, the same refusals, without the GPU runtime), built once when missing;
else nothing, said in one line. `kiln check` never builds the engine image itself.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

from kiln.basics import log
from kiln.basics.errors import KilnError
from kiln.domain.imagecheck import launch_arg_check
from kiln.domain.imagecheck.parser_env import parser_env
from kiln.domain.images.definitions import local_image_for, resolve
from kiln.domain.recipes.recipe import recipe_names
from kiln.domain.recipes.resolved import ResolvedRecipe, resolve_recipe
from kiln.infra.docker import DockerDaemon, id_of


class LaunchCheck(NamedTuple):
    """The launch command's problems (one line each), and what checked it."""

    problems: list[str]
    checked_by: str | None  # "engine image TAG" or "parser environment TAG"; None: not checked


def check_launch(
    recipe: ResolvedRecipe, docker: DockerDaemon | None = None, *, platform: str | None = None
) -> LaunchCheck:
    """Launch problems against the engine image for `platform` (None: the host's), or
    the parser environment of its pin; nothing checked when neither can be had (no
    Docker daemon, no lock, offline with nothing cached): `kiln check` must work on any
    machine, and says what it could not check."""
    name = recipe.name
    try:
        job = launch_arg_check.Job.of(recipe)  # an override it cannot load is a recipe problem, reported as one
        docker = docker or DockerDaemon()
        engine_image = resolve(recipe, platform=platform).engine_image
        image = local_image_for(docker, engine_image.tag, engine_image.digest)
    except KilnError as exc:
        log.debug(f"launch args of {name} not checked: {exc.message}")
        return LaunchCheck([], None)
    mounts: dict[str, tuple[str, bool]] | None = None
    also = None
    if image is not None:
        image_id, checked_by = id_of(image), f"engine image {engine_image.tag}"
    else:
        env = parser_env(engine_image)
        if env is None:
            log.info(f"{name}: launch args not checked against vLLM (engine image not built)")
            return LaunchCheck([], None)
        try:
            ready = env.ensure(docker)
        except KilnError as exc:
            log.info(
                f"{name}: launch args not checked against vLLM (engine image not built, parser environment "
                f"not buildable: {exc.message.splitlines()[0]})"
            )
            return LaunchCheck([], None)
        image_id, checked_by, mounts = ready.image_id, f"parser environment {ready.tag}", ready.mounts
        also = partial(_same_pin_jobs, recipe)
    accepted, answer = launch_arg_check.ask(docker, image_id, job, mounts, also)
    log.info(f"{name}: launch args checked by the {checked_by} (vLLM {answer.version or '-'})")
    return LaunchCheck(launch_arg_check.launch_problems(recipe, accepted, job, answer), checked_by)


def _same_pin_jobs(recipe: ResolvedRecipe) -> list[launch_arg_check.Job]:
    """The command lines of the checkout's other recipes on the same engine pin and base,
    which a parser environment's container run answers along with `recipe`'s: it costs
    one import of vLLM either way, and every later check of them is then a cache hit. A
    recipe that does not load is left to its own check."""
    mine = recipe.recipe.engine
    jobs = []
    for name in recipe_names():
        if name == recipe.name:
            continue
        try:
            other = resolve_recipe(name)
            e = other.recipe.engine
            if (e.flavour, e.version, e.base_image) == (mine.flavour, mine.version, mine.base_image):
                jobs.append(launch_arg_check.Job.of(other))
        except KilnError as exc:
            log.debug(f"{name}: not asked along with {recipe.name}: {exc.message}")
    return jobs
