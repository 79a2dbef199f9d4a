"""The recipe schema (`recipes/<name>/recipe.yaml`: its sections are in recipe_sections.py) and its loader.

Strict on purpose: unknown keys are rejected (a typo such as ``serverd_model_name``
would otherwise be silently ignored and the image built wrong), and values are not
coerced (``port: "8000"`` is an error, not a string that happens to work).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Annotated, Any, TypedDict, cast

from pydantic import (
    Field,
)

from kiln.basics.errors import RecipeInvalid
from kiln.basics.paths import recipes_dir
from kiln.basics.sourced_yaml import SourcedYaml
from kiln.domain.recipes import adaptive_verification, draft_bounds, env_policy
from kiln.domain.recipes.feature_registry import declared_ratio, flag_on, unknown_knob_problems
from kiln.domain.recipes.recipe_sections import (
    NAME_PATTERN,
    SHARED_DIR,
    Budgets,
    Build,
    Engine,
    FeatureUse,
    Launch,
    Model,
    Name,
    Publish,
    Served,
    Smoke,
)
from kiln.domain.recipes.topology import Topology
from kiln.domain.recipes.topology import problems as topology_problems
from kiln.domain.recipes.validated_yaml import Strict, display_path, load_validated

_RECIPE_FILE = "recipe.yaml"
DOCKERFILE = "Dockerfile"
# a recipe folder holds a Dockerfile, a few scripts and overlays; walking more than
# this many entries is not a recipe, and it would all go into the build context
_MAX_FILES = 2000


class Recipe(Strict):
    """A recipe.yaml: the model, the engine it runs on, how it launches, builds, is checked and published."""

    name: Name
    description: Annotated[str, Field(min_length=1)]
    engine: Engine
    model: Model
    launch: Launch
    topology: Topology | None = Field(
        None, description="nodes, accelerators per node and the parallel layout; drives the launch flags"
    )
    experimental: list[FeatureUse] = Field(
        default_factory=list,
        description="experimental/<feature>/ overlays switched on; {name, from} uses another recipe's",
    )
    smoke: Smoke
    publish: Publish | None = None
    budgets: Budgets = Field(default_factory=Budgets)
    build: Build = Field(default_factory=Build)
    served: list[Served] = Field(
        default_factory=list,
        description="runs that served this recipe's speculation configuration (kiln show names them)",
    )

    @property
    def features(self) -> list[str]:
        """Names of the switched-on experimental features, wherever their override lives."""
        return [f.name for f in self.experimental]


# `kiln schema`: a JSON Schema (draft 2020-12) document; pydantic writes the rest of its keywords
_RecipeJsonSchema = TypedDict(
    "_RecipeJsonSchema",
    {
        "$schema": str,
        "title": str,
        "type": str,
        "properties": dict[str, Any],
        "required": list[str],
        "additionalProperties": bool,
        "$defs": dict[str, Any],
    },
    total=False,
)


class LoadedRecipe:
    """A validated recipe plus where it lives (its folder holds the Dockerfile and overlays)."""

    def __init__(self, recipe: Recipe, directory: Path, source: SourcedYaml) -> None:
        self.recipe = recipe
        self.dir = directory
        self.source = source

    @property
    def name(self) -> str:
        """The recipe's name."""
        return self.recipe.name

    @property
    def file(self) -> Path:
        """The path of the recipe's recipe.yaml."""
        return self.dir / _RECIPE_FILE

    def line_of(self, *loc: Any) -> int:
        """The line of recipe.yaml a field's key path starts on (1 when not known)."""
        return self.source.line_of(tuple(loc))

    def where(self, *loc: Any) -> str:
        """`path:line` of a field of recipe.yaml, for error lines."""
        return f"{display_path(self.file)}:{self.line_of(*loc)}"

    def shared_file(self, name: str) -> Path:
        """Where a file named in `build.shared` lives: recipes/_shared/<name>."""
        return self.dir.parent / SHARED_DIR / name

    def feature_dir(self, feature: str) -> Path:
        """The override folder of a switched-on feature: experimental/<feature>/ of this
        recipe, or of the recipe named by its `from:` (checked at load)."""
        for entry in self.recipe.experimental:
            if entry.from_ is not None and entry.name == feature:
                return self.dir.parent / entry.from_ / "experimental" / feature
        return self.dir / "experimental" / feature


def _cross_checks(loaded: LoadedRecipe) -> list[str]:
    """Rules that span sections, reported at the line of the field that breaks them."""
    rec = loaded.recipe
    problems = []
    wanted = rec.smoke.served_model_name
    if wanted is not None and wanted != rec.launch.served_model_name:
        problems.append(
            f"{loaded.where('smoke', 'served_model_name')}: smoke.served_model_name: {wanted!r} is not "
            f"served (launch.served_model_name is {rec.launch.served_model_name!r})"
        )
    for feature in rec.smoke.features:
        if feature not in rec.features:
            problems.append(
                f"{loaded.where('smoke', 'features', feature)}: smoke.features.{feature}: "
                f"not switched on (experimental: {rec.features or []})"
            )
    spec = rec.launch.speculative_config or {}
    if spec.get("method") == "draft_model" and "model" not in spec and rec.model.draft is None:
        problems.append(
            f"{loaded.where('launch', 'speculative_config')}: launch.speculative_config: method "
            "draft_model needs model.draft (or a model key here)"
        )
    problems += _av_calibrate_problems(loaded)
    problems += adaptive_verification.problems(loaded)
    problems += unknown_knob_problems(rec.launch.env, loaded.where, ("launch", "env"))
    problems += _smoke_bound_problems(loaded)
    problems += env_policy.problems(
        rec.launch.env, rec.launch.allow_unsafe_env, loaded.where, ("launch", "env"), ("launch", "allow_unsafe_env")
    )
    problems += draft_bounds.problems(rec.launch.speculative_config or {}, rec.launch.args, loaded.where)
    return problems + topology_problems(loaded)


_AV_CALIBRATE = "KILN_DRAFT_TRUNC_AV_CALIBRATE"
_AV = "enable_adaptive_verification"


def _av_calibrate_problems(loaded: LoadedRecipe) -> list[str]:
    """draft-trunc's calibration of vLLM's adaptive verification, asked for without
    adaptive verification: the engine refuses it at start, on the GPU host, after the
    weights load; the recipe says so at load."""
    rec = loaded.recipe
    if not flag_on(rec.launch.env, _AV_CALIBRATE):
        return []
    if (rec.launch.speculative_config or {}).get(_AV) is True:
        return []
    return [
        (
            f"{loaded.where('launch', 'env', _AV_CALIBRATE)}: launch.env.{_AV_CALIBRATE}: corrects vLLM's "
            f"adaptive verification, but launch.speculative_config.{_AV} is not true: set it, or drop the knob"
        )
    ]


def _smoke_bound_problems(loaded: LoadedRecipe) -> list[str]:
    """smoke.features.<feature>.<ratio>: {min, max} that no measurement can meet: a
    min above its max, or a bound of a share (every ratio the engine's registry
    declares) outside [0, 1]. `kiln smoke` would fail them only after a build and a
    served model; the recipe says so at load."""
    problems = []
    for feature, ratios in loaded.recipe.smoke.features.items():
        for ratio, bounds in ratios.items():
            field = f"smoke.features.{feature}.{ratio}"
            loc = ("smoke", "features", feature, ratio)
            if bounds.min is not None and bounds.max is not None and bounds.min > bounds.max:
                problems.append(
                    f"{loaded.where(*loc, 'min')}: {field}: min {bounds.min:g} is above max "
                    f"{bounds.max:g}, so no run can pass: swap them or fix one"
                )
            if not declared_ratio(feature, ratio):
                continue  # an unknown ratio is `kiln smoke`'s to name; nothing says it is a share
            for side, value in (("min", bounds.min), ("max", bounds.max)):
                if value is not None and not 0.0 <= value <= 1.0:  # also refuses NaN
                    problems.append(
                        f"{loaded.where(*loc, side)}: {field}.{side}: {value:g} is outside [0, 1], "
                        f"but {ratio} is a share of {feature}'s counters: use a value in [0, 1]"
                    )
    return problems


def _check_files(loaded: LoadedRecipe) -> list[str]:
    problems = []
    rec = loaded.recipe
    if rec.name != loaded.dir.name:
        problems.append(f"{loaded.where('name')}: name: {rec.name!r} must equal its folder name {loaded.dir.name!r}")
    if not (loaded.dir / DOCKERFILE).is_file():
        problems.append(f"{loaded.where()}: (recipe): missing file {display_path(loaded.dir / DOCKERFILE)}")
    for i, use in enumerate(rec.experimental):
        if use.from_ is not None:
            problems += _shared_feature_problems(loaded, i, use.name, use.from_)
            continue
        feature = use.name
        fdir = loaded.dir / "experimental" / feature
        if not (fdir / "override.yaml").is_file():
            problems.append(
                f"{loaded.where('experimental', i)}: experimental[{i}]: no overlay at "
                f"{display_path(fdir)}/override.yaml"
            )
    problems += _shared_file_problems(loaded)
    names = rec.features
    for i, name in enumerate(names):
        if name in names[:i]:
            problems.append(f"{loaded.where('experimental', i)}: experimental[{i}]: {name!r} is switched on twice")
    return problems


def _shared_file_problems(loaded: LoadedRecipe) -> list[str]:
    """`build.shared`: each file exists in recipes/_shared/, once, and the recipe folder
    holds no file of that name (the context would get two)."""
    problems = []
    names = loaded.recipe.build.shared
    for i, name in enumerate(names):
        where = f"{loaded.where('build', 'shared', i)}: build.shared[{i}]"
        path = loaded.shared_file(name)
        if name in names[:i]:
            problems.append(f"{where}: {name!r} is named twice")
        elif not path.is_file() or path.is_symlink():
            problems.append(f"{where}: no file {display_path(path)}")
        elif (loaded.dir / name).exists():
            problems.append(f"{where}: {display_path(loaded.dir / name)} exists too; keep one of them")
    return problems


def _shared_feature_problems(loaded: LoadedRecipe, index: int, name: str, source: str) -> list[str]:
    """`{name, from: source}`: a sibling recipe (same recipes/ folder) that ships that override."""
    where = f"{loaded.where('experimental', index, 'from')}: experimental[{index}].from"
    root = loaded.dir.parent
    other = root / source
    if source == loaded.recipe.name:
        return [f"{where}: {source!r} is this recipe; write the plain name {name!r} instead"]
    if not (other / _RECIPE_FILE).is_file():
        return [f"{where}: no recipe {source!r} in {display_path(root)}/"]
    fdir = other / "experimental" / name
    try:
        inside = fdir.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):
        inside = False
    if not inside:
        return [f"{where}: {display_path(fdir)} leads outside {display_path(root)}/"]
    if not (fdir / "override.yaml").is_file():
        return [f"{where}: recipe {source!r} has no overlay at {display_path(fdir)}/override.yaml"]
    return []


def _entry_problem(path: Path, root: Path) -> str | None:
    """Why one entry of a recipe folder must not be read (the build context takes them
    all): a symlink leading outside the folder would ship e.g. ~/.docker/config.json."""
    try:
        mode = path.lstat().st_mode
        if stat.S_ISLNK(mode):
            try:
                target = path.resolve(strict=True)
            except (OSError, RuntimeError):
                return "broken or looping symlink"
            if not target.is_relative_to(root):
                return f"symlink to {target}, outside the recipe folder"
            mode = target.stat().st_mode
    except OSError as exc:
        return f"cannot read it: {exc.strerror}"
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        return "not a regular file or folder"
    return None


def _tree_problems(directory: Path) -> list[str]:
    """Entries of the recipe folder kiln refuses, one `path:1: (file): why` line each."""
    root = directory.resolve()
    problems: list[str] = []
    count = 0
    for dirpath, dirnames, filenames in os.walk(directory):
        for name in sorted(dirnames + filenames):
            count += 1
            if count > _MAX_FILES:
                return [*problems, f"{display_path(directory)}:1: (recipe): more than {_MAX_FILES} files and folders"]
            path = Path(dirpath, name)
            why = _entry_problem(path, root)
            if why:
                problems.append(f"{display_path(path)}:1: (file): {why}")
    return problems


def load_recipe(directory: Path) -> LoadedRecipe:
    """Load and validate one recipe folder; raise RecipeInvalid with every problem found."""
    refused = _tree_problems(directory)
    if refused:
        raise RecipeInvalid(
            refused, hint="keep every file of a recipe inside its folder; copy it in instead of linking"
        )
    doc = load_validated(directory / _RECIPE_FILE, Recipe, missing_hint="each recipe folder needs a recipe.yaml")
    loaded = LoadedRecipe(doc.value, directory, doc.source)
    problems = _cross_checks(loaded) + _check_files(loaded)
    if problems:
        raise RecipeInvalid(problems)
    return loaded


def recipe_names() -> list[str]:
    """Folders under recipes/ that hold a recipe.yaml, sorted."""
    root = recipes_dir()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / _RECIPE_FILE).is_file())


def recipe_dir(name: str) -> Path:
    """The folder of the recipe called ``name``: a simple name of a folder inside
    recipes/, so `kiln build ../x` or `/etc` cannot reach anything else."""
    root = recipes_dir()
    directory = root / name
    if re.fullmatch(NAME_PATTERN, name) and directory.is_dir():
        if not directory.resolve().is_relative_to(root.resolve()):
            raise RecipeInvalid(
                [
                    (
                        f"{display_path(directory)}:1: (file): symlink to {directory.resolve()}, "
                        f"outside {display_path(root)}/"
                    )
                ],
                hint="move the recipe folder into recipes/ instead of linking it",
            )
        return directory
    known = recipe_names()
    if name in known:  # listed by `kiln check --all`, but no name a recipe can have
        raise RecipeInvalid([f"{display_path(directory)}:1: (file): folder name must match {NAME_PATTERN}"])
    shown = ", ".join(known[:20]) + (", ..." if len(known) > 20 else "") if known else "none"
    what = "no recipe named {!r} in {}/" if re.fullmatch(NAME_PATTERN, name) else "{!r} is not a recipe name in {}/"
    raise RecipeInvalid(
        [f"{what.format(name, display_path(root))} (known: {shown})"],
        hint="`kiln list` shows the recipes; a recipe is a folder recipes/NAME/ holding a recipe.yaml",
    )


def json_schema() -> _RecipeJsonSchema:
    """The JSON Schema of recipe.yaml, as pydantic derives it from the model, with its `$schema` and title."""
    schema = Recipe.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "kiln recipe.yaml"
    return cast("_RecipeJsonSchema", schema)  # pydantic's JSON Schema, with the two keys set above
