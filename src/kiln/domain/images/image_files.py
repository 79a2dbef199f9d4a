"""Files read out of a recipe's built image: the image built from the current inputs,
never an older one, through a throwaway container."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kiln.basics.documents import Shape
from kiln.basics.errors import KilnError
from kiln.domain.images.definitions import local_image_for, resolve
from kiln.infra.docker import DockerDaemon

_MARKER = "KILN-CONFIG"
_READ = "import json\nprint('KILN-CONFIG ' + json.dumps(json.load(open({path!r}))))\n"
_JSON_OBJECT = Shape(dict[str, Any])  # a model's config.json: its keys differ per model family


def _recipe_image_json(recipe: str, path: str, docker: DockerDaemon | None = None) -> tuple[object, str] | None:
    """The JSON object in the file at `path` in `recipe`'s image and where it was read;
    None when no daemon answers, the image is not built from the current inputs, or the
    file is not a JSON object (the caller then falls back to what the recipe says)."""
    try:
        docker = docker or DockerDaemon()
        recipe_image = resolve(recipe).recipe_image
        image = local_image_for(docker, recipe_image.tag, recipe_image.digest)
        if image is None:
            return None
        data = docker.run_script(
            str(image.id),
            _READ.format(path=path),
            marker=_MARKER,
            answer=_JSON_OBJECT,
            timeout_s=120,
            what=f"reading {path} in {recipe_image.tag}",
        )
    except KilnError:
        return None
    return data, f"{path} in {recipe_image.tag}"


def recipe_image_reader(recipe: str, docker: DockerDaemon | None = None) -> Callable[[str], tuple[object, str] | None]:
    """`_recipe_image_json` for one recipe (and daemon): the planner's `ImageJson`."""
    return lambda path: _recipe_image_json(recipe, path, docker)
