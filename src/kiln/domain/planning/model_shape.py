"""Where `kiln plan` gets a model's shape.

Its config.json when the weights are at hand (a host_path folder, the Hugging Face
cache snapshot, the built image of a baked model, read by the caller's `_ImageJson`),
else the recipe's `shape:` block with its sources."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kiln.basics.documents import Shape, read_document
from kiln.basics.errors import ModelShapeUnknown
from kiln.basics.paths import host_hf_cache
from kiln.domain.planning.model_config import HfConfig, ModelShape, parse_config
from kiln.domain.planning.plan import PlanInput
from kiln.domain.recipes.recipe import LoadedRecipe
from kiln.domain.recipes.recipe_sections import ModelSource
from kiln.domain.serving.launch_command import launch_document, speculative_config
from kiln.inimage.hf_cache import snapshot_dir

# a path inside the recipe's built image -> (its JSON, where it was read), or None: the
# caller's (kiln.domain.images.image_files), so that planning itself never reaches a daemon
_ImageJson = Callable[[str], "tuple[object, str] | None"]


_HF_CONFIG = Shape(HfConfig)  # a JSON object: its keys are read one by one (model_config.parse_config)


def _from_file(path: Path) -> HfConfig | None:
    """The config.json at `path`; None when there is none; ModelShapeUnknown naming the
    file when it is there but not a JSON object (a plan is never made past it)."""
    if not path.is_file():
        return None
    return read_document(path, _HF_CONFIG, ModelShapeUnknown)


def model_config(
    loaded: LoadedRecipe, role: str, src: ModelSource, *, image_json: _ImageJson | None = None
) -> tuple[HfConfig, str]:
    """(config, where it was read) for one of the recipe's models."""
    if src.source == "host_path" and src.host_path:
        path = Path(src.host_path) / "config.json"
        data = _from_file(path)
        if data is not None:
            return data, str(path)
    if src.source == "hf" and src.repo and src.revision:
        path = snapshot_dir(Path(host_hf_cache()), src.repo, src.revision) / "config.json"
        data = _from_file(path)
        if data is not None:
            return data, str(path)
    if src.source == "baked" and image_json is not None:
        found = image_json(f"{src.path}/config.json")
        if found is not None and isinstance(found[0], dict):
            return found[0], found[1]
    if src.shape is not None:
        return src.shape.as_config(), f"recipe shape ({src.shape.source})"
    where = {
        "host_path": f"{src.host_path}/config.json",
        "hf": f"the cached snapshot of {src.repo}",
        "baked": "the built image",
    }[src.source]
    raise ModelShapeUnknown(
        f"{loaded.where('model', role)}: model.{role}: no config.json at hand ({where}) and no shape: block"
    )


def _model_shape(
    loaded: LoadedRecipe, role: str, src: ModelSource, *, image_json: _ImageJson | None = None
) -> ModelShape:
    config, where = model_config(loaded, role, src, image_json=image_json)
    try:
        return parse_config(config, what=f"model.{role}: ", source=where)
    except ModelShapeUnknown as exc:
        raise ModelShapeUnknown(f"{loaded.where('model', role)}: {exc.message} ({where})") from None


def plan_input(loaded: LoadedRecipe, *, image_json: _ImageJson | None = None) -> PlanInput:
    """What the planner needs of a recipe; `image_json` reads a baked model's config.json
    from its built image (without it, a baked model's shape comes from the recipe)."""
    recipe = loaded.recipe
    draft = recipe.model.draft
    spec = speculative_config(recipe)
    uses_draft = draft is not None and (spec or {}).get("method") == "draft_model"
    target = _model_shape(loaded, "target", recipe.model.target, image_json=image_json)
    draft_shape, notes = None, []
    if uses_draft and draft is not None:
        try:
            draft_shape = _model_shape(loaded, "draft", draft, image_json=image_json)
        except ModelShapeUnknown as exc:  # a small draft: plan the target, and say what is left out
            notes.append(f"the draft model is not counted: {exc.message.split(': ', 2)[-1]}")
    return PlanInput(
        recipe=recipe.name,
        flavour=recipe.engine.flavour,
        engine_version=recipe.engine.version,
        args=dict(recipe.launch.args),
        env=dict(launch_document(loaded)["env"]),
        speculative=spec,
        target=target,
        draft=draft_shape,
        topology=recipe.topology,
        notes=tuple(notes),
    )
