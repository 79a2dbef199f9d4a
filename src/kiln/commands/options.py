"""Options several commands share, so each spells the same flag with the same help."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeAlias

# what `register(sub)` receives: the `kiln` subparsers (a string: argparse's class is
# generic only to the type checker)
# argparse names no public type for it
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"  # noqa: SLF001


def reports(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """A command that reports something: --json prints one document on stdout
    (schema: src/kiln/schemas/<command>.json, docs/cli-json.md)."""
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout (docs/cli-json.md)")
    return parser


def count(what: str, most: int) -> Callable[[str], int]:
    """An argparse `type=` for a whole number in 1..`most`; anything else (signs, spaces,
    `1e3`) is refused with one line naming `what` it should count."""

    def parse(text: str) -> int:
        if not text.isdigit() or not 1 <= int(text) <= most:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {what} count in 1..{most}")
        return int(text)

    return parse
