"""Checks that a built image really carries the engine its recipe declares.

Facts come from the image (labels stamped from a probe of the built engine), never
from what we assumed when writing the Dockerfile.
"""

from __future__ import annotations

from .errors import EngineMismatch
from .images import LABEL_NS
from .recipe import LoadedRecipe


def _same_release(declared: str, found: str) -> bool:
    # "2.13.0" matches "2.13.0+cpu" / "2.13.0+cu130"; local tags are build variants
    return found == declared or found.split("+", 1)[0] == declared.split("+", 1)[0]


def verify(loaded: LoadedRecipe, image) -> None:
    labels = image.labels or {}
    recipe = loaded.recipe
    checks = [
        ("engine.version", recipe.engine.version, labels.get(f"{LABEL_NS}.engine.version"), ("engine", "version")),
        ("engine.torch", recipe.engine.torch, labels.get(f"{LABEL_NS}.engine.torch"), ("engine", "torch")),
        ("engine.cuda", recipe.engine.cuda, labels.get(f"{LABEL_NS}.engine.cuda"), ("engine", "cuda")),
    ]
    problems = []
    for field, declared, found, loc in checks:
        if declared is None or found is None:
            continue
        if not _same_release(declared, found):
            problems.append(f"{loaded.where(*loc)}: {field}: recipe declares {declared} but the built engine has {found}")
    if problems:
        raise EngineMismatch("; ".join(problems))
