"""`kiln check`: validate everything that can be validated without building (the
use-case: kiln.usecases.check)."""

from __future__ import annotations

import argparse

from kiln.basics import log
from kiln.basics.errors import UsageError
from kiln.commands.options import Subparsers, reports
from kiln.domain.locks import engine_lock
from kiln.usecases.check import check_recipes


def _cmd_check(args: argparse.Namespace) -> int:
    all_recipes = args.all or not args.name
    if args.platform is not None and all_recipes:
        raise UsageError("kiln check --platform: name one recipe (its engine image for that platform is asked)")
    outcome = check_recipes(None if all_recipes else args.name, platform=args.platform)
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
