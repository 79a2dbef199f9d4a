"""Make a freshly built image reproducible before it is tagged: `docker save` it,
rewrite its layers and config (`normalise`), `docker load` the result.

The id the
daemon reports must be the sha256 of the config kiln wrote, or nothing is tagged."""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from kiln.basics import log
from kiln.basics.errors import BuildFailed
from kiln.basics.paths import cache_dir
from kiln.domain.reproducible import save_archive, source_date
from kiln.infra.docker import DockerDaemon

_SAVE_ATTEMPTS = 3


@dataclass(frozen=True)
class _Outcome:
    image_id: str
    built_id: str  # what the builder made (kept: its steps are the layer cache)
    diff_ids: list[str]
    seconds: float


def _scratch_root() -> Path:
    """Where the save/rewrite/load works: next to kiln's caches (the same disk as the
    wheel cache; several GB for an engine image, removed at the end)."""
    d = cache_dir() / "normalise"
    d.mkdir(parents=True, exist_ok=True)
    return d


def make_reproducible(
    docker: DockerDaemon, image_id: str, epoch: int, *, label: str, parent: str | None = None
) -> _Outcome:
    """`parent`: the image `image_id` was built FROM; the layers the two share stay as
    they are (the parent is content-addressed: every machine keeps the same ones)."""
    t0 = time.monotonic()
    parent_image = docker.image(parent) if parent else None
    keep: list[str] = list(parent_image.attrs["RootFS"]["Layers"]) if parent_image is not None else []
    with tempfile.TemporaryDirectory(prefix="kiln-norm-", dir=_scratch_root()) as tmp:
        saved = Path(tmp) / "saved"
        for attempt in range(1, _SAVE_ATTEMPTS + 1):
            try:
                save_archive.extract_saved(docker.save(image_id), saved)
                break
            except BuildFailed as exc:
                # seen once on dockerd 20.10 (overlay2) right after the probe container of the
                # same image was removed: "open .../merged/...: no such file"; a second save works
                if attempt == _SAVE_ATTEMPTS:
                    raise
                log.warn(f"{label}: {exc.message}; saving again ({attempt + 1}/{_SAVE_ATTEMPTS})")
                shutil.rmtree(saved, ignore_errors=True)
        try:
            result = save_archive.normalise_saved(saved, epoch, keep)
        except (ValueError, KeyError, OSError, BuildFailed) as exc:  # BuildFailed: the archive's JSON
            raise BuildFailed(f"{label}: could not normalise the image {image_id[:19]}: {exc}") from None
        loaded = docker.load(result.archive())
    if loaded != result.image_id:
        raise BuildFailed(
            f"{label}: docker load gave {loaded[:19]}, expected {result.image_id[:19]} "
            f"(the sha256 of the normalised config)"
        )
    seconds = time.monotonic() - t0
    kept = result.kept
    how = f"; {len(result.diff_ids) - kept} new layer(s) rewritten, {kept} kept from {parent}" if kept else ""
    log.info(
        f"{label}: normalised {image_id[:19]} -> {loaded[:19]} "
        f"(source date {source_date.rfc3339(epoch)}{how}) in {log.human_secs(seconds)}"
    )
    return _Outcome(loaded, image_id, result.diff_ids, seconds)
