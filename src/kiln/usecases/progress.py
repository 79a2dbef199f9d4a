"""How a use-case says what it is doing: records of the standard library's `logging`
(the `kiln.usecases` logger), never a print. A caller in Python sees them only if it
configures logging (a NullHandler keeps them quiet otherwise); `kiln` shows each one as
the progress line of its kind on stderr (`cli.py`, through kiln.basics.log).

Each record carries its kind (`KIND`: step, info, ok, warn, debug, summary, verdict,
output) and what that kind needs beyond the message (`ROWS`, `PASSED`, `DETAIL`)."""

from __future__ import annotations

import logging
from typing import Literal

LOGGER = logging.getLogger("kiln.usecases")
LOGGER.addHandler(logging.NullHandler())
LOGGER.setLevel(logging.DEBUG)  # which records are shown is the handler's choice, not this logger's

# the attributes of a record that say how to show it (`extra=`; no LogRecord attribute has these names)
KIND, ROWS, PASSED, DETAIL = "kiln_kind", "kiln_rows", "kiln_passed", "kiln_detail"

_Kind = Literal["step", "info", "ok", "warn", "debug", "summary", "verdict", "output"]


def _record(level: int, kind: _Kind, message: str, **more: object) -> None:
    LOGGER.log(level, "%s", message, extra={KIND: kind, **more})


def step(message: str) -> None:
    """A step begins (`==>`)."""
    _record(logging.INFO, "step", message)


def info(message: str) -> None:
    """A detail of the step under way."""
    _record(logging.INFO, "info", message)


def ok(message: str) -> None:
    """Something done, or found done already."""
    _record(logging.INFO, "ok", message)


def warn(message: str) -> None:
    """Something the user should know; the use-case goes on."""
    _record(logging.WARNING, "warn", message)


def debug(message: str) -> None:
    """What only --debug shows (a command line run)."""
    _record(logging.DEBUG, "debug", message)


def summary(title: str, rows: dict[str, object]) -> None:
    """A step's outcome as a title and aligned rows."""
    _record(logging.INFO, "summary", title, **{ROWS: rows})


def verdict(passed: bool, name: str, detail: str) -> None:
    """One check's verdict (a smoke check): passed or failed, and what it found."""
    _record(logging.INFO, "verdict", name, **{PASSED: passed, DETAIL: detail})


def output(text: str) -> None:
    """What a failing external command printed last, as it printed it."""
    _record(logging.ERROR, "output", text)
