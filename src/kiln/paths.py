"""Where kiln finds its recipes, engine sources and caches."""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

MARKERS = ("recipes", "docker-images", "engine")


@cache
def repo_root() -> Path:
    """The kiln checkout: $KILN_ROOT, else the nearest parent of cwd holding recipes/,
    docker-images/ and engine/, else the checkout this package was installed from."""
    env = os.environ.get("KILN_ROOT")
    if env:
        return Path(env).resolve()
    here = Path.cwd().resolve()
    for cand in (here, *here.parents):
        if all((cand / m).is_dir() for m in MARKERS):
            return cand
    return Path(__file__).resolve().parents[2]


def recipes_dir() -> Path:
    return repo_root() / "recipes"


def cache_dir() -> Path:
    """User cache: engine wheels, wheelhouses, unpacked engine sources."""
    base = os.environ.get("KILN_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kiln"
    )
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


def results_dir() -> Path:
    """Smoke and publish records (per checkout, ignored by git)."""
    path = Path(os.environ.get("KILN_RESULTS_DIR") or repo_root() / "results")
    path.mkdir(parents=True, exist_ok=True)
    return path
