#!/usr/bin/env python3
"""`nox -s bench_cpu`: the CPU engine and tiny-moe, measured in one run.

Prints: cold build of engine-cpu (no layer cache) and of tiny-moe on top of it; warm
rebuild of tiny-moe after a launch-config-only edit (goal <= 5% of the engine's cold
build); image size (goal <= 2.8 GB); `docker run` to /health (goal <= 30 s on 2 cores);
greedy tokens/s (8 requests x 128 tokens one at a time, 16 at concurrency 8) with its
draft model and with speculation turned off as an operator would (`kiln run tiny-moe --
--speculative-config None`), and vLLM's draft acceptance.
Then tiny-kindling (the CPU twin of glm53-kindling: Model Runner V2 through Triton's
interpreter, draft-trunc on): time to healthy, tokens/s with the feature on and off
(16 greedy 64-token requests at concurrency 1 and 8), and from its counters the dead
fraction and the acceptance of kept drafts. The interpreter dominates CPU speed, so
these are numbers to spot regressions, not goals. Pass --reuse to skip the cold builds
(use the daemon's cache) when only serving numbers are wanted; --twin-only to measure
tiny-kindling alone, --moe-only tiny-moe's serving numbers alone.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from kiln_testkit.tree import REPO

NAME = "tiny-moe"
TWIN = "tiny-kindling"


def throughput(url: str, model: str) -> dict:
    """Greedy tokens/s: 8 prompts x 128 tokens one at a time (c1), 16 at 8 in flight (c8);
    the first request (warms caches) is not counted."""
    from kiln_testkit.twinserve import prompts

    # first request without logprobs: tiny-moe's worker (V1 runner, bf16, draft model)
    # dies on a fresh server's first request when it asks for logprobs (seen 2026-12-01)
    body = json.dumps({"model": model, "prompt": "def fibonacci(n):", "max_tokens": 16, "temperature": 0}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        resp.read()
    return {f"tps_c{conc}": tokens_per_s(url, model, prompts(n, seed=3), 128, conc) for conc, n in ((1, 8), (8, 16))}


def tokens_per_s(url: str, model: str, texts: list[str], max_tokens: int, concurrency: int) -> float:
    """Greedy completion tokens per wall-clock second over one request set."""
    from kiln_testkit.twinserve import run_set

    t0 = time.monotonic()
    res = run_set(url, model, texts, max_tokens=max_tokens, concurrency=concurrency)
    return sum(len(r.token_ids) for r in res) / (time.monotonic() - t0)


def serve_moe(docker, loaded, image_id: str, args: list[str]) -> dict:
    """tiny-moe served as `kiln run tiny-moe -- ARGS` would: time to healthy, tokens/s
    and vLLM's draft acceptance (None without speculation)."""
    from kiln_testkit.twinserve import serving, spec_decode_stats

    with serving(docker, loaded, image_id, args=args, startup_timeout_s=300) as box:
        row = {"healthy_s": box.startup_s, **throughput(box.url, loaded.recipe.launch.served_model_name)}
        row["spec"] = spec_decode_stats(box.url)
    spec = "no speculation" if row["spec"] is None else f"vLLM {row['spec'].summary()}"
    print(
        f"  {NAME} {' '.join(args) or '(as baked)'}: healthy {row['healthy_s']:.1f} s, "
        f"{row['tps_c1']:.1f} tok/s at c1, {row['tps_c8']:.1f} at c8; {spec}",
        flush=True,
    )
    return row


def moe_numbers(docker, image_id: str) -> dict:
    """tiny-moe with its draft model and with speculation turned off the way an operator
    does (`--speculative-config None`, vLLM's own spelling, replaces the baked flag)."""
    from kiln.domain.images.definitions import resolve

    loaded = resolve(NAME).loaded
    return {
        "spec": serve_moe(docker, loaded, image_id, []),
        "plain": serve_moe(docker, loaded, image_id, ["--speculative-config", "None"]),
    }


def print_moe(m: dict) -> None:
    spec, plain = m["spec"], m["plain"]
    print(
        f"  {NAME} docker run -> healthy  {spec['healthy_s']:8.1f} s   ratio to 30 s goal {spec['healthy_s'] / 30:.3f}"
    )
    acc = spec["spec"]
    if acc is not None:
        print(
            f"  {NAME} draft acceptance       {acc.acceptance:8.3f}     per position "
            f"{' '.join(f'{x:.2f}' for x in acc.per_position)}"
        )
    for conc in (1, 8):
        key = f"tps_c{conc}"
        print(
            f"  {NAME} c{conc} greedy, spec decode {spec[key]:8.1f} tok/s  no spec {plain[key]:.1f} tok/s  "
            f"ratio spec/plain {spec[key] / plain[key]:.2f}"
        )


def twin_numbers(docker) -> dict:
    """tiny-kindling with draft-trunc on, then off (same image, -e KILN_DRAFT_TRUNC=0)."""
    from kiln_testkit.twinserve import counters, prompts, serving

    from kiln.domain.images.definitions import require_built
    from kiln.domain.recipes.feature_registry import engine_features
    from kiln.domain.recipes.resolved import resolve_recipe
    from kiln.usecases.build import build_recipe
    from kiln.usecases.smoke_checks import feature_ratio

    build_recipe(resolve_recipe(TWIN), docker=docker, quiet_summary=True)
    built = require_built(docker, TWIN)
    loaded, image = built.loaded, built.image
    (feature,) = engine_features(loaded.recipe.features)
    model = loaded.recipe.launch.served_model_name
    ps = prompts(16, seed=3)
    out = {}
    for mode, env in (("on", dict(feature.smoke_env)), ("off", {feature.env: "0"})):
        with serving(docker, loaded, image.id, env) as box:
            row = {"healthy_s": box.startup_s}
            for conc in (1, 8):
                row[f"tps_c{conc}"] = tokens_per_s(box.url, model, ps, 64, conc)
            values = counters(box.url, feature.metrics)
            for name in ("dead_fraction", "acceptance"):
                row[name] = feature_ratio(values, feature.ratio(name))
            out[mode] = row
        print(
            f"  {TWIN} feature {mode}: healthy {row['healthy_s']:.1f} s, "
            f"{row['tps_c1']:.1f} tok/s at c1, {row['tps_c8']:.1f} tok/s at c8",
            flush=True,
        )
    return out


def print_twin(t: dict) -> None:
    on, off = t["on"], t["off"]
    print(f"  {TWIN} docker run -> healthy {on['healthy_s']:8.1f} s   (feature off {off['healthy_s']:.1f} s)")
    for conc in (1, 8):
        key = f"tps_c{conc}"
        print(
            f"  {TWIN} c{conc}, draft-trunc on {on[key]:8.1f} tok/s  off {off[key]:.1f} tok/s  "
            f"ratio on/off {on[key] / off[key]:.2f}"
        )
    dead = "n/a" if on["dead_fraction"] is None else f"{on['dead_fraction']:.3f}"
    acc = "n/a" if on["acceptance"] is None else f"{on['acceptance']:.3f}"
    print(f"  {TWIN} dead fraction {dead}   acceptance of kept drafts {acc}")


def main() -> None:
    if "--moe-only" in sys.argv:
        from kiln.domain.recipes.resolved import resolve_recipe
        from kiln.infra.docker import DockerDaemon
        from kiln.usecases.build import build_recipe

        docker = DockerDaemon()
        print(f"bench_cpu: {NAME} only (speculation on and off)")
        print_moe(moe_numbers(docker, build_recipe(resolve_recipe(NAME), docker=docker, quiet_summary=True).image_id))
        return
    if "--twin-only" in sys.argv:
        from kiln.infra.docker import DockerDaemon

        print(f"bench_cpu: {TWIN} only")
        print_twin(twin_numbers(DockerDaemon()))
        return
    from kiln.basics import paths
    from kiln.domain.images.definitions import resolve
    from kiln.domain.recipes.resolved import resolve_recipe
    from kiln.infra.docker import DockerDaemon
    from kiln.usecases.build import build_engine, build_recipe

    reuse = "--reuse" in sys.argv
    docker = DockerDaemon()
    resolved = resolve(NAME)
    loaded, engine_image = resolved.loaded, resolved.engine_image
    print(f"bench_cpu: {NAME} on {engine_image.repository} (vllm {loaded.recipe.engine.version}, 2 cores)")
    t0 = time.monotonic()
    eng = build_engine(docker, engine_image, force=not reuse, nocache=not reuse)
    engine_cold = time.monotonic() - t0
    t0 = time.monotonic()
    rec = build_recipe(resolve_recipe(NAME), docker=docker, force=not reuse, quiet_summary=True)
    recipe_cold = time.monotonic() - t0

    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
        tree = Path(tmp) / "tree"
        for part in ("recipes", "docker-images", "engine", "patches"):
            shutil.copytree(REPO / part, tree / part, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        f = tree / "recipes" / NAME / "recipe.yaml"
        f.write_text(f.read_text().replace("max-num-seqs: 8", "max-num-seqs: 6"))
        root = os.environ.get("KILN_ROOT")
        os.environ["KILN_ROOT"] = str(tree)
        paths.repo_root.cache_clear()
        t0 = time.monotonic()
        build_recipe(resolve_recipe(NAME), docker=docker, quiet_summary=True)
        warm = time.monotonic() - t0
        if root is None:
            del os.environ["KILN_ROOT"]
        else:  # the checkout measured (e.g. a worktree) stays the one the rest resolves
            os.environ["KILN_ROOT"] = root
        paths.repo_root.cache_clear()

    image = docker.client.images.get(rec.image_id)
    size_gb = image.attrs["Size"] / 1e9
    moe = moe_numbers(docker, rec.image_id)
    twin = twin_numbers(docker)

    print(f"  engine-cpu cold build         {engine_cold:8.1f} s{'  (cache reused)' if eng.skipped or reuse else ''}")
    print(f"  tiny-moe cold build           {recipe_cold:8.1f} s")
    print(
        f"  tiny-moe warm rebuild         {warm:8.1f} s   ratio to engine cold {warm / engine_cold:.3f} (goal <= 0.05)"
    )
    print(f"  image size                    {size_gb:8.2f} GB  ratio to 2.8 GB goal {size_gb / 2.8:.3f}")
    print_moe(moe)
    print_twin(twin)


if __name__ == "__main__":
    main()
