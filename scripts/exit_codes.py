#!/usr/bin/env python3
"""The exit-code table of docs/cli-json.md, generated from src/kiln/basics/errors/ (the package).

    python scripts/exit_codes.py           rewrite the table in docs/cli-json.md
    python scripts/exit_codes.py --check   exit 1 if docs/cli-json.md's table is out of date

One row per KilnError subclass, grouped by family (the module of the errors package it
lives in, in the order the package's FAMILIES names them), by exit code within a family:
the family, the exit code, the class name and the first sentence of its docstring (the
class name in words when it has none). The table lives between the two marker comments
in docs/cli-json.md; the text around it is never touched. The errors package is imported
from this checkout's src/, so this runs without kiln installed (basics imports nothing
of kiln's outside basics); what `_load_errors` returns is a copy of its namespace, which
a caller may add classes to without touching kiln's own.
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
DOC = REPO / "docs" / "cli-json.md"
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
            w.lower() if not w.isupper() else w for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z][a-z]*|[a-z]+", cls.__name__)
        )
    first = SENTENCE_END.split(paragraph, maxsplit=1)[0]
    return first.replace("``", "`").replace("|", "\\|")


def family(cls: type) -> str:
    """The family of an error class: the module of the errors package it lives in."""
    package, _, module = cls.__module__.rpartition(".")
    if package != ERRORS:
        raise SystemExit(f"{cls.__name__} is defined in {cls.__module__}, not in a module of {ERRORS}")
    return module


def rows(errors: ModuleType) -> list[tuple[str, int, str, str]]:
    """(family, exit code, class name, meaning) for every KilnError subclass, by family
    (in the order errors.FAMILIES names them), then by exit code."""
    base, order = errors.KilnError, list(errors.FAMILIES)
    found = [
        (family(cls), cls.exit_code, name, _meaning(cls))
        for name, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, base) and cls is not base
    ]
    unknown = sorted({f for f, *_ in found} - set(order))
    if unknown:
        raise SystemExit(f"error modules missing from {ERRORS}.FAMILIES: {', '.join(unknown)}")
    return sorted(found, key=lambda row: (order.index(row[0]), row[1], row[2]))


def table(errors: ModuleType | None = None) -> str:
    """The markdown table, markers included."""
    lines = [BEGIN, "| family | exit | error | meaning |", "|---|---|---|---|"]
    lines += [
        f"| {fam} | {code} | `{name}` | {meaning} |" for fam, code, name, meaning in rows(errors or _load_errors())
    ]
    return "\n".join([*lines, END])


def updated(doc: str, errors: ModuleType | None = None) -> str:
    """`doc` with the text between the markers (inclusive) replaced by a fresh table."""
    start, end = doc.find(BEGIN), doc.find(END)
    if start < 0 or end < start:
        raise SystemExit(
            f"{DOC.name}: the markers are missing; put these two lines where the table goes:\n{BEGIN}\n{END}"
        )
    return doc[:start] + table(errors) + doc[end + len(END) :]


def main(argv: list[str]) -> int:
    current = DOC.read_text()
    fresh = updated(current)
    if "--check" in argv:
        if fresh != current:
            print(
                f"docs/{DOC.name}: the exit-code table is out of date; run `python scripts/exit_codes.py`",
                file=sys.stderr,
            )
            return 1
        return 0
    if fresh != current:
        DOC.write_text(fresh)
        print(f"rewrote the exit-code table in docs/{DOC.name} ({len(rows(_load_errors()))} codes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
