"""Fixtures for the CUDA engine / glm53-kindling tests (no GPU needed)."""

from __future__ import annotations

import os

import pytest

NAME = "glm53-kindling"


@pytest.fixture(scope="session")
def glm():
    from kiln.basics.paths import recipes_dir
    from kiln.domain.recipes.recipe import load_recipe

    return load_recipe(recipes_dir() / NAME)


@pytest.fixture(scope="session")
def cuda_build_enabled():
    if os.environ.get("KILN_CUDA_TESTS") != "1":
        pytest.skip("set KILN_CUDA_TESTS=1 to build the CUDA engine image (multi-GB download)")
