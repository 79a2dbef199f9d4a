#!/usr/bin/env python3
"""vLLM's own draft acceptance for a built CPU recipe: serve it (tiny-kindling with
draft-trunc off, `-e KILN_DRAFT_TRUNC=0`, so every proposed draft is verified), send
greedy requests, and print the spec-decode counters from /metrics: accepted / proposed
draft tokens, the share of windows accepting draft position i, and the conditional
per-token agreement P(i accepted | < i accepted).

With --feature-on the recipe's draft-trunc stays on and its own counters (dead
fraction, kept drafts accepted and rejected) are printed too; --models DIR mounts
DIR/tiny-qwen3moe and DIR/tiny-qwen3-draft over the image's (to try make_models.py
settings without a rebuild).

usage: spec_acceptance.py [RECIPE] [--prompts N] [--tokens T] [--concurrency C]
                          [--feature-on] [--models DIR] [--image REF] [-e VAR=VALUE ...]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main(argv=None) -> None:
    from kiln_testkit.twinserve import counters, prompts, run_set, serving, spec_decode_stats

    from kiln.domain.images.definitions import require_built, resolve
    from kiln.domain.recipes.feature_registry import engine_features
    from kiln.infra.docker import DockerDaemon

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("recipe", nargs="?", default="tiny-kindling")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--feature-on", action="store_true")
    p.add_argument("--models", type=Path)
    p.add_argument(
        "--image",
        help="serve this image (e.g. kiln/tiny-kindling:latest) instead of the one the recipe's current inputs make",
    )
    p.add_argument("-e", "--env", action="append", default=[], metavar="VAR=VALUE")
    args = p.parse_args(argv)
    docker = DockerDaemon()
    if args.image:
        loaded, image = resolve(args.recipe).loaded, docker.client.images.get(args.image)
    else:
        built = require_built(docker, args.recipe)
        loaded, image = built.loaded, built.image
    features = engine_features(loaded.recipe.features)
    env = {}
    for feature in features:
        env.update(feature.smoke_env if args.feature_on else {feature.env: "0"})
    env.update(kv.split("=", 1) for kv in args.env)
    model = loaded.recipe.launch.served_model_name
    print(f"{args.recipe}: serving {image.id[:19]} with {env or 'the recipe env'}", flush=True)
    mounts = (
        [(str(args.models.resolve() / m), f"/models/{m}") for m in ("tiny-qwen3moe", "tiny-qwen3-draft")]
        if args.models
        else []
    )
    with serving(docker, loaded, image.id, env, mounts=mounts) as box:
        print(
            f"  healthy in {box.startup_s:.1f} s; {args.prompts} greedy requests x {args.tokens} tokens "
            f"at concurrency {args.concurrency}",
            flush=True,
        )
        if args.feature_on:
            warm_up(box, model, features)
        before = spec_decode_stats(box.url)
        own_before = {f.name: counters(box.url, f.metrics) for f in features}
        t0 = time.monotonic()
        res = run_set(
            box.url, model, prompts(args.prompts, seed=7), max_tokens=args.tokens, concurrency=args.concurrency
        )
        seconds = time.monotonic() - t0
        stats = spec_decode_stats(box.url)
        if stats and before:
            stats = stats - before
        own = (
            {f.name: _delta(counters(box.url, f.metrics), own_before[f.name]) for f in features}
            if args.feature_on
            else {}
        )
    tokens = sum(len(r.token_ids) for r in res)
    print(f"  {tokens} tokens in {seconds:.1f} s ({tokens / seconds:.1f} tok/s)")
    print(f"  vLLM: {stats.summary() if stats else 'no spec-decode counters on /metrics'}")
    for feature in features:
        if feature.name in own:
            print(f"  {feature.name}: {feature_summary(feature, own[feature.name])}")


def warm_up(box, model: str, features, limit_s: float = 600) -> None:
    """Requests (not measured) until every feature publishes counters: draft-trunc
    truncates nothing before its estimator's warm-up (100 verify steps) has passed."""
    from kiln_testkit.twinserve import counters, prompts, run_set

    t0, batch = time.monotonic(), 0
    while any(v is None for f in features for v in counters(box.url, f.metrics).values()):
        if time.monotonic() - t0 > limit_s:
            sys.exit(f"no feature counters on /metrics after {limit_s:.0f} s of warm-up")
        batch += 1
        run_set(box.url, model, prompts(4, seed=1000 + batch), max_tokens=64, concurrency=2)
    print(f"  warmed up in {time.monotonic() - t0:.0f} s ({batch} batches of 4 requests)", flush=True)


def _delta(after: dict, before: dict) -> dict:
    return {k: None if v is None else v - (before.get(k) or 0.0) for k, v in after.items()}


def feature_summary(feature, values: dict) -> str:
    from kiln.usecases.smoke_checks import feature_ratio

    parts = []
    for name in ("dead_fraction", "acceptance"):
        ratio = feature_ratio(values, feature.ratio(name))
        parts.append(f"{name} {'n/a' if ratio is None else f'{ratio:.3f}'}")
    parts += [
        f"{k.removeprefix('kiln_draft_trunc_').removesuffix('_total')} {v:.0f}"
        for k, v in values.items()
        if v is not None
    ]
    return ", ".join(parts)


if __name__ == "__main__":
    main()
