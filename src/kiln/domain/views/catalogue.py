"""The recipe catalogue as data: the rows of `kiln list` and the resolved document of
`kiln show` (schemas: src/kiln/schemas/list.json, show.json). Printing is the commands'."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NotRequired, TypedDict

from kiln.basics.errors import KilnError
from kiln.basics.paths import recipes_dir
from kiln.domain.images.specs import resolve
from kiln.domain.recipes.recipe import load_recipe, recipe_names
from kiln.domain.serving.launch import launch_document


class EngineNames(TypedDict):
    name: str
    version: str
    flavour: str


class RecipeRow(TypedDict):
    """One row of `kiln list --json` (schemas/list.json): a valid recipe's engine and
    served name, or an invalid one's first problem."""

    name: str
    valid: bool
    engine: NotRequired[EngineNames]
    served_model_name: NotRequired[str]
    problem: NotRequired[str]


class ImageEntry(TypedDict):
    tag: str
    input_digest: str


class PlatformEntry(TypedDict, total=False):
    """A declared platform's image (tag, input_digest), or why it has none (problem)."""

    tag: str
    input_digest: str
    problem: str


class ShowDocument(TypedDict):
    """`kiln show --json` (schemas/show.json)."""

    recipe: dict[str, Any]  # the recipe as loaded, as pydantic dumps it (recipe.yaml's own shape)
    file: str
    input_digest: str
    tag: str
    engine_image: ImageEntry
    platforms: dict[str, PlatformEntry]
    launch: Any  # launch.json as kiln.domain.serving.launch writes it (typed there)


def recipe_rows() -> list[RecipeRow]:
    """One row per recipe folder; an invalid recipe is a row too (with its first problem),
    so one broken recipe does not hide the others."""
    rows: list[RecipeRow] = []
    for name in recipe_names():
        try:
            r = load_recipe(recipes_dir() / name).recipe
            rows.append({"name": r.name, "valid": True, "engine": {"name": r.engine.name, "version": r.engine.version,
                         "flavour": r.engine.flavour}, "served_model_name": r.launch.served_model_name})
        except KilnError as exc:
            rows.append({"name": name, "valid": False, "problem": exc.lines()[0]})
    return rows


def show_document(name: str) -> ShowDocument:
    """One recipe resolved: the recipe as loaded, its input digest, tags and launch command."""
    resolved = resolve(name)
    loaded, engine_image, recipe_image = resolved.loaded, resolved.engine_image, resolved.recipe_image
    return {
        "recipe": loaded.recipe.model_dump(mode="json", by_alias=True),
        "file": str(loaded.file),
        "input_digest": recipe_image.digest,
        "tag": recipe_image.tag,
        "engine_image": {"tag": engine_image.tag, "input_digest": engine_image.digest},
        "platforms": _platforms(name, loaded.recipe.engine.platforms),
        "launch": launch_document(loaded),
    }


def _platforms(name: str, platforms: Sequence[str]) -> dict[str, PlatformEntry]:
    """Per declared platform: its image's tag and input digest (or why it has none)."""
    out: dict[str, PlatformEntry] = {}
    for plat in platforms:
        try:
            image = resolve(name, platform=plat).recipe_image
            out[plat] = {"tag": image.tag, "input_digest": image.digest}
        except KilnError as exc:
            out[plat] = {"problem": exc.lines()[0]}
    return out
