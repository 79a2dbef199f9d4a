#!/usr/bin/env python3
"""The scale twin on the lent device: serve one rank's slice of each planned recipe
through vLLM's OpenAI server, one server resident at a time, smoke it and time it
(docs/draft-trunc.md, "The scale twin").

    scale_runner.py --plan .gpu-scale/plan.json --out DIR [--recipes R ...]
                    [--only CONFIG ...] [--smoke] [--loads 1 8 32] [--seconds 10]
                    [--passes 3] [--acceptance informative|flat] [--routing uniform|correlated]

It stands on the GPU twin's runner.py: its `assemble` (the stashed parts, carried by
the GPU twin's calls) and `Server`. The depth is decided here, from the GPU's memory:
full depth where the slice fits, else cut, the drafter by the same factor. Tokens/s is
the server's own `vllm:generation_tokens_total` over a steady window with `load`
requests always in flight, each pass at least `--seconds` long. Results are rewritten
after every configuration (DIR/gpu-scale-results.json), so a call cut short keeps what
it measured. A missing part or a shape that does not fit is one line, exit 3.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _load_runner():  # runner.py as a module (no kiln here); it loads the other siblings
    spec = importlib.util.spec_from_file_location("kiln_gpu_twin_runner", HERE / "runner.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


runner = _load_runner()
serving = runner.serving  # the one twin_serving module runner.Server is built on
step_profile = runner._sibling("step_profile")
shapes = runner._sibling("scale_shapes")
acceptance = runner._sibling("scale_acceptance")
STASH = Path("/tmp/kiln-gpu-scale")
CONFIG_S = 150  # a warm start, a smoke and three loads of three 10 s passes
WEIGHT_SHARE = 0.65  # of the GPU's memory for weights: the rest is KV cache, activations, graphs
_T0 = time.monotonic()


def _say(message: str) -> None:
    print(f"gpu-scale [{time.monotonic() - _T0:6.1f} s] {message}", flush=True)


# -- models ---------------------------------------------------------------------------------
def gpu_memory() -> tuple[str, int]:
    """(device name, total bytes) read by torch in a child (the parts' Python path)."""
    code = "import torch; print(torch.cuda.get_device_name(0)); print(torch.cuda.mem_get_info()[1])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    name, total = out.stdout.strip().splitlines()[-2:]
    return name, int(total)


def _tokenizer(folder: Path, vocab: int) -> None:
    """A word-list tokenizer covering the whole vocabulary slice: every id decodes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    words = {"<s>": 0, "</s>": 1, "<pad>": 2, "<unk>": 3, **{f"w{i}": i for i in range(4, vocab)}}
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))  # noqa: S106  # a token, not a secret
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "model_max_length": shapes.POSITIONS,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def make_models(plan: dict, total_bytes: int, utilisation: float) -> dict:
    """config.json and a tokenizer for the target and drafter at the depth that fits."""
    cut = plan["slice"]
    budget = int(total_bytes * utilisation * WEIGHT_SHARE)
    layers, drafted = shapes.depth(
        cut["full_layers"], cut["draft_layers"], cut["layer_bytes"], cut["fixed_bytes"], budget
    )
    made = {"layers": layers, "full_layers": cut["full_layers"], "draft_layers": drafted, "budget_bytes": budget}
    for role, sliced in (("target", cut["target"]), ("draft", cut["draft"])):
        if sliced is None:
            continue
        folder = STASH / "models" / role
        folder.mkdir(parents=True, exist_ok=True)
        depth = layers if role == "target" else drafted
        config = {**sliced, "num_hidden_layers": depth}
        if "layer_types" in config:  # one entry a layer (gpt-oss's sliding/full alternation)
            config["layer_types"] = config["layer_types"][:depth]
        (folder / "config.json").write_text(json.dumps(config, indent=1))
        _tokenizer(folder, int(config["vocab_size"]))
    made["scale"] = round(shapes.scale_factor(cut["full_layers"], layers), 3)
    return made


# -- load and counters: twin_serving.py ----------------------------------------------------
def counters(url: str) -> dict[str, float]:
    """Every vllm: and kiln_ sample on the server's /metrics, summed over its labels."""
    return serving.parse_counters(serving.metrics_text(url))


parse_counters = serving.parse_counters


def _prompt(n: int) -> str:
    return " ".join(f"w{4 + (n * 131 + i * 17) % 1000}" for i in range(32))


# -- smoke ----------------------------------------------------------------------------------
def smoke(url: str, model: str, plan: dict, scale: float) -> list[dict]:
    """The recipe's smoke checks that do not depend on real weights, each named."""
    spec = plan["smoke"]
    checks = []

    def check(name: str, ok: bool, detail: str) -> None:
        checks.append({"check": name, "passed": bool(ok), "detail": detail})

    with urllib.request.urlopen(f"{url}/health", timeout=10) as resp:
        check("health", resp.status == 200, f"/health {resp.status}")
    with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as resp:
        ids = [m["id"] for m in json.loads(resp.read())["data"]]
    check("models", model in ids, f"/v1/models lists {ids}")
    before, t0 = counters(url), time.monotonic()
    answer = serving.complete(
        url, {"model": model, "prompt": _prompt(7), "max_tokens": spec["max_tokens"], "ignore_eos": True}
    )
    wall = time.monotonic() - t0
    usage, choice = answer.get("usage", {}), (answer.get("choices") or [{}])[0]
    check(
        "completion shape",
        isinstance(choice.get("text"), str) and usage.get("completion_tokens") == spec["max_tokens"],
        f"text {len(choice.get('text', ''))} chars, usage {usage}, finish_reason {choice.get('finish_reason')}",
    )
    after = counters(url)
    if spec.get("min_tokens_per_s"):
        rate = spec["max_tokens"] / wall / scale
        check(
            "tokens/s floor",
            rate >= spec["min_tokens_per_s"],
            f"{rate:.1f} tok/s at full depth (x1/{scale}) >= {spec['min_tokens_per_s']}",
        )
    if spec.get("expect_spec_decode"):
        drafts = after.get("vllm:spec_decode_num_draft_tokens_total", 0) - before.get(
            "vllm:spec_decode_num_draft_tokens_total", 0
        )
        check("speculative decoding", drafts > 0, f"{drafts:.0f} draft tokens in the request")
    for feature, bounds in spec.get("features", {}).items():
        proposed = after.get(f"kiln_{feature.replace('-', '_')}_proposed_total")
        check(
            f"{feature} counters", proposed is not None, f"kiln_{feature.replace('-', '_')}_* on /metrics: {proposed}"
        )
        dead = after.get("kiln_draft_trunc_dead_total", 0.0)
        if "dead_fraction" in bounds and proposed:
            check(
                f"{feature} dead_fraction", dead / proposed <= bounds["dead_fraction"]["max"], f"{dead / proposed:.3f}"
            )
    return checks


# -- one configuration at a time ------------------------------------------------------------
def _variant(config: dict, acceptance_mode: str, routing: str) -> dict:
    env = dict(config["env"])
    if acceptance_mode == "informative":
        env["KILN_GPU_TWIN_ACCEPTANCE"] = str(STASH / "acceptance.json")
    if routing == "correlated":
        env["VLLM_MOE_ROUTING_SIMULATION_STRATEGY"] = "kiln_correlated"
    return {**config, "env": env}


def _profile(server: runner.Server, traces: Path, seconds: float) -> dict:
    """One request's decode steps under torch's profiler (step_profile.py)."""
    body = {"model": server.model, "prompt": _prompt(3), "max_tokens": 2048, "ignore_eos": True, "temperature": 0.0}

    def steps() -> float:
        found = counters(server.url)
        return found.get("vllm:spec_decode_num_drafts_total") or found.get("vllm:generation_tokens_total", 0.0)

    return step_profile.profile(server.url, traces, seconds, lambda: serving.complete(server.url, body), steps)


def serve_one(name: str, config: dict, plan: dict, args: argparse.Namespace, record: dict) -> None:
    logs = STASH / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    variant = _variant(config, args.acceptance, args.routing)
    traces = STASH / "profiles" / name
    if args.profile:
        variant = {**variant, "argv": [*variant["argv"], *step_profile.profiler_flags(traces)]}
    server = runner.Server(name, variant, logs)
    try:
        server.wait_healthy(time.monotonic() + serving.START_TIMEOUT_S)
        record["startup_s"] = round(server.startup_s or 0.0, 1)
        _say(f"{name}: healthy after {record['startup_s']} s")
        if args.smoke:
            record["smoke"] = smoke(server.url, server.model, plan, record["scale"])
            _say(
                f"{name}: smoke "
                + ", ".join(f"{c['check']} {'ok' if c['passed'] else 'FAILED'}" for c in record["smoke"])
            )
        record["timed"] = []  # runner.py's name: analyse.py and model_check.py read these rows
        for load in args.loads:
            row = serving.steady(server.url, server.model, load, args.seconds, args.passes, _prompt)
            record["timed"].append({**row, "tokens_per_s": row["median"]})
            _say(f"{name}: {load} requests: {row['median']:.0f} tok/s ({row['range'][0]:.0f}-{row['range'][1]:.0f})")
        if args.profile:
            record["profile"] = _profile(server, traces, args.profile)
            _say(f"{name}: profiled, {record['profile'].get('gpu_us_per_step', '?')} us of kernels a step")
    except Exception as exc:  # one configuration's failure must not lose the others'  # noqa: BLE001
        record["error"] = f"{type(exc).__name__}: {exc}"
        _say(f"{name}: {record['error']}")
    finally:
        record["log_tail"] = server.log_tail(40)
        server.stop()


PLAN_FIELDS = {"slice": dict, "configs": dict, "smoke": dict, "substitutions": list}
SLICE_FIELDS = {"target": dict, "full_layers": int, "draft_layers": int, "layer_bytes": int, "fixed_bytes": int}


def read_plans(path: Path) -> dict:
    """scale_plan.py's document, each recipe's plan checked field by field (runner.py's
    plain checks): PartProblem naming the file and the field, one line."""
    doc = runner._fields(runner._json_file(path), str(path), {"recipes": dict})
    for name, plan in doc["recipes"].items():
        runner._fields(plan, f"{path}: recipes.{name}", PLAN_FIELDS)
        runner._fields(plan["slice"], f"{path}: recipes.{name}.slice", SLICE_FIELDS)
    return doc["recipes"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--recipes", nargs="*")
    parser.add_argument("--only", nargs="*", help="these configurations only (default: shipped)")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--loads", nargs="*", type=int, default=[1, 8, 32])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--acceptance", choices=("informative", "flat"), default="informative")
    parser.add_argument("--routing", choices=("uniform", "correlated"), default="uniform")
    parser.add_argument("--profile", type=float, default=0.0, help="seconds of one request under torch's profiler")
    parser.add_argument("--call-s", type=float, default=560, help="start no configuration past this minus its time")
    args = parser.parse_args(argv)
    try:
        plans = read_plans(args.plan)
        runner.assemble()
        preflight = runner.preflight()
    except (OSError, runner.PartProblem) as exc:
        print(f"gpu-scale: {exc}", file=sys.stderr)
        return 3
    sys.path[:0] = [str(runner.SITE)]
    STASH.mkdir(parents=True, exist_ok=True)
    (STASH / "acceptance.json").write_text(json.dumps(acceptance.table()))
    device, total = gpu_memory()
    args.out.mkdir(parents=True, exist_ok=True)
    for recipe in args.recipes or list(plans):
        code = run_recipe(recipe, plans[recipe], args, {"device": device, "total": total, "preflight": preflight})
        if code:
            return code
    return 0


def run_recipe(recipe: str, plan: dict, args: argparse.Namespace, device: dict) -> int:
    """One recipe's configurations, one server at a time, into OUT/gpu-scale-RECIPE.json
    (runner.py's document: its plan, and each configuration's timed rows)."""
    try:
        made = make_models(plan, device["total"], 0.90)
    except shapes.ShapeProblem as exc:
        print(f"gpu-scale: {recipe}: {exc}", file=sys.stderr)
        return 3
    depth = f"{made['layers']} of {made['full_layers']} layers, drafter {made['draft_layers']}"
    _say(f"{recipe}: {depth}, on {device['device']}")
    doc = {
        "plan": {k: v for k, v in plan.items() if k != "configs"} | {"configs": plan["configs"]},
        "device": device["device"],
        "preflight": device["preflight"],
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "made": made,
        "variant": {"acceptance": args.acceptance, "routing": args.routing},
        "timing": {"seconds": args.seconds, "passes": args.passes, "loads": args.loads},
        "configs": {},
    }
    out = args.out / f"gpu-scale-{recipe}-{args.acceptance}-{args.routing}.json"
    for name in args.only or ["shipped"]:
        if name not in plan["configs"]:
            continue
        if time.monotonic() - _T0 > args.call_s - CONFIG_S:  # what is left of the call would cut it short
            doc["configs"][name] = {"skipped": f"not started: under {CONFIG_S} s of the call left"}
            continue
        record = doc["configs"].setdefault(name, {"scale": made["scale"]})
        serve_one(f"{recipe}-{name}", plan["configs"][name], plan, args, record)
        out.write_text(json.dumps(doc) + "\n")
    _say(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
