"""A recipe resolved once: `resolve_recipe(name)` turns a recipe name into one immutable
value (the recipe as loaded, its folder, its switched-on features with their overrides
and their series for the pinned engine version), which a command makes once and hands
down, instead of each step loading the recipe and its overrides again.

The features are read when first asked for, not at `resolve_recipe`: a command that
never reads an override (`kiln show`, `kiln plan`) does not fail on a broken one, as
before. The locks are the lock package's (`locks/`, which uses recipes and not the
other way round); the images made from this value read them (`images/definitions.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from kiln.domain.recipes.overrides import LoadedOverride, load_override
from kiln.domain.recipes.recipe import LoadedRecipe, Recipe, load_recipe, recipe_dir
from kiln.domain.recipes.recipe_sections import Engine


@dataclass(frozen=True)
class _ResolvedFeature:
    """A switched-on feature: its override, and the series it applies on the recipe's engine."""

    name: str
    override: LoadedOverride
    series_file: Path | None  # None: no series for the pinned engine version (or none at all)


@dataclass(frozen=True)
class ResolvedRecipe:
    """One recipe, resolved: made by `resolve_recipe`, never changed."""

    loaded: LoadedRecipe

    @property
    def name(self) -> str:
        """The recipe's name."""
        return self.loaded.name

    @property
    def recipe(self) -> Recipe:
        """The recipe as loaded."""
        return self.loaded.recipe

    @property
    def engine(self) -> Engine:
        """The recipe's engine section."""
        return self.loaded.recipe.engine

    @cached_property
    def features(self) -> tuple[_ResolvedFeature, ...]:
        """The switched-on features in the recipe's order, each override loaded once (on
        first use; a broken override raises its RecipeInvalid here, as its loader does)."""
        version = self.engine.version
        out = []
        for name in self.recipe.features:
            override = load_override(self.loaded.feature_dir(name))
            out.append(_ResolvedFeature(name, override, override.series_file_for(version)))
        return tuple(out)


def resolve_recipe(name: str) -> ResolvedRecipe:
    """The recipe called `name`, loaded and validated (RecipeInvalid, with every problem,
    as `load_recipe`; an unknown name as `recipe_dir`)."""
    return ResolvedRecipe(load_recipe(recipe_dir(name)))
