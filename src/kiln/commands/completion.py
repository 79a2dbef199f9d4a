"""`kiln completion SHELL`: a completion script made from the whole parser."""

from __future__ import annotations

import argparse

import shtab

from kiln.commands.options import Subparsers


def _cmd_completion(args: argparse.Namespace) -> int:
    # the root parser, which cli.py puts in every namespace: commands may not import cli
    print(shtab.complete(args.root_parser, shell=args.shell))
    return 0


def register(sub: Subparsers) -> None:
    """Add `kiln completion` to the `kiln` subparsers."""
    s = sub.add_parser("completion", help="print a shell completion script (bash, zsh, tcsh)")
    s.add_argument("shell", choices=("bash", "zsh", "tcsh"))
    s.set_defaults(func=_cmd_completion)
