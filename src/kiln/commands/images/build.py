"""`kiln build`: engine image (if needed), then the recipe image, each skipped when an
image with the same input digest already exists (the use-case: kiln.usecases.build)."""

from __future__ import annotations

import argparse

from kiln.basics import log
from kiln.commands.options import Subparsers, reports
from kiln.domain.images import build_plan
from kiln.domain.images.image_build import BuildOutcome
from kiln.domain.locks import engine_lock
from kiln.domain.recipes.resolved import ResolvedRecipe, resolve_recipe
from kiln.infra.docker import DockerDaemon
from kiln.usecases.build import BuildDocument, build_recipe


def _document(outcome: BuildOutcome, recipe: str) -> BuildDocument:
    """`kiln build --json` (schema: schemas/build.json)."""
    return BuildDocument(
        recipe=recipe,
        tag=outcome.tag,
        image_id=outcome.image_id,
        input_digest=outcome.digest,
        size_bytes=outcome.size,
        seconds=round(outcome.seconds, 2),
        skipped=outcome.skipped,
        steps=outcome.steps,
        cached_steps=outcome.cached_steps,
    )


def _platforms_of(recipe: ResolvedRecipe, flag: str | None) -> list[str | None]:
    """--platform: None (the host's), one platform, or `all` (every declared one)."""
    return [None] if flag is None else list[str | None](recipe.engine.platforms) if flag == "all" else [flag]


def cmd_build(args: argparse.Namespace) -> int:
    """Build the named recipe's image for each platform asked; with --json, print its document."""
    docs: list[tuple[str | None, BuildDocument]] = []
    docker = DockerDaemon()
    recipe = resolve_recipe(args.name)  # once: every step below takes this value
    platforms = _platforms_of(recipe, args.platform)
    force = args.force or args.no_cache
    if not args.skip_disk_check:  # every platform's engine build counted before the first starts
        build_plan.check_build_space(
            docker, recipe, platforms, force=force, force_engine=args.force_engine, ca_flag=args.ca_bundle
        )
    for platform in platforms:
        outcome = build_recipe(
            recipe,
            docker=docker,
            force=force,
            force_engine=args.force_engine,
            ca_flag=args.ca_bundle,
            nocache=args.no_cache,
            platform=platform,
        )
        docs.append((platform, _document(outcome, args.name)))
    if args.json:  # one platform: its document alone; `--platform all`: one per platform, inside the first
        first = docs[0][1]  # several only with `--platform all`, each one named
        log.emit_json(first if len(docs) == 1 else BuildDocument(**first, platforms={str(p): d for p, d in docs}))
    return 0


def register(sub: Subparsers) -> None:
    """Add `kiln build` to the `kiln` subparsers."""
    s = reports(sub.add_parser("build", help="build a recipe's image (engine image first if needed)"))
    s.add_argument("name")
    s.add_argument("--force", action="store_true", help="rebuild even if an image with this input digest exists")
    s.add_argument("--force-engine", action="store_true", help="rebuild the engine image too")
    s.add_argument(
        "--no-cache",
        action="store_true",
        help="ignore the daemon's layer cache (with --force-engine: for the engine too)",
    )
    s.add_argument("--ca-bundle", help="PEM bundle builds trust (default: $KILN_CA_BUNDLE, else pip's cert)")
    s.add_argument(
        "--platform",
        choices=[*sorted(engine_lock.PLATFORMS), "all"],
        default=None,
        help="build for this platform of engine.platforms, or all of them (default: the host's; "
        "another architecture runs under qemu: scripts/setup.sh --arm64)",
    )
    s.add_argument(
        "--skip-disk-check",
        action="store_true",
        help="build even if the engine builds ahead look too big for the daemon's free disk "
        "(the check cannot see builder stages already in the layer cache)",
    )
    s.set_defaults(func=cmd_build)
