"""Errors of the supply-chain documents: reading what an image holds for its SBOM, and
writing the SBOM (`kiln sbom`)."""

from __future__ import annotations

from kiln.basics.errors.base import KilnError


class SbomReadFailed(KilnError):
    """What an image holds could not be read (the in-image read failed): no SBOM is
    printed rather than one with parts missing (an unreadable engine lock is LockInvalid)."""

    exit_code = 96
    hint = "rerun with --debug; `docker run --rm --entrypoint python IMAGE -V` shows whether the image has a Python"


class SbomWriteFailed(KilnError):
    """`kiln sbom -o FILE` could not write FILE (nothing half-written is left there)."""

    exit_code = 97
    hint = "pick a writable path for -o, or leave -o out to print to stdout"
