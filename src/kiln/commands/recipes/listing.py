"""`kiln list`: every recipe, one line each (or one JSON document)."""

from __future__ import annotations

import argparse

from kiln.basics import log
from kiln.commands.options import Subparsers, reports
from kiln.domain.catalogue.entries import ListDocument, recipe_rows


def _cmd_list(args: argparse.Namespace) -> int:
    rows = recipe_rows()
    if args.json:
        log.emit_json(ListDocument(recipes=rows))
        return 0
    for row in rows:
        if row["valid"]:
            e = row["engine"]
            log.out.print(
                f"{row['name']:24} {e['name']}=={e['version']} {e['flavour']:5} {row['served_model_name']}",
                markup=False,
            )
        else:
            log.out.print(f"{row['name']:24} INVALID (kiln check {row['name']})", markup=False)
    return 0


def register(sub: Subparsers) -> None:
    """Add `kiln list` to the `kiln` subparsers."""
    s = reports(sub.add_parser("list", help="list recipes"))
    s.set_defaults(func=_cmd_list)
