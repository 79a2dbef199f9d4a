"""`kiln build`: engine image (if needed), then the recipe image, each skipped when an
image with the same input digest already exists.

A build runs untagged; the size budget, the engine checks and (for engine images) the
probe's labels come next, and only an image that passed them all is tagged, so a
failed check never leaves a tag that a later build would trust."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import NotRequired

from pydantic import with_config
from typing_extensions import TypedDict

from kiln.basics import clock, log
from kiln.basics.errors import (
    BudgetExceeded,
    BuildFailed,
    EngineFetchFailed,
    KilnError,
    OverrideDrift,
    PatchFailed,
    PatchInvalid,
    PlatformNotDeclared,
    PlatformUnsupported,
)
from kiln.basics.json_types import DESCRIBED, Count, Seconds, Sha256
from kiln.basics.paths import local_ref
from kiln.commands.images.base_image import builder_base
from kiln.commands.options import Subparsers, reports
from kiln.domain.imagecheck import declared_engine, engine_stamp
from kiln.domain.images import disk_space
from kiln.domain.images.build_context import BuildContext
from kiln.domain.images.ca_bundle import CABundle, add_to_context
from kiln.domain.images.definitions import (
    PATCHER_ARC,
    EngineImage,
    RecipeImage,
    engine_modules,
    existing,
    platform_suffix,
    resolve,
)
from kiln.domain.locks import engine_lock, lock_failure, recipe_lock
from kiln.domain.patching import series
from kiln.domain.recipes.recipe import LoadedRecipe
from kiln.domain.recipes.resolved import ResolvedRecipe, resolve_recipe
from kiln.domain.reproducible import normalise_image
from kiln.domain.reproducible.save_archive import rfc3339
from kiln.domain.reproducible.source_date import SourceDate
from kiln.infra import binfmt, credentials, records
from kiln.infra.docker import DockerDaemon, Image, id_of
from kiln.inimage import patch_applier, patch_format

_STEP_HEADER = re.compile(r"^Step \d+/\d+ : (\S+)\s+(.*)$", re.DOTALL)

_Check = Callable[[Image], None]  # raises a KilnError: the image must not be tagged
_Finalize = Callable[[Image], str]  # returns the id to tag (e.g. a labelled derivative)


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


@dataclass
class _BuildOutcome:
    tag: str
    image_id: str
    digest: str
    size: int
    seconds: float
    skipped: bool
    steps: int = 0
    cached_steps: int = 0

    def document(self, recipe: str) -> BuildDocument:
        """`kiln build --json` (schema: schemas/build.json)."""
        return BuildDocument(
            recipe=recipe,
            tag=self.tag,
            image_id=self.image_id,
            input_digest=self.digest,
            size_bytes=self.size,
            seconds=round(self.seconds, 2),
            skipped=self.skipped,
            steps=self.steps,
            cached_steps=self.cached_steps,
        )


@dataclass(frozen=True)
class _ImageBuild:
    """One image to build: its inputs, its names, and what must hold before it is tagged."""

    label: str  # names the build in progress lines and errors
    context: BuildContext
    digest: str  # input digest, stamped as a label and checked by `existing`
    tags: list[str]  # the digest tag first, then aliases
    labels: dict[str, str]
    buildargs: dict[str, str]
    max_size_gb: float | None = None
    check: _Check | None = None
    finalize: _Finalize | None = None
    source_date: SourceDate = SourceDate(0, "unknown")  # created/history dates and file mtimes  # noqa: RUF009
    lock_file: Path | None = None  # the engine lock the build installs from, for its errors
    relock: str = "kiln engine lock RECIPE"  # how to re-lock it
    platform: str | None = None  # OCI platform to build for (None: the daemon's own)
    parent: str | None = None  # the image the final stage is FROM: its layers are kept as they are


def _reuse(docker: DockerDaemon, digest: str, tags: list[str], date: SourceDate | None = None) -> _BuildOutcome | None:
    """The image these inputs already built, with every alias tag (re)pointed at it;
    None when there is none. With `date`: only one dated by it (the same input digest from
    another commit carries another created/revision, hence another id)."""
    t0 = time.monotonic()
    img = existing(docker, tags[0], digest)
    if img is None:
        return None
    labels = img.labels or {}
    if date is not None and (
        labels.get("org.opencontainers.image.created") != rfc3339(date.epoch)
        or labels.get("org.opencontainers.image.revision") != date.revision
    ):
        return None
    for tag in tags[1:]:
        docker.tag(id_of(img), tag)
    return _BuildOutcome(tags[0], id_of(img), digest, img.attrs.get("Size", 0), time.monotonic() - t0, True)


def _run_build(docker: DockerDaemon, job: _ImageBuild, ca: CABundle, *, nocache: bool = False) -> _BuildOutcome:
    """Build `job` untagged, check it, make it reproducible (normalised layers and config
    at the source date), then tag it. The wall clock goes into the build record only."""
    started = clock.timestamp()
    context = job.context
    if not context.has("_kiln/ca.crt"):
        add_to_context(context, ca)
    if job.labels:
        # one LABEL instruction: the legacy builder makes one step per label passed via the API
        context.append_at_build("Dockerfile", _label_instruction(job.labels).encode())
    log.step(f"building {job.tags[0]} (context {log.human_size(context.size())}, CA: {ca.origin})")
    try:
        result = docker.build(context, label=job.label, buildargs=job.buildargs, nocache=nocache, platform=job.platform)
    except BuildFailed as exc:
        raise _as_patch_failure(exc) or lock_failure.typed(exc, job.lock_file, job.relock) or exc from None
    image = docker.require_image(result.image_id)
    size = image.attrs.get("Size", 0)
    # check before tagging: a failed check must leave no tag behind
    if job.max_size_gb is not None and size > job.max_size_gb * 1e9:
        raise BudgetExceeded(
            f"{job.label}: image is {log.human_size(size)}, over budgets.max_image_size_gb={job.max_size_gb}"
        )
    if job.check is not None:
        job.check(image)
    built_id = job.finalize(image) if job.finalize is not None else result.image_id
    norm = normalise_image.make_reproducible(
        docker, built_id, job.source_date.epoch, label=job.label, parent=job.parent
    )
    image_id = norm.image_id
    for tag in job.tags:
        docker.tag(image_id, tag)
    records.write_build_record(
        {
            "image_id": image_id,
            "built_id": built_id,
            "tags": job.tags,
            "input_digest": job.digest,
            "source_date": job.source_date.epoch,
            "revision": job.source_date.revision,
            "layers": norm.diff_ids,
            "started": started,
            "finished": clock.timestamp(),
            "build_seconds": round(result.seconds, 2),
            "normalise_seconds": round(norm.seconds, 2),
        }
    )
    return _BuildOutcome(
        job.tags[0], image_id, job.digest, size, result.seconds + norm.seconds, False, result.steps, result.cached_steps
    )


def _as_patch_failure(exc: BuildFailed) -> KilnError | None:
    """A failed RUN step that runs the in-image applier, with one of the applier's own exit
    statuses, is that typed error (its own exit code), reported with the lines the applier
    printed in that step; any other status (e.g. a compileall after it) stays BuildFailed."""
    if exc.status is None or not _runs_applier(exc.step):
        return None
    typed = {
        patch_format.ApplyFailed.exit_code: PatchFailed,
        patch_format.DriftError.exit_code: OverrideDrift,
        patch_format.PatchFormatError.exit_code: PatchInvalid,
    }.get(exc.status)
    if typed is None:
        return None
    lines = [ln for ln in exc.tail if not ln.startswith(patch_applier.HINT_PREFIX)]
    return typed(lines or [f"{exc.step}: the patch applier exited {exc.status} without saying why"])


def _runs_applier(step: str) -> bool:
    """`Step N/M : RUN ...` whose command runs the applier the harness copies in."""
    m = _STEP_HEADER.match(step)
    return m is not None and m.group(1).upper() == "RUN" and PurePosixPath(PATCHER_ARC).name in m.group(2)


def _label_instruction(labels: dict[str, str]) -> str:
    """`LABEL "k"="v" ...` for the final stage; values JSON-quoted (Dockerfile-compatible)."""
    pairs = " \\\n      ".join(f"{json.dumps(k)}={json.dumps(v)}" for k, v in sorted(labels.items()))
    return f"\n# ---- kiln labels (added at build time, not part of the input digest) ----\nLABEL {pairs}\n"


def build_engine(
    docker: DockerDaemon,
    engine_image: EngineImage,
    *,
    force: bool = False,
    nocache: bool = False,
    recipe: str = "RECIPE",
) -> _BuildOutcome:
    tags = [engine_image.tag, engine_image.alias_tag]
    reused = None if force else _reuse(docker, engine_image.digest, tags, engine_image.source_date)
    if reused is not None:
        return stamp(docker, tags, reused, engine_image.source_date.epoch)
    base = engine_image.engine.base_image
    # a registry base is pulled by digest; the air-gapped kiln/base is never pulled
    docker.ensure_base(
        local_ref(engine_image.base_ref), pull=not base.ref.startswith("kiln/"), auth=credentials.pull_auth
    )
    check = None
    if engine_image.cross_placed:
        host_base = base.ref + platform_suffix(engine_image.builder_platform)
        docker.ensure_base(local_ref(host_base), pull=False)
        builder_base(docker, local_ref(host_base), engine_image.platform, local_ref(engine_image.builder_image))
        modules = engine_modules(engine_image.engine.flavour)
        check = lambda image: engine_stamp.import_check(docker, image.id, modules)  # noqa: E731
    engine_image.add_wheels()
    job = _ImageBuild(
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
    return _run_build(docker, job, engine_image.ca.get(), nocache=nocache)


def stamp(docker: DockerDaemon, tags: list[str], outcome: _BuildOutcome, epoch: int = 0) -> _BuildOutcome:
    """Heal an engine image built before probing existed (a reused image without the
    labels): tag a labelled derivative in its place. If the probe fails, the engine's
    tags are removed, so a failed check never leaves a tag that a later build would trust.
    Fresh builds are labelled before they are tagged (`_ImageBuild.finalize`)."""
    image = docker.require_image(outcome.image_id)
    if engine_stamp.is_stamped(image):
        return outcome
    try:
        image_id = engine_stamp.labelled(docker, image)
        image_id = normalise_image.make_reproducible(docker, image_id, epoch, label="engine").image_id
    except BaseException:
        _untag(docker, tags)
        raise
    for tag in tags:
        docker.tag(image_id, tag)
    return replace(outcome, image_id=image_id)


def _untag(docker: DockerDaemon, tags: list[str]) -> None:
    for tag in tags:
        try:
            docker.remove_image(tag)
        except Exception as exc:  # keep the probe's own error as the one reported  # noqa: BLE001
            log.warn(f"could not remove tag {tag}: {exc}")


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
) -> _BuildOutcome:
    """`name`: the recipe (resolved, or its name); `platform`: one of engine.platforms (None: the host's)."""
    docker = docker or DockerDaemon()
    t0 = time.monotonic()
    recipe = resolve_recipe(name) if isinstance(name, str) else name
    if platform is not None:
        check_platform(recipe.loaded, platform)
    resolved = resolve(recipe, ca_flag, platform)
    loaded, engine_image, recipe_image = recipe.loaded, resolved.engine_image, resolved.recipe_image
    reused = (
        None
        if force
        else _reuse(docker, recipe_image.digest, [recipe_image.tag, recipe_image.latest_tag], recipe_image.source_date)
    )
    if reused is not None:
        if not quiet_summary:
            log.ok(
                f"{recipe_image.tag} is up to date (input digest {recipe_image.digest[:19]}); "
                f"nothing to build [{log.human_secs(time.monotonic() - t0)}]"
            )
        return reused
    _preflight_patches(recipe)
    engine_outcome = build_engine(
        docker, engine_image, force=force_engine, nocache=nocache and force_engine, recipe=recipe.name
    )
    if engine_outcome.skipped:
        log.ok(f"engine {engine_image.tag} up to date")
    else:
        _summary("engine image built", engine_outcome, engine_outcome.seconds)
    declared_engine.preflight_launch_args(loaded, engine_outcome.image_id, docker)
    outcome = _run_build(docker, _recipe_build(docker, loaded, recipe_image), engine_image.ca.get(), nocache=nocache)
    if not quiet_summary:
        _summary(
            f"built {recipe_image.repository}",
            outcome,
            time.monotonic() - t0,
            extra={"also tagged": recipe_image.latest_tag, "engine": engine_image.tag},
        )
    return outcome


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

    def ahead(platform: str | None) -> disk_space.EngineBuild | None:
        if platform is not None:
            check_platform(recipe.loaded, platform)
        resolved = resolve(recipe, ca_flag, platform)
        recipe_image, engine_image = resolved.recipe_image, resolved.engine_image
        if not force and existing(docker, recipe_image.tag, recipe_image.digest) is not None:
            return None  # build_recipe reuses it, and builds no engine
        if not force_engine and existing(docker, engine_image.tag, engine_image.digest) is not None:
            return None
        return disk_space.EngineBuild(engine_image.engine.flavour, engine_image.platform)

    builds = [b for p in platforms if (b := ahead(p))]
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


def _platforms_of(recipe: ResolvedRecipe, flag: str | None) -> list[str | None]:
    """--platform: None (the host's), one platform, or `all` (every declared one)."""
    return [None] if flag is None else list[str | None](recipe.engine.platforms) if flag == "all" else [flag]


def _recipe_build(docker: DockerDaemon, loaded: LoadedRecipe, recipe_image: RecipeImage) -> _ImageBuild:
    recipe_image.add_wheels()  # its own locked packages, if it names any (recipe_lock)
    return _ImageBuild(
        label=loaded.name,
        context=recipe_image.context,
        digest=recipe_image.digest,
        tags=[recipe_image.tag, recipe_image.latest_tag],
        labels=recipe_image.labels(),
        buildargs=recipe_image.buildargs(),
        max_size_gb=loaded.recipe.budgets.max_image_size_gb,
        source_date=recipe_image.source_date,
        # the engine really is the declared one and accepts the launch args (declared_engine)
        check=lambda image: declared_engine.verify(loaded, image, docker),
        platform=recipe_image.platform,
        parent=recipe_image.buildargs()["KILN_ENGINE_IMAGE"],
        lock_file=recipe_image.lock_file if recipe_image.lock is not None else None,
        relock=recipe_lock.relock_command(loaded.name),
    )


def _preflight_patches(recipe: ResolvedRecipe) -> None:
    """Apply the engine series and the recipe's switched-on features to the pinned
    engine's sources on the host, so a hunk that no longer applies fails in seconds,
    before any image layer is built. The in-image application stays authoritative."""
    engine = recipe.engine
    has_features = bool(recipe.recipe.experimental)
    if not series.series_for(engine.version).patches and not has_features:
        return
    try:
        series.check(engine.version, None, recipe)
    except EngineFetchFailed as exc:
        log.warn(f"patch pre-flight skipped ({exc.message}); the image build still applies the series")


def _summary(title: str, o: _BuildOutcome, seconds: float, extra: dict[str, object] | None = None) -> None:
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
        check_build_space(
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
        docs.append((platform, outcome.document(args.name)))
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
