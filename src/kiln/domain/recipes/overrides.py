"""Experimental overrides: `recipes/<name>/experimental/<feature>/override.yaml`.

An override is a feature a recipe can switch on: env it sets at launch, plus either a
patch series (preferred) or whole-file replacements against the pinned engine. A
replacement records the sha256 of the upstream file it was forked from, so an engine
bump that changes that file fails the build instead of silently reverting upstream.

`patches:` names either one series file (for one engine version, `engine.version`) or a
folder holding one series per engine version (`patches/0.32.0/series`,
`patches/0.33.0/series`): recipes on different engine versions then share the feature,
each applying the series of its own engine version.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from packaging.version import InvalidVersion
from packaging.version import Version as PEP440Version
from pydantic import Field

from kiln.basics.errors import RecipeInvalid
from kiln.basics.sourced_yaml import SourcedYaml
from kiln.domain.recipes import env_policy
from kiln.domain.recipes.env_policy import EnvValue, Reason
from kiln.domain.recipes.feature_registry import unknown_knob_problems
from kiln.domain.recipes.recipe_sections import EnvName, Version
from kiln.domain.recipes.validated_yaml import Strict, display_path, load_validated

_OVERRIDE_FILE = "override.yaml"


class OverrideEngine(Strict):
    """The engine an override is written for."""

    name: str = "vllm"
    version: Version


class Replacement(Strict):
    """A whole file replaced in the installed engine (discouraged: prefer a patch)."""

    target: Annotated[str, Field(pattern=r"^vllm/[A-Za-z0-9_./-]+\.py$")] = Field(
        description="path inside site-packages, e.g. vllm/v1/worker/gpu/model_runner.py"
    )
    file: str = Field(description="the replacement, relative to the override folder")
    upstream_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] = Field(
        description="sha256 of the upstream file this replacement was forked from"
    )


class Override(Strict):
    """A feature overlay's override.yaml: the env it sets, its patch series, launch arguments and engine."""

    name: str
    description: str
    engine: OverrideEngine
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict, description="env the feature sets at launch; each value one line of text"
    )
    allow_unsafe_env: dict[EnvName, Reason] = Field(default_factory=dict, description=env_policy.ALLOW_DESCRIPTION)
    patches: str | None = Field(
        None,
        description="series file (relative) listing the patches in order, or a "
        "folder holding one <engine version>/series per engine version",
    )
    replacements: list[Replacement] = Field(default_factory=list)


class LoadedOverride:
    """A validated override.yaml, its folder and where each field sits in it."""

    def __init__(self, override: Override, directory: Path, source: SourcedYaml | None = None) -> None:
        self.override = override
        self.dir = directory
        self.source = source  # where each field sits in override.yaml, for error lines

    def where(self, *loc: Any) -> str:
        """`path:line` of a field of override.yaml (line 1 when not known)."""
        line = self.source.line_of(tuple(loc)) if self.source is not None else 1
        return f"{display_path(self.dir / _OVERRIDE_FILE)}:{line}"

    @property
    def name(self) -> str:
        """The feature's name."""
        return self.override.name

    @property
    def env(self) -> dict[str, str]:
        """The environment the feature sets at launch."""
        return dict(self.override.env)

    @property
    def patches(self) -> Path | None:
        """What `patches:` names, inside the override folder (None: no patches)."""
        return self.dir / self.override.patches if self.override.patches else None

    @property
    def versioned(self) -> bool:
        """`patches:` names a folder of per-engine-version series, not one series file."""
        return self.patches is not None and self.patches.is_dir()

    @property
    def series_file(self) -> Path | None:
        """The one series file of an unversioned override (None when versioned or patch-less)."""
        patches = self.patches
        return None if patches is None or patches.is_dir() else patches

    def series_versions(self) -> list[str]:
        """Engine versions a versioned override has a series for, oldest first."""
        patches = self.patches
        return series_versions(patches) if patches is not None and patches.is_dir() else []

    def series_dir_for(self, version: str) -> Path | None:
        """Where the series for engine `version` lives (or would live, once ported)."""
        patches = self.patches
        if patches is None:
            return None
        return patches / version if patches.is_dir() else patches.parent

    def series_file_for(self, version: str) -> Path | None:
        """The series applied on engine `version`: the versioned one (None when not ported
        to that version) or the single series file."""
        patches = self.patches
        if patches is not None and patches.is_dir():
            f = patches / version / "series"
            return f if f.is_file() else None
        return self.series_file

    def supports(self, version: str) -> bool:
        """Whether the override can be applied on engine `version` as it stands."""
        if self.versioned:
            return version in self.series_versions() and (
                not self.override.replacements or self.override.engine.version == version
            )
        return self.override.engine.version == version


def version_key(name: str) -> PEP440Version | None:
    """PEP 440 order (0.33.0rc1 < 0.33.0 < 0.33.0.post1); None for no version."""
    try:
        return PEP440Version(name)
    except InvalidVersion:
        return None


def series_versions(folder: Path, left_out: Callable[[str], object] | None = None) -> list[str]:
    """Sub-folders of `folder` named by a PEP 440 version and holding a `series` file,
    in version order (0.9.0 < 0.32.0 < 0.33.0rc1 < 0.33.0 < 0.33.0.post1). A folder
    that is no version (`latest`) names no release pip could fetch: it is left out,
    and passed to `left_out` (to say so)."""
    if not folder.is_dir():
        return []
    names = []
    for d in folder.iterdir():
        if not (d / "series").is_file():
            continue
        if version_key(d.name) is None:
            if left_out is not None:
                left_out(d.name)
            continue
        names.append(d.name)
    return sorted(names, key=PEP440Version)  # each one parsed above


def _escapes(directory: Path, rel: str) -> str | None:
    """Why a path the override names is not a file inside its own folder (only that
    folder goes into the build context; anything else would be read from the host)."""
    try:
        target = (directory / rel).resolve()
    except (OSError, RuntimeError, ValueError):
        return "is not a usable path"
    if not target.is_relative_to(directory.resolve()):
        return f"is outside {display_path(directory)}/"
    return None


def load_override(directory: Path) -> LoadedOverride:
    """Load and check a feature overlay's override.yaml from its folder; RecipeInvalid listing its problems."""
    file = directory / _OVERRIDE_FILE
    shown = display_path(file)
    doc = load_validated(file, Override)
    override, src = doc.value, doc.source
    problems = []
    if override.name != directory.name:
        problems.append(f"{shown}:{src.line_of(('name',))}: name: must equal its folder name {directory.name!r}")
    if override.patches:
        why = _escapes(directory, override.patches)
        if why:
            problems.append(f"{shown}:{src.line_of(('patches',))}: patches: {override.patches!r} {why}")
        elif (directory / override.patches).is_dir():
            if not series_versions(directory / override.patches):
                problems.append(
                    f"{shown}:{src.line_of(('patches',))}: patches: folder {override.patches!r} holds "
                    "no <engine version>/series"
                )
        elif not (directory / override.patches).is_file():
            problems.append(f"{shown}:{src.line_of(('patches',))}: patches: no series file {override.patches!r}")
    for i, rep in enumerate(override.replacements):
        where = f"{shown}:{src.line_of(('replacements', i, 'file'))}: replacements[{i}].file"
        why = _escapes(directory, rep.file)
        if why:
            problems.append(f"{where}: {rep.file!r} {why}")
        elif not (directory / rep.file).is_file():
            problems.append(f"{where}: not found")
    problems += env_policy.problems(
        override.env,
        override.allow_unsafe_env,
        lambda *loc: f"{shown}:{src.line_of(loc)}",
        ("env",),
        ("allow_unsafe_env",),
    )
    problems += unknown_knob_problems(override.env, lambda *loc: f"{shown}:{src.line_of(loc)}", ("env",))
    if problems:
        raise RecipeInvalid(problems)
    return LoadedOverride(override, directory, src)
