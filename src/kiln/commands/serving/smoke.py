"""`kiln smoke NAME`: prove a built image serves, with the official OpenAI client (the
use-case: kiln.usecases.smoke)."""

from __future__ import annotations

import argparse

from kiln.basics import log
from kiln.basics.errors import SmokeFailed
from kiln.commands.options import Subparsers, count, reports
from kiln.domain.locks import engine_lock
from kiln.domain.recipes.resolved import resolve_recipe
from kiln.domain.recipes.topology import split_over_nodes
from kiln.usecases.smoke import EMULATION_FACTOR, smoke


def _smoke_cli(args: argparse.Namespace) -> int:
    topology = None
    if getattr(args, "nodes", None):
        topology = split_over_nodes(args.nodes)
    recipe = resolve_recipe(args.name)  # once: the checks, the build and the image found take it
    try:
        record = smoke(recipe, build=args.build, topology=topology, platform=args.platform, in_image=args.in_image)
    except SmokeFailed as exc:
        if args.json and exc.record:
            log.emit_json(exc.record)  # the failed checks are what a script wants to see
        raise
    if args.json:
        log.emit_json(record)
    return 0


def register(sub: Subparsers) -> None:
    """Add `kiln smoke` to the `kiln` subparsers."""
    s = reports(sub.add_parser("smoke", help="smoke-test a built image with the OpenAI client"))
    s.add_argument("name")
    s.add_argument("--build", action="store_true", help="build first if needed")
    s.add_argument(
        "--platform",
        choices=sorted(engine_lock.PLATFORMS),
        default=None,
        help="smoke the image built for this platform (default the host's); another architecture "
        f"serves under qemu, with time limits x{EMULATION_FACTOR}",
    )
    s.add_argument(
        "--in-image",
        action="store_true",
        help="a GPU recipe on a host without a GPU: prove inside the image what can be proved "
        "without serving (machine, CUDA build, imports, kiln-engine, features, launch command); "
        "the record says level in-image",
    )
    s.add_argument(
        "--nodes",
        type=count("node", 64),
        default=None,
        metavar="N",
        help="serve across N containers on a private docker network, one tensor-parallel rank each "
        "(proves the multi-node wiring on one host; writes no smoke record)",
    )
    s.set_defaults(func=_smoke_cli)
