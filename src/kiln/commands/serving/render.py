"""`kiln render k8s NAME`: argument handling and what it prints (the use-case:
kiln.usecases.render; the manifests themselves are built in kiln.domain.serving.k8s)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from kiln.basics import log
from kiln.basics.errors import RecipeInvalid
from kiln.commands.options import Subparsers
from kiln.domain.recipes.resolved import resolve_recipe
from kiln.domain.recipes.topology import effective
from kiln.domain.serving.k8s import HF_CACHE_PVC
from kiln.domain.serving.launch_command import hf_models
from kiln.usecases.render import RENDER_HINT, render_k8s


def _cmd_render(args: argparse.Namespace) -> int:
    try:
        recipe = resolve_recipe(args.name)
    except RecipeInvalid as exc:  # refused as `kiln check` refuses it, with render's hint
        raise RecipeInvalid(exc.problems, hint=RENDER_HINT) from None
    rendered = render_k8s(
        recipe,
        out_dir=Path(args.output) if args.output else None,
        image=args.image,
        replicas=args.replicas,
        hf_pvc=args.hf_cache_pvc,
    )
    if not args.output:
        print(rendered.text, end="")
        return 0
    loaded = recipe.loaded
    topo = effective(loaded.recipe)
    shape = f"LeaderWorkerSet of {topo.nodes} nodes" if topo.multi_node else "Deployment"
    fetch = f" + Job {args.name}-fetch (fills PVC {args.hf_cache_pvc})" if hf_models(loaded.recipe) else ""
    log.ok(f"{args.name}: {shape} x {args.replicas} replica(s) + Service{fetch}, image {rendered.image}")
    for path in rendered.written:
        log.info(f"  wrote {path}")
    return 0


def register(sub: Subparsers) -> None:
    """Add `kiln render k8s` to the `kiln` subparsers."""
    render_parser = sub.add_parser("render", help="render deployment manifests from a recipe")
    targets = render_parser.add_subparsers(dest="render_target", required=True, metavar="TARGET")
    s = targets.add_parser("k8s", help="Kubernetes: a LeaderWorkerSet (several nodes) or Deployment, and a Service")
    s.add_argument("name")
    s.add_argument("-o", "--output", metavar="DIR", help="write one YAML file per object here (default: print them)")
    s.add_argument("--image", help="image reference (default: the digest of the recipe's latest publish)")
    s.add_argument("--replicas", type=_replicas, default=1, help="serving groups (default 1)")
    s.add_argument(
        "--hf-cache-pvc",
        default=HF_CACHE_PVC,
        type=_claim_name,
        metavar="CLAIM",
        help=f"PersistentVolumeClaim holding the shared Hugging Face cache (default {HF_CACHE_PVC})",
    )
    s.set_defaults(func=_cmd_render)


def _claim_name(text: str) -> str:
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", text) or len(text) > 253:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a PersistentVolumeClaim name (lowercase letters, digits, '-')"
        )
    return text


def _replicas(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"{text!r} is not a replica count in 0..1000")
    return value
