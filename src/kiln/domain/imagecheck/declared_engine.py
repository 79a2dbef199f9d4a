"""The engine a recipe declares, checked in its built image: the versions it really
carries, and its own parser accepting the recipe's launch args.

Facts come from the image (labels stamped by `engine_stamp` from the built engine, and
the engine's own argument parser via `launch_arg_check`), never from what we assumed when
writing the Dockerfile. `build.py` runs `verify` before tagging: a failure leaves no tag.
"""

from __future__ import annotations

from kiln.basics.errors import EngineMismatch, LaunchArgInvalid
from kiln.domain.imagecheck import launch_arg_check
from kiln.domain.images.image_naming import LABEL_NS
from kiln.domain.recipes.recipe import LoadedRecipe
from kiln.domain.recipes.resolved import ResolvedRecipe
from kiln.infra.docker import DockerDaemon, Image


def _same_release(declared: str, found: str) -> bool:
    # "2.13.0" matches "2.13.0+cpu" / "2.13.0+cu130"; local tags are build variants
    return found == declared or found.split("+", 1)[0] == declared.split("+", 1)[0]


def verify(recipe: ResolvedRecipe, image: Image, docker: DockerDaemon) -> None:
    """Check that the image is the engine the recipe declares: its labels and its launch arguments."""
    verify_labels(recipe.loaded, image)
    _verify_launch_args(recipe, image, docker)


def _verify_launch_args(recipe: ResolvedRecipe, image: Image, docker: DockerDaemon) -> None:
    problems = launch_arg_check.check_image(docker, recipe, image)
    if problems:
        raise LaunchArgInvalid(problems)


def preflight_launch_args(recipe: ResolvedRecipe, engine_image_id: str, docker: DockerDaemon) -> None:
    """The same check against the engine image, before the recipe image is built on it:
    a refused flag, value or feature knob fails in seconds, not after the model is baked
    in. `verify` then reads the cached answer (same engine image, same command line)."""
    problems = launch_arg_check.check_engine_image(docker, recipe, engine_image_id)
    if problems:
        raise LaunchArgInvalid(problems)


def verify_labels(loaded: LoadedRecipe, image: Image) -> None:
    """Check the image's engine labels (version, torch, cuda) against the recipe's engine section."""
    labels = image.labels or {}
    recipe = loaded.recipe
    checks = [
        ("engine.version", recipe.engine.version, labels.get(f"{LABEL_NS}.engine.version"), ("engine", "version")),
        ("engine.torch", recipe.engine.torch, labels.get(f"{LABEL_NS}.engine.torch"), ("engine", "torch")),
        ("engine.cuda", recipe.engine.cuda, labels.get(f"{LABEL_NS}.engine.cuda"), ("engine", "cuda")),
    ]
    # an image the probe stamped lacks a label only when the engine lacks the thing
    # (no CUDA in a CPU torch): a declared CUDA then contradicts it too
    stamped = f"{LABEL_NS}.engine.probe" in labels
    problems = []
    for field, declared, found, loc in checks:
        if declared is None:
            continue
        if found is None:
            if stamped and field != "engine.version":
                problems.append(
                    f"{loaded.where(*loc)}: {field}: recipe declares {declared} but the built engine has none"
                )
            continue
        if not _same_release(declared, found):
            problems.append(
                f"{loaded.where(*loc)}: {field}: recipe declares {declared} but the built engine has {found}"
            )
    if problems:
        raise EngineMismatch("; ".join(problems))
