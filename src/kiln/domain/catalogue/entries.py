"""The recipe catalogue as data: the rows of `kiln list` and the resolved document of
`kiln show` (schemas: src/kiln/schemas/list.json, show.json). Printing is the commands'."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import Field, with_config
from typing_extensions import TypedDict

from kiln.basics.errors import KilnError
from kiln.basics.json_types import CLOSED, DESCRIBED, Sha256
from kiln.basics.paths import recipes_dir
from kiln.domain.images.definitions import resolve
from kiln.domain.recipes.recipe import load_recipe, recipe_names
from kiln.domain.recipes.resolved import ResolvedRecipe
from kiln.domain.serving.launch_command import LaunchDocument, launch_document


class EngineNames(TypedDict):
    """The engine a recipe pins (recipe.yaml's engine)."""

    name: str
    version: str
    flavour: Literal["cpu", "cuda"]


class ValidRow(TypedDict):
    """One row of `kiln list --json` (schemas/list.json): a valid recipe's engine and served name."""

    name: str
    valid: Literal[True]
    engine: EngineNames
    served_model_name: str


class InvalidRow(TypedDict):
    """One row of `kiln list --json` (schemas/list.json): an invalid recipe's first problem."""

    name: str
    valid: Literal[False]
    problem: str


_RecipeRow = ValidRow | InvalidRow


class ListDocument(TypedDict):
    """`kiln list --json` (src/kiln/schemas/list.json): every recipe, valid or not."""

    recipes: list[_RecipeRow]


class ImageEntry(TypedDict):
    """An image's tag and input digest."""

    tag: str
    input_digest: Sha256


@with_config(CLOSED)
class PlatformEntry(TypedDict, total=False):
    """A declared platform's image (tag, input_digest), or why it has none (problem)."""

    tag: str
    input_digest: Sha256
    problem: str


@with_config(DESCRIBED)
class ShowDocument(TypedDict):
    """`kiln show --json` (src/kiln/schemas/show.json): one recipe resolved."""

    recipe: Annotated[dict[str, Any], Field(json_schema_extra={"required": ["name", "engine", "launch"]})]
    """The recipe as loaded, defaults filled in (recipe.yaml's shape, which `kiln schema` describes)."""
    file: str
    input_digest: Sha256
    tag: str
    engine_image: ImageEntry
    platforms: dict[str, PlatformEntry]
    """Each of engine.platforms: its recipe image, or why it has none."""
    launch: LaunchDocument


def recipe_rows() -> list[_RecipeRow]:
    """One row per recipe folder; an invalid recipe is a row too (with its first problem),
    so one broken recipe does not hide the others."""
    rows: list[_RecipeRow] = []
    for name in recipe_names():
        try:
            r = load_recipe(recipes_dir() / name).recipe
            rows.append(
                {
                    "name": r.name,
                    "valid": True,
                    "engine": {"name": r.engine.name, "version": r.engine.version, "flavour": r.engine.flavour},
                    "served_model_name": r.launch.served_model_name,
                }
            )
        except KilnError as exc:
            rows.append({"name": name, "valid": False, "problem": exc.lines()[0]})
    return rows


def show_document(recipe: ResolvedRecipe) -> ShowDocument:
    """One recipe resolved: the recipe as loaded, its input digest, tags and launch command."""
    resolved = resolve(recipe)
    loaded, engine_image, recipe_image = resolved.loaded, resolved.engine_image, resolved.recipe_image
    return {
        "recipe": loaded.recipe.model_dump(mode="json", by_alias=True),
        "file": str(loaded.file),
        "input_digest": recipe_image.digest,
        "tag": recipe_image.tag,
        "engine_image": {"tag": engine_image.tag, "input_digest": engine_image.digest},
        "platforms": _platforms(recipe, loaded.recipe.engine.platforms),
        "launch": launch_document(recipe),
    }


def _platforms(recipe: ResolvedRecipe, platforms: Sequence[str]) -> dict[str, PlatformEntry]:
    """Per declared platform: its image's tag and input digest (or why it has none)."""
    out: dict[str, PlatformEntry] = {}
    for plat in platforms:
        try:
            image = resolve(recipe, platform=plat).recipe_image
            out[plat] = {"tag": image.tag, "input_digest": image.digest}
        except KilnError as exc:
            out[plat] = {"problem": exc.lines()[0]}
    return out
