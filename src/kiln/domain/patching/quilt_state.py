"""What a quilt-style scratch tree edits and what it remembers: the series it checks out
(`Target`: the engine-wide one, or a recipe feature's ported to another engine version),
where the tree lives, and its state file (.pc/kiln.json), which `kiln patches refresh`
compares against. The checkout and refresh themselves are domain/patching/quilt.py's.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from kiln.basics.documents import Shape, read_document
from kiln.basics.errors import PatchInvalid, UsageError
from kiln.basics.paths import cache_dir
from kiln.domain.patching.series import (
    ENGINE,
    FeatureRef,
    load_series,
    pinned_versions,
    series_dir,
    series_for,
    shown,
)
from kiln.inimage import patch_format

STATE_FILE = "kiln.json"


class PatchState(TypedDict):
    """One patch of a checked-out series, as checkout applied it."""

    name: str
    sha256: str
    exact: bool  # applied at its stated lines: refresh may keep its bytes
    before: dict[str, str | None]  # target -> sha256 before the patch (None: absent)
    after: dict[str, str | None]  # ... and after it


class QuiltState(TypedDict):
    """.pc/kiln.json of a scratch tree: what `kiln patches refresh` compares against."""

    engine: str
    flavour: str
    series_from: str
    feature: str | None
    patches: list[PatchState]
    final: dict[str, str | None]  # every patched file's sha256 after the whole series


_QUILT_STATE = Shape(QuiltState)


@dataclass
class Target:
    """Which series a scratch tree edits: the engine-wide one (feature None) or a recipe
    feature's, ported from `from_version`'s series to `version`'s sources."""

    version: str
    from_version: str
    feature: FeatureRef | None = None

    def series_folder(self, version: str) -> Path:
        """The folder of the target's patch series for an engine version: the engine's, or the feature's overlay."""
        if self.feature is None:
            return series_dir(version)
        _, ov = self.feature.load()
        folder = ov.series_dir_for(version)
        if folder is None:
            raise UsageError(f"feature {self.feature}: override.yaml names no `patches:` series")
        if not ov.versioned and version != ov.override.engine.version:
            raise UsageError(
                f"feature {self.feature}: {shown(ov.patches or ov.dir)} is one series for "
                f"{ENGINE} {ov.override.engine.version}, not {version}",
                hint="keep one series per engine version: move it to "
                f"patches/{ov.override.engine.version}/series and set `patches: patches`",
            )
        return folder

    def series(self, version: str) -> patch_format.Series:
        """The target's patch series for an engine version."""
        source = "series" if self.feature is None else f"feature:{self.feature.feature}"
        return load_series(self.series_folder(version) / "series", source)

    def base(self) -> list[patch_format.Series]:
        """What the tree carries underneath, untracked: the engine series, for a feature.
        A feature is never ported ahead of the engine: its patches are diffs against the
        engine as that version's image installs it."""
        if self.feature is None:
            return []
        if not (series_dir(self.version) / "series").is_file() and pinned_versions():
            raise UsageError(
                f"{shown(series_dir(self.version))}/ does not exist: the engine series is not "
                f"ported to {ENGINE} {self.version}",
                hint=f"port the engine series first: `kiln engine bump --to {self.version}`",
            )
        return [series_for(self.version)]

    def scratch_name(self, flavour: str) -> str:
        """The name of the target's scratch checkout for an engine flavour."""
        name = f"{ENGINE}-{self.version}-{flavour}"
        return name if self.feature is None else f"{name}-{self.feature.recipe}-{self.feature.feature}"

    def feature_name(self) -> str | None:
        """The feature, as the scratch tree's state names it."""
        return str(self.feature) if self.feature else None


def scratch_dir(target: Target, flavour: str) -> Path:
    """The scratch folder in kiln's cache where the target's series is checked out."""
    return cache_dir() / "scratch" / target.scratch_name(flavour)


def read_state(scratch: Path) -> QuiltState:
    """The quilt state of a scratch checkout; UsageError when nothing is checked out there."""
    f = scratch / ".pc" / STATE_FILE
    if not f.is_file():
        raise UsageError(f"{scratch}: no checked-out series here; run `kiln patches checkout` first")
    return read_document(
        f,
        _QUILT_STATE,
        functools.partial(
            PatchInvalid,
            hint="check the series out again (`kiln patches checkout`): refresh compares against this file",
        ),
    )


def file_sha(path: Path) -> str | None:
    """The sha256 of a file's bytes; None when there is no file."""
    return patch_format.sha256_bytes(path.read_bytes()) if path.is_file() else None


def dirty_files(scratch: Path, state: QuiltState) -> list[str]:
    """Files edited since checkout (compared with what the series left there)."""
    return [rel for rel, sha in state["final"].items() if file_sha(scratch / rel) != sha]


def sha_or_none(data: bytes | None) -> str | None:
    """The sha256 of some bytes; None for None."""
    return patch_format.sha256_bytes(data) if data is not None else None
