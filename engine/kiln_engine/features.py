"""The engine features kiln ships, and how each is switched on.

A feature is off unless its environment switch is set ("1", "true", "on", "yes").
Recipes switch features on through their launch env (`experimental:` overlays set it);
users can turn one off per container with `docker run -e KILN_DRAFT_TRUNC=0`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

_TRUE = {"1", "true", "on", "yes"}


@dataclass(frozen=True)
class Feature:
    name: str
    env: str
    module: str  # our implementation
    vllm_module: str  # where patched vLLM code imports it from

    def enabled(self, environ=None) -> bool:
        return (environ if environ is not None else os.environ).get(self.env, "").strip().lower() in _TRUE


FEATURES: tuple[Feature, ...] = (
    Feature(
        name="draft-trunc",
        env="KILN_DRAFT_TRUNC",
        module="kiln_engine.draft_trunc",
        vllm_module="vllm.v1.worker.gpu.spec_decode.draft_trunc",
    ),
)


def by_name(name: str) -> Feature:
    for feature in FEATURES:
        if feature.name == name:
            return feature
    raise KeyError(name)


def states(environ=None) -> dict[str, bool]:
    return {f.name: f.enabled(environ) for f in FEATURES}


class UnsafeConfiguration(RuntimeError):
    """A feature combination that would produce wrong tokens: refuse to start."""


def check_environment(environ=None) -> None:
    """Refuse combinations we can see from the environment alone, at plugin load."""
    environ = environ if environ is not None else os.environ
    if by_name("draft-trunc").enabled(environ):
        skip = environ.get("VLLM_MOE_SKIP_PADDING", "1").strip().lower()
        if skip not in _TRUE:
            raise UnsafeConfiguration(
                "kiln-engine: KILN_DRAFT_TRUNC=1 needs VLLM_MOE_SKIP_PADDING=1 (dead draft tokens are "
                "skipped through the MoE padding mask); set it or turn draft-trunc off"
            )
        # vLLM reads this variable as bool(int(value))
        runner = environ.get("VLLM_USE_V2_MODEL_RUNNER", "").strip()
        if runner.lstrip("+-").isdigit() and int(runner) == 0:
            raise UnsafeConfiguration(
                f"kiln-engine: KILN_DRAFT_TRUNC=1 needs Model Runner V2, but "
                f"VLLM_USE_V2_MODEL_RUNNER={runner} selects the V1 runner, which has no "
                "draft-trunc hooks; unset it or turn draft-trunc off"
            )
