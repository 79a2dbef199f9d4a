"""Errors of the command line: a command kiln does not accept, or no checkout to run in."""

from __future__ import annotations

from kiln.basics.errors.base import KilnError


class NotACheckout(KilnError):
    """kiln runs outside a checkout and KILN_ROOT does not name one."""

    exit_code = 25
    hint = "cd into your kiln checkout, or set KILN_ROOT=/path/to/checkout"


class UsageError(KilnError):
    """A command line kiln does not accept, or an option it cannot act on."""

    exit_code = 64
    hint = "see `kiln --help`"
