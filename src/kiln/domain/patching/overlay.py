"""What a recipe image carries for one switched-on feature: the feature folder (only the
series of the recipe's engine version) and its `overlay.json`, which the in-image applier
(`kiln_patching.py apply-overlays`) reads. Used by the image builder; no CLI code here."""

from __future__ import annotations

import json
from typing import TypedDict

from kiln.domain.recipes.overrides import LoadedOverride


class _OverlayReplacement(TypedDict):
    target: str
    file: str
    upstream_sha256: str


class _OverlayJson(TypedDict):
    """`overlay.json`, as kiln_patching.py's load_overlays reads it."""

    name: str
    series: str | None  # the series file of the recipe's engine version; None: replacements only
    replacements: list[_OverlayReplacement]


def _series_path(loaded_override: LoadedOverride, engine_version: str) -> str | None:
    """The feature's series file for `engine_version`, relative to the feature folder."""
    file = loaded_override.series_file_for(engine_version)
    return str(file.relative_to(loaded_override.dir)) if file is not None else None


def excluded_paths(loaded_override: LoadedOverride, engine_version: str) -> tuple[str, ...]:
    """Folder-relative paths left out of the image: other engine versions' series, so
    that porting the feature to a new engine does not change older recipes' images."""
    patches = loaded_override.override.patches
    if not loaded_override.versioned or patches is None:  # versioned: `patches` names a folder
        return ()
    base = patches.rstrip("/")
    return tuple(f"{base}/{v}" for v in loaded_override.series_versions() if v != engine_version)


def overlay_json(loaded_override: LoadedOverride, engine_version: str) -> bytes:
    """`overlay.json` for one switched-on feature; paths are relative to the feature
    folder copied next to it."""
    ov = loaded_override.override
    doc: _OverlayJson = {
        "name": ov.name,
        "series": _series_path(loaded_override, engine_version),
        "replacements": [
            {"target": r.target, "file": r.file, "upstream_sha256": r.upstream_sha256} for r in ov.replacements
        ],
    }
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
