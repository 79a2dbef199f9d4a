"""Progress and summaries on stderr; machine-readable output stays on stdout."""

from __future__ import annotations

import json
import os
import sys

from rich.console import Console
from rich.markup import escape

console = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)
out = Console(highlight=False, soft_wrap=True, emoji=False)
# errors and warnings: still shown under --quiet, which only silences progress
errors = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)

DEBUG = bool(os.environ.get("KILN_DEBUG"))
JSON_EMITTED = False


def set_debug(flag: bool) -> None:
    """Turn debug lines on or off for the rest of the process."""
    global DEBUG
    DEBUG = flag


def set_quiet(flag: bool) -> None:
    """--quiet: no progress, summaries or ok-lines on stderr; errors and warnings stay."""
    console.quiet = flag


def emit_json(doc: object) -> None:
    """The one JSON document a `--json` command writes to stdout."""
    global JSON_EMITTED
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    sys.stdout.flush()
    JSON_EMITTED = True


def step(msg: str) -> None:
    """Print the start of a step (`==> msg`) on the console."""
    console.print(f"[bold cyan]==>[/] {msg}")


def info(msg: str) -> None:
    """Print an indented line of information, as plain text."""
    console.print(f"    {msg}", markup=False)


def warn(msg: str) -> None:
    """Print a warning on stderr, the message shown as text, never as markup."""
    # the message is text, never markup: `wheels[linux/amd64]` in a field path stays
    errors.print(f"[yellow]warning:[/] {escape(msg)}")


def debug(msg: str) -> None:
    """Print a dimmed debug line when debug output is on."""
    if DEBUG:
        console.print(f"[dim]debug: {msg}[/]", markup=True)


def ok(msg: str) -> None:
    """Print a line that reports success (`ok msg`)."""
    console.print(f"[green]ok[/] {msg}")


def summary(title: str, rows: dict[str, object]) -> None:
    """Print a title and its rows as aligned `key  value` lines."""
    console.print(f"[bold]{title}[/]")
    width = max(len(k) for k in rows) if rows else 0
    for key, value in rows.items():
        console.print(f"  {key.ljust(width)}  {value}", markup=False)


def human_size(size: float) -> str:
    """A byte count in decimal units, for people: `512 B`, `1.50 GB`."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(size) < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1000
    return f"{size:.2f} TB"


def human_secs(seconds: float) -> str:
    """A duration for people: milliseconds under a second, seconds under two minutes, else minutes and seconds."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def is_tty() -> bool:
    """Whether stderr is a terminal (progress displays draw only there)."""
    return sys.stderr.isatty()
