"""The engine's feature registry (engine/kiln_engine/features.py), for the harness.

kiln-engine is installed next to kiln in a development checkout (`pip install -e
engine`); without it the registry is loaded from the checkout's engine/ folder, the
very file kiln bakes into every engine image. The registry module is standard-library
only, so loading it never pulls torch, triton or vLLM.
"""

from __future__ import annotations

import difflib
import importlib.util
import sys
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from types import ModuleType
from typing import TYPE_CHECKING

from kiln.basics.paths import repo_root

if TYPE_CHECKING:  # the class only: at run time the registry may be the checkout's file
    from kiln_engine.features import Feature

_MODULE = "kiln_engine.features"


@cache
def registry() -> ModuleType:
    """The engine's feature registry module (kiln_engine.features), from engine/ when kiln_engine is not installed."""
    try:
        from kiln_engine import features  # late: optional on the host (file fallback)
    except ImportError:
        path = repo_root() / "engine" / "kiln_engine" / "features.py"
        spec = importlib.util.spec_from_file_location("_kiln_feature_registry", path)
        if spec is None or spec.loader is None:  # only for a path that is no Python source
            raise ImportError(f"cannot load the engine's feature registry from {path}") from None
        features = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = features  # dataclasses resolve their module by name
        spec.loader.exec_module(features)
    return features


def engine_features(names: Iterable[str]) -> list[Feature]:
    """The registered engine features among `names` (recipe features without engine
    code, e.g. a pure replacement override, have no entry and are skipped)."""
    known = {f.name: f for f in registry().FEATURES}
    return [known[n] for n in names if n in known]


def flag_on(env: Mapping[str, str], var: str) -> bool:
    """Whether the engine flag knob `var` is on in `env`, by the knob's own parser
    (its default when unset); a value the parser refuses counts as off here: the
    engine's own check (`kiln check` in the image, the plugin at start) names it."""
    knob = next(k for f in registry().FEATURES for k in (f.switch, *f.knobs) if k.env == var)
    try:
        return bool(knob.parse(env.get(var)))
    except ValueError:
        return False


def _knob_names(feature: Feature) -> list[str]:
    return [k.env for k in (feature.switch, *feature.knobs)]


def unknown_knob_problems(env: Mapping[str, str], where: Callable[..., str], env_loc: tuple[str, ...]) -> list[str]:
    """One `file:line: field: message` per variable of `env` under a registered
    feature's prefix (`KILN_DRAFT_TRUNC_`) that is none of that feature's knobs: the
    engine reads only the knobs the registry declares, so a misspelt one (the typo
    `KILN_DRAFT_TRUNC_EXPLOR`) would be ignored without a word. `where(*loc)` gives
    `file:line`, env_loc is the path of the env mapping in the file."""
    field = ".".join(env_loc)
    out = []
    for feature in registry().FEATURES:
        known, prefix = _knob_names(feature), f"{feature.env}_"
        for name in env:
            if not name.startswith(prefix) or name in known:
                continue
            # what follows the shared prefix is compared: against whole names, any
            # KILN_DRAFT_TRUNC_* would look close to every knob
            tails = {k.removeprefix(prefix): k for k in known if k.startswith(prefix)}
            near = difflib.get_close_matches(name.removeprefix(prefix), list(tails), n=1, cutoff=0.6)
            guess = f"did you mean {tails[near[0]]}?" if near else f"its knobs: {', '.join(known)}"
            out.append(
                f"{where(*env_loc, name)}: {field}.{name}: kiln-engine's {feature.name} has no knob "
                f"{name} ({guess}); the engine would ignore it: fix the name or drop it"
            )
    return out


def declared_ratio(feature: str, ratio: str) -> bool:
    """Whether the registry declares `ratio` for `feature`. Every declared ratio is a
    share: its numerator counts a subset of what its denominator counts (dead of all
    tokens, kept of proposed, accepted of kept), so it lies in [0, 1]."""
    return any(r.name == ratio for f in registry().FEATURES if f.name == feature for r in f.ratios)
