"""`kiln prune`: remove kiln images that no current recipe input can produce.

Every edit to a recipe or the engine makes a new digest-tagged image and the old ones
stay behind (an engine image is ~3 GB on CPU, ~9 GB on CUDA), so a day of work can fill
a disk. An image is kept when its input digest is the current one of some recipe or of
that recipe's engine; `kiln/base:*` is always kept. Only images labelled by kiln are
ever touched: with recipe names, only those recipes' images; without, every recipe image
of this checkout's recipes and every engine image no recipe here uses.
"""

from __future__ import annotations

import argparse

from kiln.basics import log
from kiln.basics.errors import KilnError
from kiln.commands.options import Subparsers
from kiln.domain.images.definitions import resolve
from kiln.domain.images.image_naming import LABEL_NS
from kiln.domain.recipes.recipe import recipe_names
from kiln.infra.docker import DockerDaemon, Image, id_of


def _current_digests() -> set[str]:
    """Input digests of every valid recipe's image and engine image, as of now."""
    keep: set[str] = set()
    for name in recipe_names():
        try:
            resolved = resolve(name)
            keep.update({resolved.recipe_image.digest, resolved.engine_image.digest})
        except KilnError as exc:  # an invalid recipe protects nothing, but say so
            log.warn(f"prune: {name} is not valid ({exc.message.splitlines()[0]}); its images count as stale")
    return keep


def _stale_images(docker: DockerDaemon, keep: set[str], recipes: set[str], engines: bool) -> list[Image]:
    out = []
    for image in docker.images(label=f"{LABEL_NS}.input-digest"):
        labels = image.labels or {}
        if labels.get(f"{LABEL_NS}.input-digest") in keep:
            continue
        mine = labels.get(f"{LABEL_NS}.recipe") in recipes
        engine = engines and labels.get(f"{LABEL_NS}.kind") == "engine"
        if mine or engine:
            out.append(image)
    return out


def prune(names: list[str] | None = None, *, dry_run: bool = False, docker: DockerDaemon | None = None) -> int:
    """Remove (or with `dry_run` only list) the kiln images no current recipe input produces; the count."""
    docker = docker or DockerDaemon()
    keep = _current_digests()
    stale = _stale_images(docker, keep, set(names or recipe_names()), engines=not names)
    total = 0
    for image in stale:
        name = ", ".join(image.tags) or image.short_id
        total += image.attrs.get("Size", 0)
        if dry_run:
            log.info(f"would remove {name}")
            continue
        removed = [docker.remove_image(tag) for tag in image.tags or [id_of(image)]]
        if all(removed):
            log.info(f"removed {name}")
        else:  # untagged, but other repositories (a registry's name) still reference it
            log.info(f"kept {name}: other repositories reference it")
    verb = "would free" if dry_run else "freed"
    log.summary(
        "kiln prune",
        {
            "kept": f"{len(keep)} current input digest(s)",
            "stale images": str(len(stale)),
            verb: f"up to {log.human_size(total)} (shared layers are freed only when nothing uses them)",
        },
    )
    return 0


def _cmd_prune(args: argparse.Namespace) -> int:
    return prune(args.names, dry_run=args.dry_run)


def register(sub: Subparsers) -> None:
    """Add `kiln prune` to the `kiln` subparsers."""
    s = sub.add_parser("prune", help="remove kiln images no current recipe input produces")
    s.add_argument("names", nargs="*", help="only these recipes' images (default: all recipes and engines)")
    s.add_argument("--dry-run", action="store_true", help="only list them")
    s.set_defaults(func=_cmd_prune)
