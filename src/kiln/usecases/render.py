"""A recipe's Kubernetes manifests, checked first as `kiln check` checks it, written to a
folder or handed back (`kiln render k8s NAME`); the manifests themselves are built in
kiln.domain.serving.k8s (what they contain and why is documented there)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from kiln.basics.errors import RecipeInvalid
from kiln.domain.images.definitions import resolve
from kiln.domain.publishing.publish_records import published_image
from kiln.domain.recipes.resolved import ResolvedRecipe
from kiln.domain.serving.k8s import HF_CACHE_PVC, dump, manifests
from kiln.usecases import progress
from kiln.usecases.check import check_one

# why a recipe `kiln check` refuses is not rendered
RENDER_HINT = "`kiln render` renders only recipes that `kiln check` accepts"


@dataclass(frozen=True)
class Rendered:
    """The manifests rendered as one YAML stream, the image they run, and the files
    written (none when no folder was given)."""

    text: str
    image: str
    written: list[Path]


def render_k8s(
    recipe: ResolvedRecipe, *, out_dir: Path | None, image: str | None, replicas: int, hf_pvc: str = HF_CACHE_PVC
) -> Rendered:
    """Check the recipe as `kiln check` does, then render its manifests (written to
    `out_dir`, one YAML file per object, when given)."""
    problems = check_one(recipe)
    if problems:
        raise RecipeInvalid(problems, hint=RENDER_HINT)
    name = recipe.name
    resolved = resolve(recipe)
    loaded, recipe_image = resolved.loaded, resolved.recipe_image
    if image is None:
        image = published_image(name, recipe_image.digest)
    elif "@sha256:" not in image:
        progress.warn(f"--image {image} is not pinned by digest: nodes may pull different images")
    objects = manifests(loaded, image, replicas=replicas, hf_pvc=hf_pvc)
    if out_dir is None:
        return Rendered(dump(objects), image, [])
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for obj in objects:
        path = out_dir / f"{name}-{obj['kind'].lower()}.yaml"
        path.write_text(yaml.safe_dump(obj, sort_keys=False, default_flow_style=False))
        written.append(path)
    return Rendered(dump(objects), image, written)


# the use-case's surface: what a command, or a caller in Python, imports from here
__all__ = ["RENDER_HINT", "Rendered", "render_k8s"]
