"""`kiln build`: engine image (if needed), then the recipe image, each skipped when an
image with the same input digest already exists."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import PurePosixPath

from . import engineprobe, log
from .ca import CABundle, add_to_context, resolve_ca
from .context import BuildContext
from .dockerengine import DockerEngine
from .errors import BudgetExceeded, BuildFailed, KilnError, OverrideDrift, PatchFailed, PatchInvalid
from .images import LABEL_NS, PATCHER_ARC, EngineImage, RecipeImage
from .patching import applier
from .recipe import LoadedRecipe, load_recipe, recipe_dir

_STEP_HEADER = re.compile(r"^Step \d+/\d+ : (\S+)\s+(.*)$", re.S)


@dataclass
class BuildOutcome:
    tag: str
    image_id: str
    digest: str
    size: int
    seconds: float
    skipped: bool
    steps: int = 0
    cached_steps: int = 0

    def document(self, recipe: str) -> dict:
        """`kiln build --json` (schema: schemas/build.json)."""
        return {"recipe": recipe, "tag": self.tag, "image_id": self.image_id, "input_digest": self.digest,
                "size_bytes": self.size, "seconds": round(self.seconds, 2), "skipped": self.skipped,
                "steps": self.steps, "cached_steps": self.cached_steps}


class _LazyCA:
    """Resolving the CA may ask pip for its config (a subprocess): only do it when a
    build really runs, so no-op rebuilds stay fast."""

    def __init__(self, flag: str | None):
        self.flag = flag
        self._value: CABundle | None = None

    def get(self) -> CABundle:
        if self._value is None:
            self._value = resolve_ca(self.flag)
        return self._value


def resolve(name: str, ca_flag: str | None = None) -> tuple[LoadedRecipe, EngineImage, RecipeImage]:
    loaded = load_recipe(recipe_dir(name))
    engine_image = EngineImage(loaded.recipe.engine, _LazyCA(ca_flag))
    return loaded, engine_image, RecipeImage(loaded, engine_image)


def existing(docker: DockerEngine, tag: str, digest: str):
    """The local image for this input digest, or None (a tag alone is not trusted)."""
    img = docker.image(tag)
    if img is None:
        return None
    if (img.labels or {}).get(f"{LABEL_NS}.input-digest") != digest:
        return None
    return img


def _build(
    docker: DockerEngine,
    *,
    label: str,
    context: BuildContext,
    ca: CABundle,
    digest: str,
    tags: list[str],
    labels: dict[str, str],
    buildargs: dict[str, str],
    force: bool,
    max_size_gb: float | None = None,
    verify=None,
    finalize=None,
    nocache: bool = False,
) -> BuildOutcome:
    t0 = time.monotonic()
    img = None if force else existing(docker, tags[0], digest)
    if img is not None:
        for tag in tags[1:]:
            docker.tag(img.id, tag)
        return BuildOutcome(tags[0], img.id, digest, img.attrs.get("Size", 0), time.monotonic() - t0, True)
    if not context.has("_kiln/ca.crt"):
        add_to_context(context, ca)
    if labels:
        # one LABEL instruction: the legacy builder makes one step per label passed via the API
        context.append_at_build("Dockerfile", label_instruction(labels).encode())
    log.step(f"building {tags[0]} (context {log.human_size(context.size())}, CA: {ca.origin})")
    try:
        result = docker.build(context, label=label, buildargs=buildargs, nocache=nocache)
    except BuildFailed as exc:
        raise _as_patch_failure(exc) or exc from None
    image = docker.client.images.get(result.image_id)
    size = image.attrs.get("Size", 0)
    # check before tagging: a failed check must leave no tag behind
    if max_size_gb is not None and size > max_size_gb * 1e9:
        raise BudgetExceeded(
            f"{label}: image is {log.human_size(size)}, over budgets.max_image_size_gb={max_size_gb}"
        )
    if verify is not None:
        verify(image)
    if finalize is not None:  # e.g. the engine probe's labels: a new image id, still untagged
        result.image_id = finalize(image)
    for tag in tags:
        docker.tag(result.image_id, tag)
    return BuildOutcome(
        tags[0], result.image_id, digest, size, result.seconds, False, result.steps, result.cached_steps
    )


def _as_patch_failure(exc: BuildFailed) -> KilnError | None:
    """A failed RUN step that runs the in-image applier, with one of the applier's own exit
    statuses, is that typed error (its own exit code), reported with the lines the applier
    printed in that step; any other status (e.g. a compileall after it) stays BuildFailed."""
    if exc.status is None or not _runs_applier(exc.step):
        return None
    typed = {
        applier.ApplyFailed.exit_code: PatchFailed,
        applier.DriftError.exit_code: OverrideDrift,
        applier.PatchFormatError.exit_code: PatchInvalid,
    }.get(exc.status)
    if typed is None:
        return None
    lines = [ln for ln in exc.tail if not ln.startswith(applier.HINT_PREFIX)]
    return typed(lines or [f"{exc.step}: the patch applier exited {exc.status} without saying why"])


def _runs_applier(step: str) -> bool:
    """`Step N/M : RUN ...` whose command runs the applier the harness copies in."""
    m = _STEP_HEADER.match(step)
    return bool(m) and m.group(1).upper() == "RUN" and PurePosixPath(PATCHER_ARC).name in m.group(2)


def label_instruction(labels: dict[str, str]) -> str:
    """`LABEL "k"="v" ...` for the final stage; values JSON-quoted (Dockerfile-compatible)."""
    pairs = " \\\n      ".join(f"{json.dumps(k)}={json.dumps(v)}" for k, v in sorted(labels.items()))
    return f"\n# ---- kiln labels (added at build time, not part of the input digest) ----\nLABEL {pairs}\n"


def build_engine(docker: DockerEngine, engine_image: EngineImage, *, force: bool = False,
                 nocache: bool = False) -> BuildOutcome:
    base = engine_image.engine.base_image
    if not force and existing(docker, engine_image.tag, engine_image.digest) is not None:
        return engineprobe.stamp(docker, engine_image, _build(
            docker, label="engine", context=engine_image.context, ca=engine_image.ca.get(),
            digest=engine_image.digest, tags=[engine_image.tag, engine_image.alias_tag],
            labels={}, buildargs={}, force=False))
    # a registry base is pulled by digest; the air-gapped kiln/base is never pulled
    docker.ensure_base(base.pinned, pull=not base.ref.startswith("kiln/"))
    engine_image.add_wheels()
    # torch/CUDA/NCCL labels read from the built image before anything is tagged
    return _build(
        docker,
        label=f"engine-{engine_image.engine.flavour}",
        context=engine_image.context,
        ca=engine_image.ca.get(),
        digest=engine_image.digest,
        tags=[engine_image.tag, engine_image.alias_tag],
        labels=engine_image.labels(),
        buildargs=engine_image.buildargs(),
        force=force,
        finalize=lambda image: engineprobe.labelled(docker, image),
        nocache=nocache,
    )


def build_recipe(
    name: str, *, docker: DockerEngine | None = None, force: bool = False, force_engine: bool = False,
    ca_flag: str | None = None, quiet_summary: bool = False, nocache: bool = False,
) -> BuildOutcome:
    docker = docker or DockerEngine()
    t0 = time.monotonic()
    loaded, engine_image, recipe_image = resolve(name, ca_flag)
    if not force and existing(docker, recipe_image.tag, recipe_image.digest) is not None:
        outcome = _build(docker, label=name, context=recipe_image.context, ca=engine_image.ca.get(),
                         digest=recipe_image.digest, tags=[recipe_image.tag, recipe_image.latest_tag],
                         labels={}, buildargs={}, force=False)
        if not quiet_summary:
            log.ok(f"{recipe_image.tag} is up to date (input digest {recipe_image.digest[:19]}); "
                   f"nothing to build [{log.human_secs(time.monotonic() - t0)}]")
        return outcome
    preflight_patches(loaded)
    engine_outcome = build_engine(docker, engine_image, force=force_engine, nocache=nocache and force_engine)
    if engine_outcome.skipped:
        log.ok(f"engine {engine_image.tag} up to date")
    else:
        _summary("engine image built", engine_outcome, engine_outcome.seconds)
    outcome = _build(
        docker,
        label=name,
        context=recipe_image.context,
        ca=engine_image.ca.get(),
        digest=recipe_image.digest,
        tags=[recipe_image.tag, recipe_image.latest_tag],
        labels=recipe_image.labels(),
        buildargs=recipe_image.buildargs(),
        force=force,
        max_size_gb=loaded.recipe.budgets.max_image_size_gb,
        verify=_engine_verifier(loaded, engine_image),
        nocache=nocache,
    )
    if not quiet_summary:
        _summary(f"built {recipe_image.repository}", outcome, time.monotonic() - t0,
                 extra={"also tagged": recipe_image.latest_tag, "engine": engine_image.tag})
    return outcome


def preflight_patches(loaded: LoadedRecipe) -> None:
    """Apply the engine series and the recipe's switched-on features to the pinned
    engine's sources on the host, so a hunk that no longer applies fails in seconds,
    before any image layer is built. The in-image application stays authoritative."""
    from .errors import EngineFetchFailed
    from .patching import series

    engine = loaded.recipe.engine
    has_features = bool(loaded.recipe.experimental)
    if not series.series_for(engine.version).patches and not has_features:
        return
    try:
        series.check(engine.version, None, loaded)
    except EngineFetchFailed as exc:
        log.warn(f"patch pre-flight skipped ({exc.message}); the image build still applies the series")


def _engine_verifier(loaded: LoadedRecipe, engine_image: EngineImage):
    """Checks run on the built image before it is tagged (see enginecheck)."""
    from . import enginecheck

    return lambda image: enginecheck.verify(loaded, image)


def _summary(title: str, o: BuildOutcome, seconds: float, extra: dict | None = None) -> None:
    rows = {
        "tag": o.tag,
        "image id": o.image_id,
        "input digest": o.digest,
        "size": log.human_size(o.size),
        "took": log.human_secs(seconds),
        "cache": f"{o.cached_steps}/{o.steps} steps cached",
    }
    rows.update(extra or {})
    log.summary(title, rows)


def require_built(docker: DockerEngine, name: str):
    """The image built from the current inputs, or ImageNotBuilt."""
    from .errors import ImageNotBuilt

    loaded, engine_image, recipe_image = resolve(name)
    img = existing(docker, recipe_image.tag, recipe_image.digest)
    if img is None:
        raise ImageNotBuilt(f"{recipe_image.tag} (from the current inputs of {name}) is not built")
    return loaded, recipe_image, img


__all__ = ["BuildOutcome", "build_recipe", "build_engine", "resolve", "existing", "require_built", "BuildFailed"]
