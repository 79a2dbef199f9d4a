"""`kiln fetch NAME [--cache DIR]`: download the recipe's pinned Hugging Face snapshots
into the shared cache that `kiln run`, `kiln smoke` and the image's entrypoint read."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from kiln.basics import log
from kiln.basics.paths import host_hf_cache
from kiln.commands.options import Subparsers
from kiln.domain.recipes.recipe import load_recipe, recipe_dir
from kiln.domain.serving.hf_fetch import fetch
from kiln.domain.serving.launch_command import hf_models


def _cmd_fetch(args: argparse.Namespace) -> int:
    loaded = load_recipe(recipe_dir(args.name))
    models = hf_models(loaded.recipe)
    cache = Path(args.cache or host_hf_cache())
    if not models:
        log.info(f"{args.name} reads no model from a Hugging Face cache (no model.*.source: hf): nothing to fetch")
        return 0
    t0 = time.monotonic()
    done = fetch(models, cache, say=log.step)
    log.summary(
        f"fetched {args.name}",
        {
            "cache": str(cache),
            **{
                f"{f.model.role}": f"{f.model.repo}@{f.model.revision[:12]} "
                f"({'downloaded' if f.downloaded else 'already complete'})"
                for f in done
            },
            "took": log.human_secs(time.monotonic() - t0),
        },
    )
    return 0


def register(sub: Subparsers) -> None:
    """Add `kiln fetch` to the `kiln` subparsers."""
    s = sub.add_parser("fetch", help="download the recipe's pinned Hugging Face snapshots into the shared cache")
    s.add_argument("name")
    s.add_argument(
        "--cache",
        metavar="DIR",
        help="the cache folder (default: $KILN_HF_CACHE, else the hub client's: $HF_HUB_CACHE, "
        "$HF_HOME/hub, ~/.cache/huggingface/hub)",
    )
    s.set_defaults(func=_cmd_fetch)
