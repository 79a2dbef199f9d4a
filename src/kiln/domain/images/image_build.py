"""One image built from its inputs, or found already built: the build runs untagged;
the size budget, the image's own check and (for engine images) the probe's labels come
next, and only an image that passed them all is made reproducible and tagged, so a
failed check never leaves a tag that a later build would trust."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from kiln.basics import clock, log
from kiln.basics.errors import BudgetExceeded, BuildFailed, KilnError, OverrideDrift, PatchFailed, PatchInvalid
from kiln.domain.images.build_context import BuildContext
from kiln.domain.images.ca_bundle import CABundle, add_to_context
from kiln.domain.images.definitions import PATCHER_ARC
from kiln.domain.locks import lock_failure
from kiln.domain.reproducible import normalise_image
from kiln.domain.reproducible.source_date import SourceDate, rfc3339
from kiln.infra import records
from kiln.infra.docker import DockerDaemon, Image, id_of
from kiln.inimage import patch_applier, patch_format

_STEP_HEADER = re.compile(r"^Step \d+/\d+ : (\S+)\s+(.*)$", re.DOTALL)

_Check = Callable[[Image], None]  # raises a KilnError: the image must not be tagged
_Finalize = Callable[[Image], str]  # returns the id to tag (e.g. a labelled derivative)


@dataclass
class BuildOutcome:
    """An image built, or found already built from the same inputs (`skipped`)."""

    tag: str
    image_id: str
    digest: str
    size: int
    seconds: float
    skipped: bool
    steps: int = 0
    cached_steps: int = 0


@dataclass(frozen=True)
class ImageBuild:
    """One image to build: its inputs, its names, and what must hold before it is tagged."""

    label: str  # names the build in progress lines and errors
    context: BuildContext
    digest: str  # input digest, stamped as a label and checked by `local_image_for`
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


def retag_built(
    docker: DockerDaemon, img: Image | None, digest: str, tags: list[str], date: SourceDate | None = None
) -> BuildOutcome | None:
    """`img`, the image these inputs already built (`definitions.local_image_for`; None: there is
    none), with every alias tag (re)pointed at it; None when there is none. With `date`:
    only one dated by it (the same input digest from another commit carries another
    created/revision, hence another id)."""
    t0 = time.monotonic()
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
    return BuildOutcome(tags[0], id_of(img), digest, img.attrs.get("Size", 0), time.monotonic() - t0, True)


def run_build(docker: DockerDaemon, job: ImageBuild, ca: CABundle, *, nocache: bool = False) -> BuildOutcome:
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
    return BuildOutcome(
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
