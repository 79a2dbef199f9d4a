"""The report of `kiln engine bump --dry-run --report [FILE.md]`: its inputs, gathered.

It gathers what the report needs from the recipes (serving's command line), the engine
wheels (their sources and METADATA) and the measured build records, renders it and
writes the Markdown file; `kiln engine bump` (commands/recipes/engine.py) prints it."""

from __future__ import annotations

import shlex
from pathlib import Path

from kiln.basics import clock
from kiln.basics.files import write_atomic
from kiln.basics.paths import repo_root
from kiln.domain.locks.lock_policy import wheel_requirements
from kiln.domain.patching import bump_report as report_format
from kiln.domain.patching.arg_surface import compare, read_surface
from kiln.domain.patching.bump import PortedEngine
from kiln.domain.patching.series import engine_root, load_recipe
from kiln.domain.recipes.recipe import LoadedRecipe, recipe_names
from kiln.domain.serving.launch_command import used_flags, used_speculative_keys
from kiln.infra import wheel_cache

_BUILD_RECORDS = "build-cuda*.json"  # docs/: measured engine builds, one per platform


def _moving_recipes(from_version: str, flavour: str | None) -> list[LoadedRecipe]:
    """The recipes a bump from `from_version` moves: pinned to it, of the flavour (any
    flavour when none is named)."""
    out = []
    for name in recipe_names():
        loaded = load_recipe(name)
        engine = loaded.recipe.engine
        if engine.version == from_version and (flavour is None or engine.flavour == flavour):
            out.append(loaded)
    return out


def _recipe_use(loaded: LoadedRecipe) -> report_format.RecipeUse:
    recipe = loaded.recipe
    return report_format.RecipeUse(
        loaded.name, used_flags(recipe), used_speculative_keys(recipe), tuple(sorted(recipe.features))
    )


def _requirements(version: str, flavour: str) -> list[str]:
    return wheel_requirements(wheel_cache.engine_wheel(version, flavour))


def _make_report(
    versions: tuple[str, str], flavour: str | None, engine: PortedEngine, command: str
) -> report_format.BumpReport:
    """The whole report of a bump from versions[0] to versions[1]."""
    from_version, to_version = versions
    old_root, used = engine_root(from_version, flavour)
    new_root, _ = engine_root(to_version, flavour or used)
    old, new = read_surface(old_root), read_surface(new_root)
    recipes = _moving_recipes(from_version, flavour)
    series = [report_format.SeriesReport(f"engine series patches/vllm/{from_version}", engine.rows)]
    ported = report_format.underneath(to_version, flavour or used)
    seen: dict[Path, str] = {}
    for loaded in recipes:
        series += report_format.feature_reports(engine, loaded, versions, ported, seen)
    requirements = report_format.requirement_changes(_requirements(from_version, used), _requirements(to_version, used))
    records = sorted((repo_root() / "docs").glob(_BUILD_RECORDS)) if used == "cuda" else []
    return report_format.BumpReport(
        from_version,
        to_version,
        flavour or used,
        command,
        clock.now().strftime("%Y-%m-%d"),
        compare(old, new),
        [_recipe_use(r) for r in recipes],
        series,
        requirements,
        report_format.measured_sizes(records, from_version, to_version),
        sorted(set(old.read) | set(new.read)),
    )


def command_line(to_version: str, from_version: str | None, flavour: str | None, report: str) -> str:
    """The command that makes this report, as a user would type it."""
    parts = ["kiln", "engine", "bump", "--to", to_version]
    parts += ["--from", from_version] if from_version else []
    parts += ["--flavour", flavour] if flavour else []
    parts += ["--dry-run", "--report", *([report] if report else [])]
    return shlex.join(parts)


def write_bump_report(
    versions: tuple[str, str], flavour: str | None, engine: PortedEngine, file: str, command: str
) -> tuple[str, Path | None]:
    """The report as text; with a file name, written there as Markdown too (the path)."""
    report = _make_report(versions, flavour, engine, command)
    if not file:
        return report_format.render_text(report), None
    path = Path(file)
    write_atomic(path, report_format.render_markdown(report))
    return report_format.render_text(report), path
