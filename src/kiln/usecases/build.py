"""Building a recipe's image: the engine image (if needed), then the recipe image, each
skipped when an image with the same input digest already exists (`kiln build`).

A build runs untagged; the size budget, the engine checks and (for engine images) the
probe's labels come next, and only an image that passed them all is tagged, so a
failed check never leaves a tag that a later build would trust (domain/images/image_build.py);
what must hold before anything builds is domain/images/build_plan.py's."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import NotRequired

from pydantic import with_config
from typing_extensions import TypedDict

from kiln.basics.json_types import DESCRIBED, Count, Seconds, Sha256
from kiln.basics.log import human_secs, human_size
from kiln.basics.paths import local_ref
from kiln.domain.imagecheck import declared_engine, engine_stamp
from kiln.domain.images import build_plan
from kiln.domain.images.definitions import EngineImage, RecipeImages, local_image_for
from kiln.domain.images.image_build import BuildOutcome, ImageBuild, retag_built, run_build
from kiln.domain.locks import recipe_lock
from kiln.domain.patching import series
from kiln.domain.recipes.resolved import ResolvedRecipe
from kiln.domain.reproducible import normalise_image
from kiln.infra import credentials
from kiln.infra.docker import DockerDaemon
from kiln.usecases import progress
from kiln.usecases.base_image import builder_base


@with_config(DESCRIBED)
class BuildDocument(TypedDict):
    """`kiln build --json` (src/kiln/schemas/build.json): the image built, or found already built."""

    recipe: str
    tag: str
    image_id: Sha256
    input_digest: Sha256
    size_bytes: Count
    seconds: Seconds
    skipped: bool
    """An image with this input digest existed: nothing was built."""
    steps: Count
    cached_steps: Count
    platforms: NotRequired[dict[str, BuildDocument]]
    """`--platform all` with several platforms: the document of each platform's build (the top
    level repeats the first)."""


def build_engine(
    docker: DockerDaemon,
    engine_image: EngineImage,
    *,
    force: bool = False,
    nocache: bool = False,
    recipe: str = "RECIPE",
) -> BuildOutcome:
    """The engine image built from `engine_image`'s inputs (pulling its base first), or the
    one already built from them, labelled with the versions probed in it; `recipe` names
    the recipe in the relock hint of a stale lock."""
    tags = [engine_image.tag, engine_image.alias_tag]
    found = None if force else local_image_for(docker, engine_image.tag, engine_image.digest)
    reused = retag_built(docker, found, engine_image.digest, tags, engine_image.source_date)
    if reused is not None:
        return _label_unprobed(docker, tags, reused, engine_image.source_date.epoch)
    base = engine_image.engine.base_image
    # a registry base is pulled by digest; the air-gapped kiln/base is never pulled
    docker.ensure_base(
        local_ref(engine_image.base_ref), pull=not base.ref.startswith("kiln/"), auth=credentials.pull_auth
    )
    check = None
    if engine_image.cross_placed:
        docker.ensure_base(local_ref(engine_image.host_base), pull=False)
        builder_base(
            docker, local_ref(engine_image.host_base), engine_image.platform, local_ref(engine_image.builder_image)
        )
        modules = engine_image.modules
        check = lambda image: engine_stamp.import_check(docker, image.id, modules)  # noqa: E731
    engine_image.add_wheels()
    job = ImageBuild(
        label=f"engine-{engine_image.engine.flavour}",
        context=engine_image.context,
        digest=engine_image.digest,
        tags=tags,
        labels=engine_image.labels(),
        buildargs=engine_image.buildargs(),
        check=check,
        # torch/CUDA/NCCL labels read from the built image before anything is tagged
        finalize=lambda image: engine_stamp.labelled(docker, image),
        source_date=engine_image.source_date,
        lock_file=engine_image.lock_file if engine_image.lock is not None else None,
        relock=f"kiln engine lock {recipe}",
        platform=engine_image.platform,
        parent=local_ref(engine_image.base_ref),
    )
    return run_build(docker, job, engine_image.ca.get(), nocache=nocache)


def _label_unprobed(docker: DockerDaemon, tags: list[str], outcome: BuildOutcome, epoch: int = 0) -> BuildOutcome:
    """Heal an engine image built before probing existed (a reused image without the
    labels): tag a labelled derivative in its place. If the probe fails, the engine's
    tags are removed, so a failed check never leaves a tag that a later build would trust.
    Fresh builds are labelled before they are tagged (`ImageBuild.finalize`)."""
    image = docker.require_image(outcome.image_id)
    if engine_stamp.is_stamped(image):
        return outcome
    try:
        image_id = engine_stamp.labelled(docker, image)
        image_id = normalise_image.make_reproducible(docker, image_id, epoch, label="engine").image_id
    except BaseException:
        for tag in tags:
            try:
                docker.remove_image(tag)
            except Exception as exc:  # keep the probe's own error as the one reported  # noqa: BLE001
                progress.warn(f"could not remove tag {tag}: {exc}")
        raise
    for tag in tags:
        docker.tag(image_id, tag)
    return replace(outcome, image_id=image_id)


def build_recipe(
    recipe: ResolvedRecipe,
    *,
    docker: DockerDaemon | None = None,
    force: bool = False,
    force_engine: bool = False,
    ca_flag: str | None = None,
    quiet_summary: bool = False,
    nocache: bool = False,
    platform: str | None = None,
) -> BuildOutcome:
    """The recipe's image for `platform` (one of engine.platforms; None: the host's), built
    after its engine image, or the one already built from the same inputs.
    `quiet_summary`: no closing summary record (a caller that reports the outcome itself)."""
    docker = docker or DockerDaemon()
    t0 = time.monotonic()
    images = build_plan.images_for(recipe, ca_flag, platform)
    engine_image, recipe_image = images.engine_image, images.recipe_image
    found = None if force else local_image_for(docker, recipe_image.tag, recipe_image.digest)
    reused = retag_built(
        docker, found, recipe_image.digest, [recipe_image.tag, recipe_image.latest_tag], recipe_image.source_date
    )
    if reused is not None:
        if not quiet_summary:
            progress.ok(
                f"{recipe_image.tag} is up to date (input digest {recipe_image.digest[:19]}); "
                f"nothing to build [{human_secs(time.monotonic() - t0)}]"
            )
        return reused
    series.preflight(recipe)
    engine_outcome = build_engine(
        docker, engine_image, force=force_engine, nocache=nocache and force_engine, recipe=recipe.name
    )
    if engine_outcome.skipped:
        progress.ok(f"engine {engine_image.tag} up to date")
    else:
        _summary("engine image built", engine_outcome, engine_outcome.seconds)
    declared_engine.preflight_launch_args(recipe, engine_outcome.image_id, docker)
    outcome = run_build(docker, _recipe_build(docker, images), engine_image.ca.get(), nocache=nocache)
    if not quiet_summary:
        _summary(
            f"built {recipe_image.repository}",
            outcome,
            time.monotonic() - t0,
            extra={"also tagged": recipe_image.latest_tag, "engine": engine_image.tag},
        )
    return outcome


def _recipe_build(docker: DockerDaemon, images: RecipeImages) -> ImageBuild:
    loaded, recipe_image = images.loaded, images.recipe_image
    recipe_image.add_wheels()  # its own locked packages, if it names any (recipe_lock)
    return ImageBuild(
        label=loaded.name,
        context=recipe_image.context,
        digest=recipe_image.digest,
        tags=[recipe_image.tag, recipe_image.latest_tag],
        labels=recipe_image.labels(),
        buildargs=recipe_image.buildargs(),
        max_size_gb=loaded.recipe.budgets.max_image_size_gb,
        source_date=recipe_image.source_date,
        # the engine really is the declared one and accepts the launch args (declared_engine)
        check=lambda image: declared_engine.verify(recipe_image.resolved, image, docker),
        platform=recipe_image.platform,
        parent=recipe_image.buildargs()["KILN_ENGINE_IMAGE"],
        lock_file=recipe_image.lock_file if recipe_image.lock is not None else None,
        relock=recipe_lock.relock_command(loaded.name),
    )


def _summary(title: str, outcome: BuildOutcome, seconds: float, extra: dict[str, object] | None = None) -> None:
    rows: dict[str, object] = {
        "tag": outcome.tag,
        "image id": outcome.image_id,
        "input digest": outcome.digest,
        "size": human_size(outcome.size),
        "took": human_secs(seconds),
        "cache": f"{outcome.cached_steps}/{outcome.steps} steps cached",
    }
    rows.update(extra or {})
    progress.summary(title, rows)


# the use-case's surface: what a command, or a caller in Python, imports from here
__all__ = ["BuildDocument", "build_engine", "build_recipe"]
