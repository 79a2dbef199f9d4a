"""`kiln engine bump --dry-run --report [FILE.md]`: the report's inputs, gathered.

It gathers what the report needs from the recipes (serving's command line), the engine
wheels (their sources and METADATA) and the measured build records, then prints it and
writes the Markdown file.
(`kiln engine bump`, in commands/recipes/engine.py, calls it.)"""

from __future__ import annotations

import shlex
from pathlib import Path

from kiln.basics import clock, log
from kiln.basics.files import write_atomic
from kiln.basics.paths import repo_root
from kiln.domain.locks.lock_policy import wheel_requirements
from kiln.domain.patching import bump_report as R
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


def _recipe_use(loaded: LoadedRecipe) -> R.RecipeUse:
    recipe = loaded.recipe
    return R.RecipeUse(loaded.name, used_flags(recipe), used_speculative_keys(recipe), tuple(sorted(recipe.features)))


def _requirements(version: str, flavour: str) -> list[str]:
    return wheel_requirements(wheel_cache.engine_wheel(version, flavour))


def _make_report(versions: tuple[str, str], flavour: str | None, engine: PortedEngine, command: str) -> R.BumpReport:
    """The whole report of a bump from versions[0] to versions[1]."""
    from_version, to_version = versions
    old_root, used = engine_root(from_version, flavour)
    new_root, _ = engine_root(to_version, flavour or used)
    old, new = read_surface(old_root), read_surface(new_root)
    recipes = _moving_recipes(from_version, flavour)
    series = [R.SeriesReport(f"engine series patches/vllm/{from_version}", engine.rows)]
    ported = R.underneath(to_version, flavour or used)
    seen: dict[Path, str] = {}
    for loaded in recipes:
        series += R.feature_reports(engine, loaded, versions, ported, seen)
    requirements = R.requirement_changes(_requirements(from_version, used), _requirements(to_version, used))
    records = sorted((repo_root() / "docs").glob(_BUILD_RECORDS)) if used == "cuda" else []
    return R.BumpReport(
        from_version,
        to_version,
        flavour or used,
        command,
        clock.now().strftime("%Y-%m-%d"),
        compare(old, new),
        [_recipe_use(r) for r in recipes],
        series,
        requirements,
        R.measured_sizes(records, from_version, to_version),
        sorted(set(old.read) | set(new.read)),
    )


def command_line(to_version: str, from_version: str | None, flavour: str | None, report: str) -> str:
    """The command that makes this report, as a user would type it."""
    parts = ["kiln", "engine", "bump", "--to", to_version]
    parts += ["--from", from_version] if from_version else []
    parts += ["--flavour", flavour] if flavour else []
    parts += ["--dry-run", "--report", *([report] if report else [])]
    return shlex.join(parts)


def report_bump(versions: tuple[str, str], flavour: str | None, engine: PortedEngine, file: str, command: str) -> None:
    """Print the report; with a file name, write it as Markdown too."""
    report = _make_report(versions, flavour, engine, command)
    log.out.print(R.render_text(report), markup=False, end="")
    if file:
        path = Path(file)
        write_atomic(path, R.render_markdown(report))
        log.ok(f"wrote {path}")
