#!/usr/bin/env python3
"""The README's exit-code table, generated from src/kiln/basics/errors/ (the package).

    python scripts/exit_codes.py           rewrite the table in README.md
    python scripts/exit_codes.py --check   exit 1 if README.md's table is out of date

One row per KilnError subclass: its exit code, its name and the first sentence of its
docstring (the class name in words when it has none). The table lives between the two
marker comments in README.md; the text around it is never touched. The errors package
is imported from this checkout's src/, so this runs without kiln installed (basics
imports nothing of kiln's outside basics); what `_load_errors` returns is a copy of its
namespace, which a caller may add classes to without touching kiln's own.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
ERRORS = "kiln.basics.errors"
README = REPO / "README.md"
BEGIN = "<!-- exit-codes: begin (generated from src/kiln/basics/errors by `python scripts/exit_codes.py`) -->"
END = "<!-- exit-codes: end -->"
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`(])")


def _load_errors() -> ModuleType:
    if str(SRC) not in sys.path:
        sys.path.insert(0, str(SRC))
    package = importlib.import_module(ERRORS)
    module = ModuleType("kiln_errors_for_docs")
    module.__dict__.update({k: v for k, v in vars(package).items() if not k.startswith("__")})
    return module


def _meaning(cls: type) -> str:
    doc = cls.__dict__.get("__doc__") or ""
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    if not paragraph:  # no docstring: "RegistryAuthFailed" -> "registry auth failed"
        return " ".join(
            w.lower() if not w.isupper() else w
            for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z][a-z]*|[a-z]+", cls.__name__)
        )
    first = SENTENCE_END.split(paragraph, maxsplit=1)[0]
    return first.replace("``", "`").replace("|", "\\|")


def rows(errors: ModuleType) -> list[tuple[int, str, str]]:
    """(exit code, class name, meaning) for every KilnError subclass, by exit code."""
    base = errors.KilnError
    found = [
        (cls.exit_code, name, _meaning(cls))
        for name, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, base) and cls is not base
    ]
    return sorted(found)


def table(errors: ModuleType | None = None) -> str:
    """The markdown table, markers included."""
    lines = [BEGIN, "| exit | error | meaning |", "|---|---|---|"]
    lines += [
        f"| {code} | `{name}` | {meaning} |"
        for code, name, meaning in rows(errors or _load_errors())
    ]
    return "\n".join([*lines, END])


def updated(readme: str, errors: ModuleType | None = None) -> str:
    """`readme` with the text between the markers (inclusive) replaced by a fresh table."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise SystemExit(
            f"{README.name}: the markers are missing; put these two lines where the table goes:\n"
            f"{BEGIN}\n{END}"
        )
    return readme[:start] + table(errors) + readme[end + len(END) :]


def main(argv: list[str]) -> int:
    current = README.read_text()
    fresh = updated(current)
    if "--check" in argv:
        if fresh != current:
            print(
                f"{README.name}: the exit-code table is out of date; run `python scripts/exit_codes.py`",
                file=sys.stderr,
            )
            return 1
        return 0
    if fresh != current:
        README.write_text(fresh)
        print(f"rewrote the exit-code table in {README.name} ({len(rows(_load_errors()))} codes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
