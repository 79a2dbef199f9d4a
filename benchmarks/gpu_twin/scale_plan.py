#!/usr/bin/env python3
"""The scale twin's plan: `nox -s gpu_scale -- RECIPE [RECIPE ...]` (docs/draft-trunc.md,
"The scale twin").

For each CUDA recipe: one rank's slice of its model (scale_shapes.py) from `model.*.shape`
and topology, and its own `vllm serve` command from `kiln run --print`'s launch document,
adapted by the GPU twin's `adapted` with the scale twin's changes, each listed. The
device half (scale_runner.py) serves it on the GPU twin's assembled parts, so run
`nox -s gpu_twin -- glm53-kindling` first: its bundle carries vLLM with the twin's
series, which holds the scale twin's patches 0005-0007.

The plan travels in the checkout (`.gpu-scale/plan.json`, kept out of git by
.git/info/exclude is not needed: it is small and written under .gpu-twin's ignore rule
only when --out says so). One line and exit 2 for a recipe the twin cannot serve.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kiln_testkit.scripts import load_script

from kiln.basics.errors import KilnError
from kiln.domain.planning.model_shape import model_config
from kiln.domain.recipes.recipe import LoadedRecipe
from kiln.domain.recipes.resolved import resolve_recipe
from kiln.domain.serving.launch_command import launch_document

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
shapes = load_script("benchmarks/gpu_twin/scale_shapes.py")
twin_plan = load_script("benchmarks/gpu_twin/twin_plan.py")
acceptance = load_script("benchmarks/gpu_twin/scale_acceptance.py")

STASH = "/tmp/kiln-gpu-scale"
TARGET, DRAFT = f"{STASH}/models/target", f"{STASH}/models/draft"
ACCEPTANCE_TABLE = f"{STASH}/acceptance.json"
_PARSERS = "the recipe's parsers expect its model's special tokens; the twin's tokenizer is a word list"
FLAG_CHANGES: dict[str, tuple[str | None, str]] = {
    "--host": ("127.0.0.1", "loopback only"),
    "--port": ("PORT", "a free port (the runner fills it in)"),
    "--tensor-parallel-size": (None, "one rank's slice on one GPU (scale_shapes.py)"),
    "--pipeline-parallel-size": (None, "one rank's slice on one GPU"),
    "--data-parallel-size": (None, "one rank's slice on one GPU"),
    "--enable-expert-parallel": (None, "the rank's experts are in its slice"),
    "--max-model-len": (str(shapes.POSITIONS), "the slice's positions: short prompts, long decodes"),
    "--tool-call-parser": (None, _PARSERS),
    "--reasoning-parser": (None, _PARSERS),
    "--enable-auto-tool-choice": (None, "goes with --tool-call-parser"),
    "--tokenizer-mode": (None, "the twin's tokenizer is a plain word list"),
    "--kv-cache-dtype": (None, "bf16 KV cache: fp8 KV is not exercised with the twin's Triton attention"),
    "--revision": (None, "a local folder of made-up weights has no revisions"),
}
ENV_CHANGES: dict[str, tuple[str, str]] = {
    "VLLM_USE_V2_MODEL_RUNNER": ("1", "the runner draft-trunc's hooks live in"),
    "VLLM_USE_FLASHINFER_SAMPLER": ("0", "FlashInfer does not travel"),
    "KILN_GPU_TWIN": ("1", "the twin's patch 0001: vllm_flash_attn imports without its libraries"),
    "KILN_DRAFT_TRUNC_LOG_INTERVAL": ("100", "draft-trunc's counters on /metrics within a timed pass"),
    "VLLM_MOE_ROUTING_SIMULATION_STRATEGY": ("uniform_random", "dummy gates would route badly (runner: --routing)"),
}


def _flags_added(recipe_args: dict[str, object], attention: str) -> dict[str, tuple[str, str]]:
    added = {
        "--load-format": ("dummy", "no weights travel: vLLM fills the slice with random values"),
        "--attention-backend": (
            "TRITON_MLA" if attention == "mla" else "TRITON_ATTN",
            "FlashAttention's and FlashMLA's libraries do not travel",
        ),
        "--compilation-config": (
            '{"mode":0,"cudagraph_mode":"FULL_DECODE_ONLY"}',
            "no torch.compile on the device's torch 2.11 (vLLM pins 2.14); full decode graphs",
        ),
    }
    if "max-num-seqs" not in recipe_args:
        added["--max-num-seqs"] = ("64", "the largest load measured")
    return added


def _draft_config(loaded: LoadedRecipe) -> tuple[dict[str, object] | None, str]:
    """The draft's shape, or (for a recipe whose draft has none) the shape another recipe
    gives the same weights (same host_path); None for MTP and no speculation."""
    draft = loaded.recipe.model.draft
    if draft is None:
        return None, ""
    try:
        return dict(model_config(loaded, "draft", draft)[0]), "model.draft.shape"
    except KilnError:
        pass
    for other in sorted(p.parent.name for p in (ROOT / "recipes").glob("*/recipe.yaml")):
        if other == loaded.name:
            continue
        sibling = resolve_recipe(other).loaded
        src = sibling.recipe.model.draft
        if src is not None and src.host_path == draft.host_path and src.shape is not None:
            return dict(src.shape.as_config()), f"{other}'s model.draft.shape (same weights, {draft.host_path})"
    return None, ""


def _speculative(argv: list[str]) -> dict[str, object] | None:
    return json.loads(argv[argv.index("--speculative-config") + 1]) if "--speculative-config" in argv else None


def _with_synthetic(spec: dict[str, object] | None) -> dict[str, object] | None:
    """vLLM's synthetic sampler at the flat rates, one per drafted position."""
    if spec is None:
        return None
    k = int(str(spec["num_speculative_tokens"]))
    rates = list(acceptance.FLAT_RATES[:k]) + [acceptance.FLAT_RATES[-1]] * max(0, k - len(acceptance.FLAT_RATES))
    return {**spec, "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": rates}


def configurations(argv: list[str], env: dict[str, str]) -> dict[str, dict[str, object]]:
    """The speculation matrix: off, fixed K 1-4, vLLM's schedule, what ships, draft-trunc
    with the cost policy at K 4, adaptive verification and kiln-av."""
    shipped = _speculative(argv)
    if shipped is None:
        return {"shipped": {"argv": argv, "env": env, "env_delta": {}, "speculative_config": None}}
    sched, av = twin_plan.SCHEDULE, twin_plan.AV
    fixed = {k: v for k, v in shipped.items() if k not in (sched, av)}
    k_max = int(str(fixed["num_speculative_tokens"]))
    off = {"KILN_DRAFT_TRUNC": "0"}
    dt_on = {"KILN_DRAFT_TRUNC": "1"}
    table: dict[str, tuple[dict[str, object] | None, dict[str, str]]] = {
        "spec-off": (None, off),
        **{f"k{k}": ({**fixed, "num_speculative_tokens": k}, off) for k in range(1, k_max)},
        "spec": (fixed, off),  # fixed K at the recipe's most, as the GPU twin names it
        "shipped": (shipped, {}),
    }
    if sched in shipped:
        table["schedule"] = (shipped, off)
    if fixed.get("method") == "draft_model":
        table["dt-cost"] = (fixed, dt_on)
        table["kiln-av"] = (
            {**fixed, av: True},
            {**dt_on, "KILN_DRAFT_TRUNC_WITH_AV": "1", "KILN_DRAFT_TRUNC_AV_CALIBRATE": "1"},
        )
    table["av"] = ({**fixed, av: True}, off)
    return {
        name: {
            "argv": twin_plan._with_spec(argv, _with_synthetic(spec)),  # the GPU twin's own helper
            "env": {**env, **extra},
            "env_delta": extra,
            "speculative_config": spec,
        }
        for name, (spec, extra) in table.items()
    }


def recipe_plan(name: str, attention: str) -> dict[str, object]:
    """One recipe's slice, command and configurations; ShapeProblem or SystemExit in one line."""
    resolved = resolve_recipe(name)
    recipe = resolved.recipe
    if recipe.engine.flavour != "cuda":
        sys.exit(f"gpu-scale: {name} is a CPU recipe (engine.flavour {recipe.engine.flavour}); the twin serves CUDA")
    target = dict(model_config(resolved.loaded, "target", recipe.model.target)[0])
    doc = launch_document(resolved.loaded)
    argv = list(doc["argv"][1:])
    spec = _speculative(argv)
    draft, draft_from = _draft_config(resolved.loaded) if spec and spec.get("method") == "draft_model" else (None, "")
    topo = shapes.Topology(
        tensor_parallel=recipe.topology.tensor_parallel,
        data_parallel=recipe.topology.data_parallel,
        expert_parallel=recipe.topology.expert_parallel,
        pipeline_parallel=recipe.topology.pipeline_parallel,
    )
    rank = shapes.rank_slice(target, draft, topo, attention)
    if not spec or spec.get("method") != "mtp":
        rank.target["num_nextn_predict_layers"] = 0  # an MTP head only where the recipe drafts with it
    tables = (FLAG_CHANGES, _flags_added(dict(recipe.launch.args), rank.attention), ENV_CHANGES)
    adapted, env, changes = twin_plan.adapted(argv, dict(doc["env"]), models=(TARGET, DRAFT), tables=tables)
    if rank.attention == "mla":
        env["KILN_GPU_TWIN_MLA_PREFILL"] = "sdpa"
        changes.append({"what": "KILN_GPU_TWIN_MLA_PREFILL", "from": "(unset)", "to": "sdpa", "why": "patch 0007"})
    smoke = recipe.smoke
    return {
        "recipe": name,
        "engine": recipe.engine.version,
        "shape": "scale",
        "routed_share": shapes.routed_share(rank.target),
        "served_model_name": recipe.launch.served_model_name or TARGET,
        "slice": {
            "target": rank.target,
            "draft": rank.draft,
            "draft_from": draft_from,
            "full_layers": rank.full_layers,
            "draft_layers": rank.draft_layers,
            "layer_bytes": rank.layer_bytes,
            "fixed_bytes": rank.fixed_bytes,
            "attention": rank.attention,
            "topology": vars(topo),
        },
        "substitutions": rank.substitutions,
        "recipe_argv": doc["argv"],
        "changes": changes,
        "smoke": {
            "max_tokens": smoke.max_tokens if smoke else 64,
            "expect_spec_decode": bool(smoke and smoke.expect_spec_decode),
            "min_acceptance_rate": smoke.min_acceptance_rate if smoke else None,
            "min_tokens_per_s": smoke.min_tokens_per_s if smoke else None,
            "features": {k: {f: b.model_dump() for f, b in v.items()} for k, v in (smoke.features or {}).items()}
            if smoke
            else {},
        },
        "configs": configurations(adapted, env),
    }


def main(argv: list[str] | None = None) -> int:
    """Write the plan for the named recipes; print the device call that serves them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipes", nargs="*", default=["glm53-kindling"])
    parser.add_argument("--attention", choices=("gqa", "mla"), default="gqa", help="the MLA family's stand-in")
    parser.add_argument("--out", type=Path, default=ROOT / ".gpu-scale" / "plan.json")
    args = parser.parse_args(argv)
    plans = {}
    for name in args.recipes:
        try:
            plans[name] = recipe_plan(name, args.attention)
        except (shapes.ShapeProblem, KilnError) as exc:
            print(f"gpu-scale: {name}: {getattr(exc, 'message', exc)}", file=sys.stderr)
            return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"recipes": plans}, indent=1) + "\n")
    for name, plan in plans.items():
        print(f"gpu-scale: {name}: {len(plan['configs'])} configurations; " + "; ".join(plan["substitutions"]))
    print(f"gpu-scale: plan in {args.out}; on the device, after the GPU twin's carrying calls:")
    print(f"  python3 benchmarks/gpu_twin/scale_runner.py --plan {args.out} --out $OUT ...")
    return 0


if __name__ == "__main__":
    sys.exit(main())
