"""`kiln render k8s NAME`: argument handling and file writing; the manifests themselves
are built in kiln.domain.serving.k8s (what they contain and why is documented there)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import yaml

from kiln.basics import log
from kiln.basics.errors import RecipeInvalid
from kiln.commands.options import Subparsers
from kiln.commands.recipes.check import check_one
from kiln.domain.images.definitions import resolve
from kiln.domain.publishing.publish_records import published_image
from kiln.domain.recipes.topology import effective
from kiln.domain.serving.k8s import HF_CACHE_PVC, dump, manifests
from kiln.domain.serving.launch_command import hf_models


def render(
    name: str, *, out_dir: Path | None, image: str | None, replicas: int, hf_pvc: str = HF_CACHE_PVC
) -> list[Path]:
    """Check the recipe as `kiln check` does, then write (or print) its manifests."""
    problems = check_one(name)
    if problems:
        raise RecipeInvalid(problems, hint="`kiln render` renders only recipes that `kiln check` accepts")
    resolved = resolve(name)
    loaded, recipe_image = resolved.loaded, resolved.recipe_image
    if image is None:
        image = published_image(name, recipe_image.digest)
    elif "@sha256:" not in image:
        log.warn(f"--image {image} is not pinned by digest: nodes may pull different images")
    objects = manifests(loaded, image, replicas=replicas, hf_pvc=hf_pvc)
    if out_dir is None:
        print(dump(objects), end="")
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for obj in objects:
        path = out_dir / f"{name}-{obj['kind'].lower()}.yaml"
        path.write_text(yaml.safe_dump(obj, sort_keys=False, default_flow_style=False))
        written.append(path)
    topo = effective(loaded.recipe)
    shape = f"LeaderWorkerSet of {topo.nodes} nodes" if topo.multi_node else "Deployment"
    fetch = f" + Job {name}-fetch (fills PVC {hf_pvc})" if hf_models(loaded.recipe) else ""
    log.ok(f"{name}: {shape} x {replicas} replica(s) + Service{fetch}, image {image}")
    for path in written:
        log.info(f"  wrote {path}")
    return written


def _cmd_render(args: argparse.Namespace) -> int:
    render(
        args.name,
        out_dir=Path(args.output) if args.output else None,
        image=args.image,
        replicas=args.replicas,
        hf_pvc=args.hf_cache_pvc,
    )
    return 0


def register(sub: Subparsers) -> None:
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
