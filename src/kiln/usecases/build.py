"""`kiln build`: engine image (if needed), then the recipe image, each skipped when an
image with the same input digest already exists.

A build runs untagged; the size budget, the engine checks and (for engine images) the
probe's labels come next, and only an image that passed them all is tagged, so a
failed check never leaves a tag that a later build would trust (domain/images/image_build.py);
what must hold before anything builds is domain/images/build_plan.py's."""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from typing import NotRequired

from pydantic import with_config
from typing_extensions import TypedDict

from kiln.basics import log
from kiln.basics.json_types import DESCRIBED, Count, Seconds, Sha256
from kiln.basics.paths import local_ref
from kiln.commands.images.base_image import builder_base
from kiln.commands.options import Subparsers, reports
from kiln.domain.imagecheck import declared_engine, engine_stamp
from kiln.domain.images import build_plan
from kiln.domain.images.definitions import EngineImage, RecipeImages, existing, resolve
from kiln.domain.images.image_build import BuildOutcome, ImageBuild, reuse, run_build
from kiln.domain.locks import engine_lock, recipe_lock
from kiln.domain.patching import series
from kiln.domain.recipes.resolved import ResolvedRecipe, resolve_recipe
from kiln.domain.reproducible import normalise_image
from kiln.infra import credentials
from kiln.infra.docker import DockerDaemon


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


def _document(outcome: BuildOutcome, recipe: str) -> BuildDocument:
    """`kiln build --json` (schema: schemas/build.json)."""
    return BuildDocument(
        recipe=recipe,
        tag=outcome.tag,
        image_id=outcome.image_id,
        input_digest=outcome.digest,
        size_bytes=outcome.size,
        seconds=round(outcome.seconds, 2),
        skipped=outcome.skipped,
        steps=outcome.steps,
        cached_steps=outcome.cached_steps,
    )


def build_engine(
    docker: DockerDaemon,
    engine_image: EngineImage,
    *,
    force: bool = False,
    nocache: bool = False,
    recipe: str = "RECIPE",
) -> BuildOutcome:
    tags = [engine_image.tag, engine_image.alias_tag]
    found = None if force else existing(docker, engine_image.tag, engine_image.digest)
    reused = reuse(docker, found, engine_image.digest, tags, engine_image.source_date)
    if reused is not None:
        return stamp(docker, tags, reused, engine_image.source_date.epoch)
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


def stamp(docker: DockerDaemon, tags: list[str], outcome: BuildOutcome, epoch: int = 0) -> BuildOutcome:
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
                log.warn(f"could not remove tag {tag}: {exc}")
        raise
    for tag in tags:
        docker.tag(image_id, tag)
    return replace(outcome, image_id=image_id)


def _engine_image_id(docker: DockerDaemon, recipe: ResolvedRecipe, *, build_if_missing: bool) -> str | None:
    """The id of the engine image built from the recipe's current engine inputs (built
    now when missing and `build_if_missing`), None when there is none."""
    engine_image = resolve(recipe).engine_image
    img = existing(docker, engine_image.tag, engine_image.digest)
    if img is not None:
        return img.id
    if not build_if_missing:
        return None
    return build_engine(docker, engine_image, recipe=recipe.name).image_id


def build_recipe(
    name: str | ResolvedRecipe,
    *,
    docker: DockerDaemon | None = None,
    force: bool = False,
    force_engine: bool = False,
    ca_flag: str | None = None,
    quiet_summary: bool = False,
    nocache: bool = False,
    platform: str | None = None,
) -> BuildOutcome:
    """`name`: the recipe (resolved, or its name); `platform`: one of engine.platforms (None: the host's)."""
    docker = docker or DockerDaemon()
    t0 = time.monotonic()
    recipe = resolve_recipe(name) if isinstance(name, str) else name
    images = build_plan.images_for(recipe, ca_flag, platform)
    engine_image, recipe_image = images.engine_image, images.recipe_image
    found = None if force else existing(docker, recipe_image.tag, recipe_image.digest)
    reused = reuse(
        docker, found, recipe_image.digest, [recipe_image.tag, recipe_image.latest_tag], recipe_image.source_date
    )
    if reused is not None:
        if not quiet_summary:
            log.ok(
                f"{recipe_image.tag} is up to date (input digest {recipe_image.digest[:19]}); "
                f"nothing to build [{log.human_secs(time.monotonic() - t0)}]"
            )
        return reused
    series.preflight(recipe)
    engine_outcome = build_engine(
        docker, engine_image, force=force_engine, nocache=nocache and force_engine, recipe=recipe.name
    )
    if engine_outcome.skipped:
        log.ok(f"engine {engine_image.tag} up to date")
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


def _platforms_of(recipe: ResolvedRecipe, flag: str | None) -> list[str | None]:
    """--platform: None (the host's), one platform, or `all` (every declared one)."""
    return [None] if flag is None else list[str | None](recipe.engine.platforms) if flag == "all" else [flag]


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


def _summary(title: str, o: BuildOutcome, seconds: float, extra: dict[str, object] | None = None) -> None:
    rows: dict[str, object] = {
        "tag": o.tag,
        "image id": o.image_id,
        "input digest": o.digest,
        "size": log.human_size(o.size),
        "took": log.human_secs(seconds),
        "cache": f"{o.cached_steps}/{o.steps} steps cached",
    }
    rows.update(extra or {})
    log.summary(title, rows)


def cmd_build(args: argparse.Namespace) -> int:
    docs: list[tuple[str | None, BuildDocument]] = []
    docker = DockerDaemon()
    recipe = resolve_recipe(args.name)  # once: every step below takes this value
    platforms = _platforms_of(recipe, args.platform)
    force = args.force or args.no_cache
    if not args.skip_disk_check:  # every platform's engine build counted before the first starts
        build_plan.check_build_space(
            docker, recipe, platforms, force=force, force_engine=args.force_engine, ca_flag=args.ca_bundle
        )
    for platform in platforms:
        outcome = build_recipe(
            recipe,
            docker=docker,
            force=force,
            force_engine=args.force_engine,
            ca_flag=args.ca_bundle,
            nocache=args.no_cache,
            platform=platform,
        )
        docs.append((platform, _document(outcome, args.name)))
    if args.json:  # one platform: the document as ever; `--platform all`: it per platform
        first = docs[0][1]  # several only with `--platform all`, each one named
        log.emit_json(first if len(docs) == 1 else BuildDocument(**first, platforms={str(p): d for p, d in docs}))
    return 0


def register(sub: Subparsers) -> None:
    s = reports(sub.add_parser("build", help="build a recipe's image (engine image first if needed)"))
    s.add_argument("name")
    s.add_argument("--force", action="store_true", help="rebuild even if an image with this input digest exists")
    s.add_argument("--force-engine", action="store_true", help="rebuild the engine image too")
    s.add_argument(
        "--no-cache",
        action="store_true",
        help="ignore the daemon's layer cache (with --force-engine: for the engine too)",
    )
    s.add_argument("--ca-bundle", help="PEM bundle builds trust (default: $KILN_CA_BUNDLE, else pip's cert)")
    s.add_argument(
        "--platform",
        choices=[*sorted(engine_lock.PLATFORMS), "all"],
        default=None,
        help="build for this platform of engine.platforms, or all of them (default: the host's; "
        "another architecture runs under qemu: scripts/setup.sh --arm64)",
    )
    s.add_argument(
        "--skip-disk-check",
        action="store_true",
        help="build even if the engine builds ahead look too big for the daemon's free disk "
        "(the check cannot see builder stages already in the layer cache)",
    )
    s.set_defaults(func=cmd_build)
