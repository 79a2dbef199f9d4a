"""The base of every typed error (`KilnError`), the several-problems mixin, `one_line`,
and the error document a `--json` command writes instead of its own.

The errors themselves live in one module per family (usage, recipes, daemon, ...): this package's
docstring lists them."""

from __future__ import annotations

import unicodedata
from typing import Annotated

from pydantic import Field
from typing_extensions import TypedDict

from kiln.basics.json_types import Strings1


class ErrorBody(TypedDict):
    """A typed error as `--json` reports it: its class, exit code, problems and hint."""

    type: str
    exit_code: Annotated[int, Field(ge=2)]
    message: str
    problems: Strings1
    hint: str


class ErrorDocument(TypedDict):
    """What stdout carries when a `--json` command fails before writing its document
    (src/kiln/schemas/error.json)."""

    error: ErrorBody


class KilnError(Exception):
    """Base class: a problem the user can act on."""

    exit_code = 1
    hint = ""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if hint is not None:
            self.hint = hint

    def lines(self) -> list[str]:
        """The lines the CLI prints, message first."""
        out = [self.message]
        if self.hint:
            out.append(f"hint: {self.hint}")
        return out

    def document(self) -> ErrorDocument:
        """The error document of a `--json` command: the lines printed, less the hint's, are its problems."""
        problems = [ln for ln in self.lines() if not ln.startswith("hint: ")]
        return ErrorDocument(
            error=ErrorBody(
                type=type(self).__name__,
                exit_code=self.exit_code,
                message="\n".join(problems),
                problems=problems,
                hint=self.hint or "",
            )
        )


def one_line(text: str) -> str:
    """``text`` with control, format and line-separator characters escaped, so a hostile
    key or file name can neither split an error line nor send terminal escapes to CI logs."""
    return "".join(
        ch if ch == " " or unicodedata.category(ch) not in {"Cc", "Cf", "Zl", "Zp", "Cs"} else ascii(ch)[1:-1]
        for ch in text
    )


class ManyProblems:
    """Mixed in before KilnError: several problems at once, each printed as its own
    ``kiln: error:`` line (every hunk that fails, every invalid field), then the hint.
    (A mixin, not a KilnError itself: it has no exit code of its own.)"""

    hint: str

    def __init__(self, problems: list[str] | str, *, hint: str | None = None) -> None:
        problems = [problems] if isinstance(problems, str) else list(problems)
        # a mixin: KilnError is next in the MRO
        super().__init__("\n".join(problems), hint=hint)  # type: ignore[call-arg]
        self.problems = problems

    def lines(self) -> list[str]:
        """The error's lines as printed: each problem, then the hint if there is one."""
        return [*self.problems, *([f"hint: {self.hint}"] if self.hint else [])]
