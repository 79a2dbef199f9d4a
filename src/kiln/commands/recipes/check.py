"""`kiln check`: validate everything that can be validated without building."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NotRequired

from pydantic import with_config
from typing_extensions import TypedDict

from kiln.basics import log
from kiln.basics.errors import (
    KilnError,
    LaunchArgInvalid,
    PlanDoesNotFit,
    PlatformUnsupported,
    RecipeInvalid,
    UsageError,
)
from kiln.basics.json_types import DESCRIBED, Count
from kiln.basics.paths import repo_root
from kiln.commands.options import Subparsers, reports
from kiln.commands.recipes.plan import plan_recipe
from kiln.domain.imagecheck.launch_checker import LaunchCheck, check_launch
from kiln.domain.images.build_plan import check_platform
from kiln.domain.locks import engine_lock, lock_policy, recipe_lock
from kiln.domain.patching.series import recipe_series
from kiln.domain.planning import recipe_facts
from kiln.domain.planning.plan import verdict
from kiln.domain.recipes.overrides import load_override
from kiln.domain.recipes.recipe import LoadedRecipe, recipe_dir, recipe_names
from kiln.domain.recipes.resolved import ResolvedRecipe, resolve_recipe
from kiln.domain.recipes.topology import feature_problems
from kiln.infra import wheel_cache


@with_config(DESCRIBED)
class SeriesUsed(TypedDict):
    """One patch series an image applies."""

    applies: str
    file: str | None
    """The series file, relative to the checkout; null: no series for it."""
    patches: Count


@with_config(DESCRIBED)
class RecipeCheck(TypedDict):
    """One recipe checked: valid, or its problems (one line each)."""

    name: str
    valid: bool
    problems: list[str]
    series: NotRequired[list[SeriesUsed]]
    """A valid recipe: the patch series its image applies, in order."""
    launch_checked_by: NotRequired[str | None]
    """What ran the engine's own checks of the launch command: `engine image TAG` or
    `parser environment TAG`; null: neither could be had (said on stderr)."""


class CheckDocument(TypedDict):
    """`kiln check --json` (src/kiln/schemas/check.json)."""

    valid: bool
    recipes: list[RecipeCheck]


def _recipe_names(name: str | None, all_recipes: bool) -> list[str]:
    if name and not all_recipes:
        recipe_dir(name)  # an unknown name is no recipe problem: say so with its own hint
        return [name]
    return recipe_names()


def check_one(name: str) -> list[str]:
    """Problems with one recipe, as one-line messages (empty when it is fine)."""
    recipe = _resolve(name)
    recipe_problems, launch, plan_problems = _check_one(recipe)
    return recipe_problems + launch.problems + plan_problems + _platform_problems_of(recipe)


def _resolve(name: str) -> ResolvedRecipe | list[str]:
    """The recipe resolved once for every check below, or the problems it cannot load with."""
    try:
        return resolve_recipe(name)
    except RecipeInvalid as exc:
        return exc.problems


def _platform_problems_of(recipe: ResolvedRecipe | list[str]) -> list[str]:
    return [] if isinstance(recipe, list) else _platforms(recipe.loaded)  # a list: reported by _check_one


def _platforms(loaded: LoadedRecipe) -> list[str]:
    """Each declared platform (engine.platforms) has the engine's wheels in the lock:
    one line per platform that has not, naming the wheel looked for."""
    e = loaded.recipe.engine
    try:
        lock = engine_lock.for_image(engine_lock.engine_image_dir(e.flavour), e.name, e.version, loaded.name)
    except KilnError:
        return []  # a missing or unreadable lock is _lock's line already
    if lock is None:  # a stand-in engine without locks/: nothing to look in
        return []
    shown = engine_lock.shown(engine_lock.lock_path(engine_lock.engine_image_dir(e.flavour), e.name, e.version))
    problems = []
    for i, plat in enumerate(e.platforms):
        gaps = engine_lock.platform_gaps(lock, plat, e.torch)
        if gaps:
            problems.append(
                f"{loaded.where('engine', 'platforms', i)}: engine.platforms[{i}]: {plat}: {shown} "
                f"has no {plat} {', '.join(gaps)}"
            )
    return problems


def _plan_problems(loaded: LoadedRecipe) -> tuple[list[str], list[str]]:
    """A recipe with a topology: `kiln plan` on its own GPUs (topology.accelerator) must
    fit. (problems planning it, e.g. no shape; the plan's verdict when it does not fit)"""
    recipe = loaded.recipe
    if recipe.topology is None:
        return [], []
    if recipe.engine.flavour == "cuda" and recipe.topology.accelerator is None:
        log.warn(f"{loaded.name}: not planned: topology.accelerator names no GPU (`kiln plan {loaded.name} --gpu G`)")
        return [], []
    try:
        plan = plan_recipe(loaded)
    except KilnError as exc:
        return [exc.message.splitlines()[0]], []
    if not plan.fits:
        return [], [f"{loaded.where('topology')}: topology: {verdict(plan)}"]
    return [], []


def _check_one(
    recipe: ResolvedRecipe | list[str], platform: str | None = None
) -> tuple[list[str], LaunchCheck, list[str]]:
    """(recipe problems, launch-command problems the engine's code found, plan problems)."""
    if isinstance(recipe, list):
        return recipe, LaunchCheck([], None), []
    loaded, name = recipe.loaded, recipe.name
    problems: list[str] = []
    for feature in loaded.recipe.features:
        if not (loaded.feature_dir(feature) / "override.yaml").is_file():
            problems.append(
                f"{loaded.where('experimental')}: experimental: {feature}: no "
                f"experimental/{feature}/override.yaml next to the recipe"
            )
    # every shipped override, switched on or not: one that is off today is on tomorrow
    for fdir in sorted(p for p in (loaded.dir / "experimental").glob("*") if (p / "override.yaml").is_file()):
        try:
            override = load_override(fdir)
        except RecipeInvalid as exc:
            problems += exc.problems
            continue
        version = loaded.recipe.engine.version
        patches = override.override.patches  # set whenever the override is versioned
        if patches and override.versioned and not override.supports(version):
            have = ", ".join(override.series_versions())
            problems.append(
                f"{override.where('patches')}: patches: {_rel(override.dir / patches)}/ has no series for "
                f"{override.override.engine.name}=={version} (it has: {have}; port it: kiln patches checkout "
                f"--feature {name}/{fdir.name} --engine {version} --series-from {override.series_versions()[-1]})"
            )
        elif not override.versioned and override.override.engine.version != version:
            problems.append(
                f"{override.where('engine', 'version')}: engine.version: {fdir.name} targets "
                f"{override.override.engine.name}=={override.override.engine.version}, recipe pins "
                f"{version} (kiln override rebase {name} {fdir.name} --from "
                f"{override.override.engine.version})"
            )
    problems += feature_problems(loaded)
    problems += _lock(loaded)
    facts = recipe_facts.problems(loaded)  # before the fit: a shape that cannot route is not "too big"
    unplanned, too_big = _plan_problems(loaded) if not facts else ([], [])
    return problems + facts + unplanned, _launch_args(recipe, platform), too_big


def _lock(loaded: LoadedRecipe) -> list[str]:
    """The engine lock still matches the engine wheel (read from the cache, no download),
    and the recipe's own lock its build.python_packages and engine."""
    e = loaded.recipe.engine
    return [
        *lock_policy.lock_problems(
            engine_lock.engine_image_dir(e.flavour),
            e.name,
            e.version,
            e.flavour,
            wheel_cache.cached_engine_wheel(e.version, e.flavour),
            loaded.name,
        ),
        *recipe_lock.problems(loaded),
        *lock_policy.pin_problems(loaded),
    ]


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(repo_root()))
    except ValueError:
        return str(path)


def _series_used(recipe: ResolvedRecipe) -> list[SeriesUsed]:
    """Which patch series a valid recipe's image applies, in order."""
    return [
        SeriesUsed(applies=what, file=_rel(file) if file else None, patches=count)
        for what, file, count in recipe_series(recipe)
    ]


def _launch_args(recipe: ResolvedRecipe, platform: str | None) -> LaunchCheck:
    """The launch command (flags, values, feature knobs) checked by the engine's own
    parser and kiln-engine: the engine image for `platform` (None: the host's; another
    architecture's parser runs under qemu), else the parser environment of its pin."""
    return check_launch(recipe, platform=platform)


def check(name: str | None, *, all_recipes: bool, as_json: bool = False, platform: str | None = None) -> int:
    if not name and not all_recipes:
        all_recipes = True
    given: ResolvedRecipe | None = None  # --platform's one recipe, resolved before anything else
    if platform is not None:
        if all_recipes or not name:
            raise UsageError("kiln check --platform: name one recipe (its engine image for that platform is asked)")
        given = resolve_recipe(name)
        check_platform(given.loaded, platform)
    problems: list[str] = []
    platform_only = True  # every problem is a declared platform without wheels: exit 100
    launch_only = True  # every problem is one the engine found: exit 17, as `kiln build`
    plan_only = True  # every problem is a recipe that does not fit its GPUs: exit 92, as `kiln plan`
    names = _recipe_names(name, all_recipes)
    report: list[RecipeCheck] = []
    for recipe in names:
        resolved = given or _resolve(recipe)  # once per recipe: every check below takes it
        recipe_problems, launch, plan_problems = _check_one(resolved, platform)
        launch_problems = launch.problems
        platform_problems = _platform_problems_of(resolved) if not recipe_problems else []
        found = recipe_problems + launch_problems + plan_problems + platform_problems
        platform_only = platform_only and not recipe_problems and not launch_problems and not plan_problems
        launch_only = launch_only and not recipe_problems and not plan_problems and not platform_problems
        plan_only = plan_only and not recipe_problems and not launch_problems and not platform_problems
        entry = RecipeCheck(name=recipe, valid=not found, problems=found, launch_checked_by=launch.checked_by)
        if found or isinstance(resolved, list):
            problems += found
        else:
            entry["series"] = _series_used(resolved)
            log.ok(f"{recipe}")
        report.append(entry)
    if as_json:
        log.emit_json(CheckDocument(valid=not problems, recipes=report))
    if problems:
        if platform_only:
            raise PlatformUnsupported(problems)
        if plan_only:
            raise PlanDoesNotFit(problems)
        raise LaunchArgInvalid(problems) if launch_only else RecipeInvalid(problems)
    for entry in report:  # after the verdict: error output stays one line per problem
        log.info(f"{entry['name']} applies:")
        for s in entry["series"]:
            log.info(f"  {s['applies']}: {s['file'] or 'no series'} ({s['patches']} patch(es))")
    log.info(f"{len(names)} recipe(s) valid")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    return check(args.name, all_recipes=args.all, as_json=args.json, platform=args.platform)


def register(sub: Subparsers) -> None:
    s = reports(sub.add_parser("check", help="validate recipes without building"))
    s.add_argument("name", nargs="?")
    s.add_argument("--all", action="store_true")
    s.add_argument(
        "--platform",
        choices=sorted(engine_lock.PLATFORMS),
        default=None,
        help="ask this platform's engine image (of engine.platforms) for the launch check "
        "(default: the host's; another architecture's runs under qemu)",
    )
    s.set_defaults(func=_cmd_check)
