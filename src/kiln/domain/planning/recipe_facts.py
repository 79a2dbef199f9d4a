"""A recipe's facts checked against each other, before any build and before the fit.

Each rule is one that vLLM, the build or kiln's own launch command would enforce later
(at server start, after the weights load; at the end of a build; silently at run time),
said at `kiln check` with the reason they would give, at the line of the field:

- a draft model whose vocabulary is not its target's (vLLM refuses it at start);
- a target that cannot route: more experts per token than routed experts, or a
  tensor-parallel size that does not divide the attention heads (vLLM's own message);
- `max-model-len` above the model's `max_position_embeddings` (vLLM refuses it unless
  VLLM_ALLOW_LONG_MAX_MODEL_LEN is set);
- a `served:` record that names no file of the checkout;
- a `launch.env` variable that kiln sets itself (KILN_FEATURES from `experimental:`;
  HF_HUB_CACHE, where kiln mounts the Hugging Face cache for a `source: hf` model),
  naming the field that controls it.

The shapes are the ones the planner reads (config.json when at hand, else the recipe's
`shape:` block); a model with neither is not checked here (`kiln plan` says so).
"""

from __future__ import annotations

import re
from typing import Any

from kiln.basics.errors import KilnError
from kiln.basics.paths import repo_root
from kiln.domain.planning.model_shape import model_config
from kiln.domain.recipes.recipe import LoadedRecipe
from kiln.domain.recipes.recipe_sections import ModelSource
from kiln.domain.recipes.topology import effective

_ROUTED = ("n_routed_experts", "num_experts", "num_local_experts")
_PER_TOKEN = ("num_experts_per_tok", "experts_per_token", "moe_topk")
# launch.env names kiln's launch command sets after the recipe's env, and the field that
# sets them: a recipe's value would be overwritten without a word
_KILN_SETS = {"KILN_FEATURES": "experimental"}
_SUFFIX = {"k": 1_000, "m": 1_000_000, "g": 1_000_000_000}


class _Config:
    """One model's config as the planner reads it, with the line each key comes from."""

    def __init__(self, loaded: LoadedRecipe, role: str, src: ModelSource, data: dict[str, Any]) -> None:
        self.loaded, self.role, self.src = loaded, role, src
        text = data.get("text_config")
        self.data: dict[str, Any] = {**data, **text} if isinstance(text, dict) else data

    def int_of(self, *names: str) -> tuple[str, int] | None:
        """The first of `names` the config holds as a whole number, with its name."""
        for name in names:
            value = self.data.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                return name, value
        return None

    def where(self, key: str) -> str:
        shape = self.src.shape
        if shape is not None and key in shape.config:
            return self.loaded.where("model", self.role, "shape", "config", key)
        return self.loaded.where("model", self.role)

    def field(self, key: str) -> str:
        shape = self.src.shape
        return (
            f"model.{self.role}.shape.config.{key}"
            if shape is not None and key in shape.config
            else f"model.{self.role}"
        )


def _config(loaded: LoadedRecipe, role: str, src: ModelSource | None) -> _Config | None:
    if src is None:
        return None
    try:
        data, _where = model_config(loaded, role, src)
    except KilnError:
        return None  # no shape at hand: `kiln plan` says so, not this
    return _Config(loaded, role, src, data)


def _vocab(target: _Config, draft: _Config | None) -> list[str]:
    spec = target.loaded.recipe.launch.speculative_config or {}
    if draft is None or spec.get("method") not in (None, "draft_model"):
        return []
    mine, theirs = draft.int_of("vocab_size"), target.int_of("vocab_size")
    if mine is None or theirs is None or mine[1] == theirs[1]:
        return []
    line = (
        f"{draft.where('vocab_size')}: {draft.field('vocab_size')}: vocab_size {mine[1]} is not the target's "
        f"{theirs[1]}: vLLM refuses a draft model whose vocabulary differs from its target's at start"
    )
    return [line]


def _routing(target: _Config) -> list[str]:
    out = []
    routed, per_token = target.int_of(*_ROUTED), target.int_of(*_PER_TOKEN)
    if routed is not None and per_token is not None and per_token[1] > routed[1]:
        out.append(
            f"{target.where(per_token[0])}: {target.field(per_token[0])}: {per_token[0]} {per_token[1]} is above "
            f"{routed[0]} {routed[1]}: the router cannot pick more experts per token than the model has"
        )
    heads = target.int_of("num_attention_heads")
    loaded = target.loaded
    tp = effective(loaded.recipe).tensor_parallel
    if heads is not None and tp > 1 and heads[1] % tp:
        where = (
            loaded.where("topology", "tensor_parallel")
            if loaded.recipe.topology is not None
            else loaded.where("launch", "args")
        )
        out.append(
            f"{where}: tensor_parallel: vLLM: Total number of attention heads ({heads[1]}) must be divisible by "
            f"tensor parallel size ({tp}) ({target.field('num_attention_heads')})"
        )
    return out


def _length(value: object) -> int | None:
    """vLLM's --max-model-len as a number of tokens (1024, "128k", "1M"); None: unreadable
    here (the engine's parser judges it)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    m = re.fullmatch(r"\s*(\d+)\s*([kmgKMG]?)\s*", value) if isinstance(value, str) else None
    if m is None:
        return None
    return int(m.group(1)) * _SUFFIX.get(m.group(2).lower(), 1)


def _positions(target: _Config) -> list[str]:
    loaded = target.loaded
    args = loaded.recipe.launch.args
    wanted = _length(args.get("max-model-len"))
    positions = target.int_of("max_position_embeddings")
    if wanted is None or positions is None or wanted <= positions[1]:
        return []
    if loaded.recipe.launch.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") == "1":
        return []
    line = (
        f"{loaded.where('launch', 'args', 'max-model-len')}: launch.args.max-model-len: vLLM: User-specified "
        f"max_model_len ({wanted}) is greater than the derived max_model_len (max_position_embeddings="
        f"{positions[1]} at {target.where('max_position_embeddings')})"
    )
    return [line]


def _served(loaded: LoadedRecipe) -> list[str]:
    return [
        f"{loaded.where('served', i, 'record')}: served[{i}].record: {entry.record} is no file of the checkout"
        for i, entry in enumerate(loaded.recipe.served)
        if not (repo_root() / entry.record).is_file()
    ]


def _env(loaded: LoadedRecipe) -> list[str]:
    rec = loaded.recipe
    sets = {
        var: f"from `{field}:` (its value here would be overwritten): set {field} instead"
        for var, field in _KILN_SETS.items()
    }
    hf = [
        role for role, src in (("target", rec.model.target), ("draft", rec.model.draft)) if src and src.source == "hf"
    ]
    if hf:  # kiln mounts the Hugging Face cache and points the server at it
        sets["HF_HUB_CACHE"] = f"for `model.{hf[0]}.source: hf` (the mounted cache, checked before start): drop it"
    return [
        f"{loaded.where('launch', 'env', var)}: launch.env.{var}: kiln sets {var} itself, {why}"
        for var, why in sets.items()
        if var in rec.launch.env
    ]


def problems(loaded: LoadedRecipe) -> list[str]:
    """One `file:line: field: message` per fact of the recipe that contradicts another."""
    model = loaded.recipe.model
    target = _config(loaded, "target", model.target)
    shape: list[str] = []
    if target is not None:
        shape = _routing(target) + _positions(target) + _vocab(target, _config(loaded, "draft", model.draft))
    return shape + _served(loaded) + _env(loaded)
