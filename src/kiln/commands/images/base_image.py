"""`kiln base build`: the air-gapped Debian base image (the use-case: kiln.usecases.base_image)."""

from __future__ import annotations

import argparse

from kiln.commands.options import Subparsers
from kiln.domain.locks import engine_lock
from kiln.infra.docker import DockerDaemon
from kiln.usecases.base_image import build_base


def _cmd_base_build(args: argparse.Namespace) -> int:
    build_base(
        DockerDaemon(), tag=args.tag, force=args.force or args.relock, relock=args.relock, platform=args.platform
    )
    return 0


def register(sub: Subparsers) -> None:
    """Add `kiln base build` to the `kiln` subparsers."""
    base = sub.add_parser("base", help="the air-gapped Debian base image")
    bsub = base.add_subparsers(dest="base_command", required=True, parser_class=type(base))
    s = bsub.add_parser("build", help="debootstrap + import kiln/base:bookworm")
    s.add_argument("--tag", default=None)
    s.add_argument("--force", action="store_true")
    s.add_argument(
        "--platform",
        choices=sorted(engine_lock.PLATFORMS),
        default=None,
        help="build for this platform (default the host's; linux/arm64 on x86-64 needs qemu: "
        "scripts/setup.sh --arm64); tag kiln/base:bookworm-arm64",
    )
    s.add_argument(
        "--relock",
        action="store_true",
        help="write the package set debootstrap installs into docker-images/base/locks/ "
        "(after the mirror moved on) instead of refusing another set",
    )
    s.set_defaults(func=_cmd_base_build)
