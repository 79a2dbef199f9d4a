"""The GPU twin's plan: the recipe's own `vllm serve` command for each configuration,
with every change the twin needs listed (prepare.py writes it; runner.py serves it;
scale_plan.py adapts the same command with the scale twin's changes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kiln.domain.recipes.resolved import resolve_recipe
from kiln.domain.serving.launch_command import launch_document

ROOT = Path(__file__).resolve().parents[2]

# -- the plan: the recipe's own command, adapted, per configuration -------------------------
MODELS = "/tmp/kiln-gpu-twin/models"  # where the runner makes them (twin_models.py)
TARGET, DRAFT = f"{MODELS}/tiny-qwen3moe", f"{MODELS}/tiny-qwen3-draft"
# the same target as a Glm4Moe checkpoint with an MTP layer (twin_models.py): the MTP runs
MTP_TARGET = f"{MODELS}/tiny-glm4moe-mtp"
MTP_K = 4  # deepseek-v32-mtp's num_speculative_tokens
_PARSERS = "GLM's chat parsers expect GLM's special tokens; the twin's tokenizer is a 1024-token BPE"
# flag -> (new value, or None to drop it; why)
FLAG_CHANGES: dict[str, tuple[str | None, str]] = {
    "--host": ("127.0.0.1", "loopback only"),
    "--port": ("PORT", "one free port per server (the runner fills it in)"),
    "--tensor-parallel-size": (None, "one GPU"),
    "--pipeline-parallel-size": (None, "one GPU"),
    "--data-parallel-size": (None, "one GPU"),
    "--enable-expert-parallel": (None, "one GPU"),
    "--max-model-len": ("2048", "the twin's models hold 2048 positions"),
    "--gpu-memory-utilization": ("0.08", "nine servers share one GPU"),
    "--tool-call-parser": (None, _PARSERS),
    "--reasoning-parser": (None, _PARSERS),
    "--enable-auto-tool-choice": (None, "goes with --tool-call-parser"),
}
FLAGS_ADDED: dict[str, tuple[str, str]] = {
    "--attention-backend": ("TRITON_ATTN", "FlashAttention's libraries do not travel (the twin's patch 0001)"),
    "--dtype": ("float32", "the CPU twin's dtype, so its numeric-tie rule (top-2 margin < 1e-4) applies"),
    "--kv-cache-memory-bytes": (
        str(2**30),
        "a fixed KV cache skips memory profiling, which servers starting beside it would upset",
    ),
    "--max-num-seqs": ("32", "the largest load measured"),
    "--compilation-config": (
        '{"mode":0,"cudagraph_mode":"FULL_DECODE_ONLY"}',
        (
            "no torch.compile on the device's torch 2.11 (vLLM pins 2.14); full decode "
            "graphs, which adaptive verification needs"
        ),
    ),
}
ENV_CHANGES: dict[str, tuple[str, str]] = {
    "VLLM_USE_V2_MODEL_RUNNER": ("1", "the runner draft-trunc's hooks live in (the image's vLLM picks it too)"),
    "VLLM_USE_FLASHINFER_SAMPLER": ("0", "FlashInfer does not travel"),
    "KILN_GPU_TWIN": ("1", "the twin's patch 0001: vllm_flash_attn imports without its libraries"),
    "KILN_DRAFT_TRUNC_LOG_INTERVAL": ("20", "counters on /metrics within a short run"),
    "KILN_GPU_TWIN_ESTIMATOR_LOG": (
        "1",
        "the twin's patch 0004: adaptive verification's estimator logs its fit after each refit",
    ),
}
SCHEDULE = "num_speculative_tokens_per_batch_size"
AV = "enable_adaptive_verification"


def adapted(
    argv: list[str],
    env: dict[str, str],
    *,
    models: tuple[str, str] = (TARGET, DRAFT),
    tables: tuple[dict, dict, dict] | None = None,
) -> tuple[list[str], dict[str, str], list[dict[str, str]]]:
    """The recipe's `vllm serve` argv and env with a twin's changes, and the list of them:
    `models` (target, draft) and `tables` (flag changes, flags added, env changes) are
    the GPU twin's unless a caller (the scale twin) brings its own."""
    target, draft = models
    flag_changes, flags_added, env_changes = tables or (FLAG_CHANGES, FLAGS_ADDED, ENV_CHANGES)
    changes: list[dict[str, str]] = [{"what": "model", "from": argv[1], "to": target, "why": "the twin's target"}]
    out = ["serve", target]
    i = 2
    while i < len(argv):
        flag = argv[i]
        has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
        value = argv[i + 1] if has_value else ""
        i += 2 if has_value else 1
        if flag == "--speculative-config":
            spec = json.loads(value)
            changes.append(
                {
                    "what": "speculative_config.model",
                    "from": spec.get("model", ""),
                    "to": draft,
                    "why": "the twin's draft",
                }
            )
            out += [flag, json.dumps({**spec, "model": draft} if "model" in spec else spec, separators=(",", ":"))]
        elif flag in flag_changes:
            new, why = flag_changes[flag]
            changes.append({"what": flag, "from": value or "(set)", "to": new or "(dropped)", "why": why})
            if new is not None:
                out += [flag, new]
        else:
            out += [flag, *([value] if has_value else [])]
    for flag, (value, why) in flags_added.items():
        changes.append({"what": flag, "from": "(unset)", "to": value, "why": why})
        out += [flag, value]
    env = dict(env)
    for name, (value, why) in env_changes.items():
        changes.append({"what": name, "from": env.get(name, "(unset)"), "to": value, "why": why})
        env[name] = value
    return out, env, changes


def _with_spec(argv: list[str], spec: dict[str, object] | None) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == "--speculative-config":
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out + (["--speculative-config", json.dumps(spec, separators=(",", ":"))] if spec else [])


def configurations(argv: list[str], env: dict[str, str]) -> dict[str, dict[str, object]]:
    """The configurations measured, each the adapted recipe command with one change."""
    i = argv.index("--speculative-config")
    shipped: dict[str, object] = json.loads(argv[i + 1])
    fixed = {k: v for k, v in shipped.items() if k not in (SCHEDULE, AV)}
    av = {**fixed, AV: True}
    dt_on = {"KILN_DRAFT_TRUNC": "1"}
    table: dict[str, tuple[dict[str, object] | None, dict[str, str]]] = {
        "spec-off": (None, {"KILN_DRAFT_TRUNC": "0"}),
        "spec": (fixed, {"KILN_DRAFT_TRUNC": "0"}),
        "dt-cost": (fixed, dt_on),
        "dt-tau": (fixed, {**dt_on, "KILN_DRAFT_TRUNC_TAU": "0.25"}),
        "shipped": (shipped, {}),
        # the schedule alone: what glm53-kindling-2node ships (draft-trunc off there)
        "schedule": (shipped, {"KILN_DRAFT_TRUNC": "0"}),
        "av": (av, {"KILN_DRAFT_TRUNC": "0"}),
        "av-dt": (av, {**dt_on, "KILN_DRAFT_TRUNC_WITH_AV": "1"}),
        # AV_TIMING: the hook's own time in the engine, on /metrics (off in the recipes)
        "kiln-av": (
            av,
            {
                **dt_on,
                "KILN_DRAFT_TRUNC_WITH_AV": "1",
                "KILN_DRAFT_TRUNC_AV_CALIBRATE": "1",
                "KILN_DRAFT_TRUNC_AV_TIMING": "1",
            },
        ),
    }
    table.update(_mtp_table(shipped))
    return {
        name: {
            "argv": _with_model(_with_spec(argv, spec), MTP_TARGET if name.startswith("mtp") else TARGET),
            "env": {**env, **extra},
            "env_delta": extra,
            "speculative_config": spec,
        }
        for name, (spec, extra) in table.items()
    }


def _mtp_table(shipped: dict[str, object]) -> dict[str, tuple[dict[str, object] | None, dict[str, str]]]:
    """The MTP head's runs (draft-trunc off: its drafting hooks are in the draft_model
    drafter): what deepseek-v32-mtp ships (a fixed K), and the two combinations vLLM
    issues #48494 and #48749 report failing at CUDA graph capture on the V2 runner, MTP
    with a batch-size schedule (glm53-kindling's) and with adaptive verification."""
    mtp: dict[str, object] = {"method": "mtp", "num_speculative_tokens": MTP_K}
    off = {"KILN_DRAFT_TRUNC": "0"}
    return {
        "mtp-off": (None, off),
        "mtp": (mtp, off),
        **({"mtp-schedule": ({**mtp, SCHEDULE: shipped[SCHEDULE]}, off)} if SCHEDULE in shipped else {}),
        "mtp-av": ({**mtp, AV: True}, off),
    }


def _with_model(argv: list[str], model: str) -> list[str]:
    """argv (`serve MODEL ...`) serving model instead."""
    return [argv[0], model, *argv[2:]]


def plan(recipe: str, shape: str, engine: str | None = None) -> dict[str, object]:
    """The runner's plan for `recipe`; one line (SystemExit) for a recipe the twin cannot serve."""
    loaded = resolve_recipe(recipe)
    if loaded.recipe.engine.flavour != "cuda":
        sys.exit(
            f"gpu-twin: {recipe} is a CPU recipe (engine.flavour {loaded.recipe.engine.flavour}); "
            "the twin serves CUDA recipes"
        )
    doc = launch_document(loaded)
    spec = (
        json.loads(doc["argv"][doc["argv"].index("--speculative-config") + 1])
        if "--speculative-config" in doc["argv"]
        else None
    )
    if spec is None or spec.get("method") != "draft_model":
        sys.exit(
            f"gpu-twin: {recipe}: launch.speculative_config.method is "
            f"{spec.get('method') if spec else 'unset'}; the twin's models are a target and a "
            "draft model (method draft_model), with no MTP head"
        )
    argv, env, changes = adapted(list(doc["argv"][1:]), dict(doc["env"]))
    changes.append(
        {
            "what": "model (mtp-* runs)",
            "from": TARGET,
            "to": MTP_TARGET,
            "why": "the same target as a Glm4Moe checkpoint with one MTP layer, speculative method mtp",
        }
    )
    commit = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    return {
        "recipe": recipe,
        "engine": engine or loaded.recipe.engine.version,
        "commit": commit,
        "shape": shape,
        "models": {"script": "benchmarks/gpu_twin/twin_models.py", "args": [MODELS, "--shape", shape]},
        "recipe_argv": doc["argv"],
        "changes": changes,
        "configs": configurations(argv, env),
    }
