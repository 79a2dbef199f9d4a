"""Validating everything that can be validated without building (`kiln check`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NotRequired

from pydantic import with_config
from typing_extensions import TypedDict

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
from kiln.domain.imagecheck.launch_checker import LaunchCheck, check_launch
from kiln.domain.images.build_plan import check_platform
from kiln.domain.locks import engine_lock, lock_policy, recipe_lock
from kiln.domain.patching.series import recipe_series
from kiln.domain.planning import recipe_facts
from kiln.domain.planning.model_shape import plan_input
from kiln.domain.planning.moe_tuning import CONFIG_FOLDER, kernel_shape, untuned_line
from kiln.domain.planning.plan import verdict
from kiln.domain.recipes.overrides import load_override
from kiln.domain.recipes.recipe import LoadedRecipe
from kiln.domain.recipes.resolved import ResolvedRecipe, resolve_recipe
from kiln.domain.recipes.topology import feature_problems
from kiln.infra import wheel_cache
from kiln.usecases import progress
from kiln.usecases.plan import plan_recipe


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


def check_one(recipe: ResolvedRecipe) -> list[str]:
    """Problems with one resolved recipe, as one-line messages (empty when it is fine)."""
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
    lock_file = engine_lock.shown(engine_lock.lock_path(engine_lock.engine_image_dir(e.flavour), e.name, e.version))
    problems = []
    for i, plat in enumerate(e.platforms):
        gaps = engine_lock.platform_gaps(lock, plat, e.torch)
        if gaps:
            problems.append(
                f"{loaded.where('engine', 'platforms', i)}: engine.platforms[{i}]: {plat}: {lock_file} "
                f"has no {plat} {', '.join(gaps)}"
            )
    return problems


def _plan_problems(resolved: ResolvedRecipe) -> tuple[list[str], list[str]]:
    """A recipe with a topology: `kiln plan` on its own GPUs (topology.accelerator) must
    fit. (problems planning it, e.g. no shape; the plan's verdict when it does not fit)"""
    loaded = resolved.loaded
    recipe = loaded.recipe
    if recipe.topology is None:
        return [], []
    if recipe.engine.flavour == "cuda" and recipe.topology.accelerator is None:
        progress.warn(
            f"{loaded.name}: not planned: topology.accelerator names no GPU (`kiln plan {loaded.name} --gpu G`)"
        )
        return [], []
    try:
        plan = plan_recipe(resolved)
    except KilnError as exc:
        return [exc.message.splitlines()[0]], []
    if not plan.fits:
        return [], [f"{loaded.where('topology')}: topology: {verdict(plan)}"]
    _warn_untuned_moe(resolved)
    return [], []


def _warn_untuned_moe(resolved: ResolvedRecipe) -> None:
    """One warning line when the pinned vLLM ships no tuned fused-MoE config for the
    recipe's rank on its GPU (read from the engine's cached sources; never downloads)."""
    recipe = resolved.loaded.recipe
    topo = recipe.topology
    if recipe.engine.flavour != "cuda" or topo is None or topo.accelerator is None:
        return
    try:
        shape = plan_input(resolved.loaded).target
    except KilnError:
        return  # the plan above said what is wrong with the shape
    key = kernel_shape(
        shape,
        tensor_parallel=topo.tensor_parallel,
        data_parallel=topo.data_parallel,
        expert_parallel=topo.expert_parallel,
        accelerator=topo.accelerator,
    )
    if key is None:
        return
    root = wheel_cache.cached_sources(recipe.engine.version, "cuda")
    if root is None:
        progress.debug(
            f"{recipe.name}: MoE tuning not checked (vllm {recipe.engine.version}'s CUDA sources not cached)"
        )
        return
    shipped = frozenset(path.name for path in (root / CONFIG_FOLDER).glob("*.json"))
    line = untuned_line(key, shipped, recipe.engine.version)
    if line is not None:
        progress.warn(f"{recipe.name}: {line}")


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
    unplanned, too_big = _plan_problems(recipe) if not facts else ([], [])
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


@dataclass(frozen=True)
class CheckOutcome:
    """What `kiln check` found: its `--json` document, and the error its verdict raises
    (None: every recipe is valid)."""

    document: CheckDocument
    failure: KilnError | None


def check_recipes(names: list[str], *, platform: str | None = None) -> CheckOutcome:
    """The recipes named, each resolved once and checked; `platform` (one recipe only):
    that platform's engine image answers the launch check."""
    given: ResolvedRecipe | None = None  # --platform's one recipe, resolved before anything else
    if platform is not None:
        if len(names) != 1:
            raise UsageError("kiln check --platform: name one recipe (its engine image for that platform is asked)")
        given = resolve_recipe(names[0])
        check_platform(given.loaded, platform)
    problems: list[str] = []
    platform_only = True  # every problem is a declared platform without wheels: exit 100
    launch_only = True  # every problem is one the engine found: exit 17, as `kiln build`
    plan_only = True  # every problem is a recipe that does not fit its GPUs: exit 92, as `kiln plan`
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
            progress.ok(f"{recipe}")
        report.append(entry)
    document = CheckDocument(valid=not problems, recipes=report)
    if not problems:
        return CheckOutcome(document, None)
    if platform_only:
        return CheckOutcome(document, PlatformUnsupported(problems))
    if plan_only:
        return CheckOutcome(document, PlanDoesNotFit(problems))
    return CheckOutcome(document, LaunchArgInvalid(problems) if launch_only else RecipeInvalid(problems))


# the use-case's surface: what a command, or a caller in Python, imports from here
__all__ = ["CheckDocument", "CheckOutcome", "RecipeCheck", "SeriesUsed", "check_one", "check_recipes"]
