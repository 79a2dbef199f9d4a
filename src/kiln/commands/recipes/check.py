"""`kiln check`: validate everything that can be validated without building (the
use-case: kiln.usecases.check)."""

from __future__ import annotations

import argparse

from kiln.basics import log
from kiln.commands.options import Subparsers, reports
from kiln.domain.locks import engine_lock
from kiln.domain.recipes.recipe import recipe_dir, recipe_names
from kiln.usecases.check import check_recipes


def _recipe_names(args: argparse.Namespace) -> list[str]:
    """NAME, or every recipe (no NAME, or --all)."""
    if args.name and not args.all:
        recipe_dir(args.name)  # an unknown name is no recipe problem: say so with its own hint
        return [args.name]
    return recipe_names()


def _cmd_check(args: argparse.Namespace) -> int:
    outcome = check_recipes(_recipe_names(args), platform=args.platform)
    if args.json:
        log.emit_json(outcome.document)
    if outcome.failure is not None:
        raise outcome.failure
    for entry in outcome.document["recipes"]:  # after the verdict: error output stays one line per problem
        log.info(f"{entry['name']} applies:")
        for series in entry["series"]:
            log.info(f"  {series['applies']}: {series['file'] or 'no series'} ({series['patches']} patch(es))")
    log.info(f"{len(outcome.document['recipes'])} recipe(s) valid")
    return 0


def register(sub: Subparsers) -> None:
    """Add `kiln check` to the `kiln` subparsers."""
    s = reports(sub.add_parser("check", help="validate recipes without building"))
    s.add_argument("name", nargs="?")
    s.add_argument("--all", action="store_true")
    s.add_argument(
        "--platform",
        choices=sorted(engine_lock.PLATFORMS),
        default=None,
        help="ask this platform's engine image (of engine.platforms) for the launch check "
        "(default: the host's; another architecture's runs under qemu)",
    )
    s.set_defaults(func=_cmd_check)
