"""What vLLM's adaptive verification (`launch.speculative_config.enable_adaptive_verification`)
cannot run with, refused when the recipe is loaded (exit 2, no image needed).

vLLM refuses most of these itself, but only when the server starts on the GPU host
(after the image is built and shipped); kiln says so at the recipe's line first. The
rules are read from vLLM 0.33.0's sources (the wheel), re-written here:

- `VllmConfig._validate_adaptive_verification` (vllm/config/vllm.py): full CUDA graphs
  are required (`enforce_eager` sets cudagraph_mode NONE before the check runs; cudagraph
  modes NONE and PIECEWISE have none), no pipeline parallelism (its cost curves and
  confidences exist on the last PP rank only), no LoRA;
- `VllmConfig._get_v1_model_runner_unsupported_features`: the V1 model runner does not
  support it ("adaptive draft verification"), so `VLLM_USE_V2_MODEL_RUNNER=0` fails;
- it is code of the V2 GPU model runner only (vllm/v1/worker/gpu/spec_decode/
  adaptive_verification.py, first shipped in 0.32.0): an older engine has no such
  field, and the CPU engine never runs that runner or captures CUDA graphs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from packaging.version import Version

from kiln.domain.recipes.topology import Topology, effective

_FIELD = "enable_adaptive_verification"
_FIRST_VERSION = Version("0.32.0")
_AV = f"launch.speculative_config.{_FIELD}"
_NO_FULL_GRAPHS = ("NONE", "PIECEWISE")  # CUDAGraphMode values without full graphs


class _Engine(Protocol):
    @property
    def version(self) -> str: ...

    @property
    def flavour(self) -> str: ...


class _Launch(Protocol):
    @property
    def args(self) -> Mapping[str, Any]: ...

    @property
    def env(self) -> Mapping[str, str]: ...

    @property
    def speculative_config(self) -> Mapping[str, Any] | None: ...


class _Recipe(Protocol):
    @property
    def engine(self) -> _Engine: ...

    @property
    def launch(self) -> _Launch: ...

    @property
    def topology(self) -> Topology | None: ...

    @property
    def features(self) -> list[str]: ...


class _Loaded(Protocol):
    @property
    def recipe(self) -> _Recipe: ...

    def where(self, *loc: Any) -> str: ...


def _engine_problems(loaded: _Loaded) -> list[str]:
    engine = loaded.recipe.engine
    out = []
    if Version(engine.version) < _FIRST_VERSION:
        out.append(
            f"{loaded.where('engine', 'version')}: engine.version: vLLM {engine.version} has no adaptive "
            f"verification (first in {_FIRST_VERSION}), but {_AV} is true: pin {_FIRST_VERSION} or later, "
            "or drop it"
        )
    if engine.flavour == "cpu":
        out.append(
            f"{loaded.where('engine', 'flavour')}: engine.flavour: cpu: vLLM's adaptive verification runs "
            "only in the CUDA (V2 GPU) model runner, with full CUDA graphs, but "
            f"{_AV} is true: drop it on the CPU engine"
        )
    return out


def _graph_problems(loaded: _Loaded) -> list[str]:
    args = loaded.recipe.launch.args
    out = []
    if args.get("enforce-eager") is True:
        out.append(
            f"{loaded.where('launch', 'args', 'enforce-eager')}: launch.args.enforce-eager: vLLM refuses "
            f"adaptive verification without full CUDA graphs, and enforce-eager captures none, but {_AV} "
            "is true: drop one of them"
        )
    compilation = args.get("compilation-config")
    mode = compilation.get("cudagraph_mode") if isinstance(compilation, dict) else None
    if isinstance(mode, str) and mode.upper() in _NO_FULL_GRAPHS:
        out.append(
            f"{loaded.where('launch', 'args', 'compilation-config', 'cudagraph_mode')}: "
            f"launch.args.compilation-config.cudagraph_mode: {mode} has no full CUDA graphs, which vLLM's "
            f"adaptive verification requires ({_AV} is true): use FULL, FULL_DECODE_ONLY or "
            "FULL_AND_PIECEWISE, or drop adaptive verification"
        )
    return out


def _layout_problems(loaded: _Loaded) -> list[str]:
    recipe = loaded.recipe
    args, out = recipe.launch.args, []
    if effective(recipe).pipeline_parallel > 1:
        if recipe.topology is not None:
            where, field = loaded.where("topology", "pipeline_parallel"), "topology.pipeline_parallel"
        else:
            flag = next((f for f in ("pipeline-parallel-size", "pp") if f in args), "pipeline-parallel-size")
            where, field = loaded.where("launch", "args", flag), f"launch.args.{flag}"
        out.append(
            f"{where}: {field}: vLLM refuses adaptive verification with pipeline parallelism (its cost "
            f"curves and confidences exist on the last rank only), but {_AV} is true: use "
            "pipeline_parallel 1 or drop adaptive verification"
        )
    if args.get("enable-lora") is True:
        out.append(
            f"{loaded.where('launch', 'args', 'enable-lora')}: launch.args.enable-lora: vLLM refuses "
            f"adaptive verification with LoRA, but {_AV} is true: drop one of them"
        )
    runner = loaded.recipe.launch.env.get("VLLM_USE_V2_MODEL_RUNNER", "").strip()
    if runner.lstrip("+-").isdigit() and int(runner) == 0:  # vLLM reads it as bool(int(value))
        out.append(
            f"{loaded.where('launch', 'env', 'VLLM_USE_V2_MODEL_RUNNER')}: launch.env."
            f"VLLM_USE_V2_MODEL_RUNNER: {runner} selects the V1 model runner, which vLLM refuses to run "
            f"adaptive verification on, but {_AV} is true: unset it or drop adaptive verification"
        )
    return out


def problems(loaded: _Loaded) -> list[str]:
    """One `file:line: field: message` per setting of the recipe that vLLM's adaptive
    verification cannot run with (none when it is off), at the line of that setting."""
    if (loaded.recipe.launch.speculative_config or {}).get(_FIELD) is not True:
        return []
    return _engine_problems(loaded) + _graph_problems(loaded) + _layout_problems(loaded)
