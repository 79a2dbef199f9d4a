"""A recipe resolved once (domain/recipes/resolved.py): one immutable value, the loader's
errors unchanged, the overrides read only when a step asks for them."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
from kilntest import REPO

from kiln.basics import paths
from kiln.basics.errors import RecipeInvalid
from kiln.domain.recipes.overrides import load_override
from kiln.domain.recipes.recipe import load_recipe, recipe_dir
from kiln.domain.recipes.resolved import resolve_recipe

NAME = "glm53-kindling"  # a recipe with switched-on features


@pytest.fixture
def recipes(tmp_path, monkeypatch) -> Path:
    """A checkout whose recipes/ is a copy (to edit); the rest is the real one."""
    shutil.copytree(REPO / "recipes", tmp_path / "recipes", ignore=shutil.ignore_patterns("__pycache__"))
    for shared in ("docker-images", "engine", "patches"):
        (tmp_path / shared).symlink_to(REPO / shared)
    monkeypatch.setenv("KILN_ROOT", str(tmp_path))
    paths.repo_root.cache_clear()
    yield tmp_path / "recipes"
    paths.repo_root.cache_clear()


def test_the_resolved_recipe_is_one_immutable_value_with_its_features_and_their_series():
    resolved = resolve_recipe(NAME)
    with pytest.raises(dataclasses.FrozenInstanceError):
        resolved.loaded = load_recipe(recipe_dir(NAME))  # type: ignore[misc]
    assert resolved.name == NAME and resolved.engine == resolved.loaded.recipe.engine
    features = resolved.features
    assert isinstance(features, tuple) and [f.name for f in features] == resolved.recipe.features
    assert resolved.features is features  # read once
    for feature in features:
        with pytest.raises(dataclasses.FrozenInstanceError):
            feature.series_file = None  # type: ignore[misc]
        override = load_override(resolved.loaded.feature_dir(feature.name))
        assert feature.override.dir == override.dir
        assert feature.series_file == override.series_file_for(resolved.engine.version)


def test_a_bad_recipe_gives_the_loaders_error_and_exit_code(recipes):
    rfile = recipes / NAME / "recipe.yaml"
    rfile.write_text(rfile.read_text().replace("launch:", "launch:\n  no_such_field: 1", 1))
    with pytest.raises(RecipeInvalid) as old:
        load_recipe(recipe_dir(NAME))
    with pytest.raises(RecipeInvalid) as new:
        resolve_recipe(NAME)
    assert new.value.problems == old.value.problems and new.value.exit_code == old.value.exit_code == 2
    with pytest.raises(RecipeInvalid) as unknown:
        resolve_recipe("no-such-recipe")
    with pytest.raises(RecipeInvalid) as before:
        recipe_dir("no-such-recipe")
    assert str(unknown.value) == str(before.value)


def test_a_broken_override_fails_only_where_the_features_are_read(recipes):
    resolved_ok = resolve_recipe(NAME)
    feature = resolved_ok.recipe.features[0]
    ofile = resolved_ok.loaded.feature_dir(feature) / "override.yaml"
    ofile.write_text(ofile.read_text() + "\nno_such_field: 1\n")
    resolved = resolve_recipe(NAME)  # the recipe itself still loads, as before (kiln show, kiln plan)
    with pytest.raises(RecipeInvalid) as exc:
        _ = resolved.features
    with pytest.raises(RecipeInvalid) as old:
        load_override(ofile.parent)
    assert exc.value.problems == old.value.problems
