"""`kiln schema`: the recipe JSON Schema, for editors and CI."""

from __future__ import annotations

import argparse
import json

from kiln.commands.options import Subparsers
from kiln.domain.recipes.recipe import json_schema


def _cmd_schema(args: argparse.Namespace) -> int:  # every _cmd_* takes the parsed args  # noqa: ARG001
    print(json.dumps(json_schema(), indent=2))
    return 0


def register(sub: Subparsers) -> None:
    """Add `kiln schema` to the `kiln` subparsers."""
    s = sub.add_parser("schema", help="print the recipe JSON Schema")
    s.set_defaults(func=_cmd_schema)
