"""`kiln doctor`: is this machine ready to build, serve and publish? (the checks:
kiln.usecases.doctor)"""

from __future__ import annotations

import argparse

from kiln.basics import log
from kiln.commands.options import Subparsers, reports
from kiln.usecases.doctor import check_machine

# a row's status as it is marked on the terminal
_MARKS = {"ok": "[green]ok[/]  ", "fail": "[red]FAIL[/]", "warn": "[yellow]warn[/]"}


def _cmd_doctor(args: argparse.Namespace) -> int:
    log.step("kiln doctor")
    document = check_machine()
    for row in document["checks"]:
        mark = _MARKS[row["status"]]
        log.console.print(f"  {mark} {row['check']}: ", end="", markup=True, highlight=False)
        log.console.print(row["detail"], markup=False, highlight=False)
    if args.json:
        log.emit_json(document)
    return 0 if document["ok"] else 1


def register(sub: Subparsers) -> None:
    """Add `kiln doctor` to the `kiln` subparsers."""
    s = reports(sub.add_parser("doctor", help="check this machine"))
    s.set_defaults(func=_cmd_doctor)
