"""`kiln check`: validate everything that can be validated without building."""

from __future__ import annotations

from . import log
from .errors import KilnError, RecipeInvalid
from .recipe import load_recipe, recipe_dir, recipe_names


def _recipe_names(name: str | None, all_recipes: bool) -> list[str]:
    if name and not all_recipes:
        recipe_dir(name)  # an unknown name is no recipe problem: say so with its own hint
        return [name]
    return recipe_names()


def check_one(name: str) -> list[str]:
    """Problems with one recipe, as one-line messages (empty when it is fine)."""
    from .overrides import load_override

    try:
        loaded = load_recipe(recipe_dir(name))
    except RecipeInvalid as exc:
        return exc.problems
    problems: list[str] = []
    for feature in loaded.recipe.experimental:
        try:
            override = load_override(loaded.dir / "experimental" / feature)
        except RecipeInvalid as exc:
            problems += exc.problems
            continue
        if override.override.engine.version != loaded.recipe.engine.version:
            problems.append(
                f"{loaded.where('experimental')}: experimental: {feature} targets "
                f"{override.override.engine.name}=={override.override.engine.version}, recipe pins "
                f"{loaded.recipe.engine.version} (kiln override rebase {name} {feature} --from "
                f"{override.override.engine.version})"
            )
    problems += _launch_args(loaded)
    return problems


def _launch_args(loaded) -> list[str]:
    """Flags checked against the built engine's own parser, when that image exists."""
    try:
        from .argcheck import check_against_engine
    except ModuleNotFoundError:
        return []
    return check_against_engine(loaded, build_if_missing=False)


def check(name: str | None, *, all_recipes: bool) -> int:
    if not name and not all_recipes:
        all_recipes = True
    problems: list[str] = []
    names = _recipe_names(name, all_recipes)
    for recipe in names:
        found = check_one(recipe)
        if found:
            problems += found
        else:
            log.ok(f"{recipe}")
    if problems:
        raise RecipeInvalid(problems)
    log.info(f"{len(names)} recipe(s) valid")
    return 0


__all__ = ["check", "check_one", "KilnError"]
