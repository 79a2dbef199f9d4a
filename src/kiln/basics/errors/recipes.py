"""Errors of what a recipe says: refused by kiln's schema, or by the pinned engine's own
parser (the launch command)."""

from __future__ import annotations

from kiln.basics.errors.base import KilnError, ManyProblems, one_line


class RecipeInvalid(ManyProblems, KilnError):
    """One or more recipe problems; each is its own ``file:line: field: message`` line."""

    exit_code = 2
    hint = "fix the field(s) above; `kiln schema` prints the JSON Schema for editors"

    def __init__(self, problems: list[str], *, hint: str | None = None) -> None:
        super().__init__([one_line(p) for p in problems], hint=hint)


class LaunchArgInvalid(ManyProblems, KilnError):
    """The pinned engine refuses the launch command: a flag, a value or a feature knob;
    each problem its own ``file:line: field: message`` line."""

    exit_code = 17
    hint = "the pinned engine refuses it; check `vllm serve --help=all` (and kiln-engine's knobs) for that version"

    def __init__(self, problems: list[str] | str, *, hint: str | None = None) -> None:
        problems = [problems] if isinstance(problems, str) else problems
        super().__init__([one_line(p) for p in problems], hint=hint)
