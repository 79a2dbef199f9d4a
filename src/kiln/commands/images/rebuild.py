"""`kiln rebuild --verify REF`: rebuild an image from the sources its labels name and
compare (the use-case: kiln.usecases.rebuild); on a difference it names the first layer
and the first file in it that differ, and exits 31."""

from __future__ import annotations

import argparse

from kiln.basics import log
from kiln.basics.errors import RebuildDiffers
from kiln.commands.options import Subparsers
from kiln.usecases.rebuild import rebuild


def _cmd_rebuild(args: argparse.Namespace) -> int:
    old_id, new_id, diff = rebuild(args.ref, reuse_engine=args.reuse_engine, keep=args.keep)
    if old_id == new_id:
        log.summary(f"rebuilt {args.ref}: the same image", {"image id": old_id})
        return 0
    lines = [f"{args.ref}: the rebuild is {new_id[:19]}, not {old_id[:19]}"]
    if diff is not None:
        lines.append(f"first difference: {diff.line()}")
    raise RebuildDiffers("; ".join(lines))


def register(sub: Subparsers) -> None:
    """Add `kiln rebuild` to the `kiln` subparsers."""
    p = sub.add_parser("rebuild", help="rebuild an image from the commit its labels name and compare (--verify)")
    p.add_argument("ref", help="a local image (tag or id) or HOST/REPO:TAG in a registry")
    p.add_argument(
        "--verify",
        action="store_true",
        required=True,
        help="compare the rebuild's image id and layers with REF's (the only mode)",
    )
    p.add_argument(
        "--reuse-engine",
        action="store_true",
        help="trust this daemon's base and engine image for those inputs; rebuild the recipe's layers only",
    )
    p.add_argument("--keep", action="store_true", help="keep the rebuilt image's kiln-verify/ tags")
    p.set_defaults(func=_cmd_rebuild)
