"""Errors of the engine's patch series and whole-file overrides."""

from __future__ import annotations

from kiln.basics.errors.base import KilnError, ManyProblems


class PatchFailed(ManyProblems, KilnError):
    """Hunks of a series that do not apply (or leave Python that does not compile); one line each."""

    exit_code = 6
    hint = "run `kiln patches check` to reproduce without Docker, or `kiln engine bump --to VERSION --dry-run`"


class OverrideDrift(ManyProblems, KilnError):
    """Whole-file replacements forked from another upstream file than the engine's; one line each."""

    exit_code = 7
    hint = "run `kiln override rebase RECIPE FEATURE --from OLD_VERSION` to 3-way merge onto the pinned engine"


class RebaseConflict(ManyProblems, KilnError):
    """Conflict blocks `kiln override rebase` left in the override's files; one line each."""

    exit_code = 23
    hint = "resolve the conflict markers in the override file, then rebuild"


class PatchInvalid(ManyProblems, KilnError):
    """Malformed patches or series files; each problem is its own line naming the file."""

    exit_code = 30
    hint = (
        "each patch is a unified diff (-p1) with a free-text header holding `Why:` and `Upstream:` lines; "
        "see docs/patches.md"
    )
