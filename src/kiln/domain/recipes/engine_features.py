"""The engine's feature registry (engine/kiln_engine/features.py), for the harness.

kiln-engine is installed next to kiln in a development checkout (`pip install -e
engine`); without it the registry is loaded from the checkout's engine/ folder, the
very file kiln bakes into every engine image. The registry module is standard-library
only, so loading it never pulls torch, triton or vLLM.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterable, Mapping
from functools import cache
from types import ModuleType
from typing import TYPE_CHECKING

from kiln.basics.paths import repo_root

if TYPE_CHECKING:  # the class only: at run time the registry may be the checkout's file
    from kiln_engine.features import Feature

_MODULE = "kiln_engine.features"


@cache
def registry() -> ModuleType:
    try:
        import kiln_engine.features as features  # late: optional on the host (file fallback)
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
