"""Errors of the engine's wheels and locks, and of its releases on the package index
(`kiln engine outdated`)."""

from __future__ import annotations

from kiln.basics.errors.base import KilnError


class EngineFetchFailed(KilnError):
    """The engine's wheels could not be downloaded."""

    exit_code = 20
    hint = "check network access to PyPI (pip config) or pre-fill ~/.cache/kiln/wheels"


class WheelHashMismatch(KilnError):
    """A wheel for a locked image (an engine image, or a recipe's own packages) is not the file
    the lock names (other sha256)."""

    exit_code = 26
    hint = (
        "the file in the wheel cache or on the index changed; delete it from ~/.cache/kiln/wheels/locked and "
        "rebuild, or re-lock (`kiln engine lock RECIPE`) if the new file is the one you want"
    )


class LockInvalid(KilnError):
    """A lock (an engine image's, or a recipe's recipe.lock.json) that cannot be read, or no
    longer matches what it locks."""

    exit_code = 27
    hint = "re-lock: `kiln engine lock RECIPE` (or `--all`), then review the diff"


class DebianPinUnavailable(KilnError):
    """The Debian mirror no longer serves a version the engine lock pins."""

    exit_code = 28
    hint = (
        "Debian's mirrors keep only the newest version of each package: re-lock with `kiln engine lock RECIPE` "
        "and rebuild (the input digest changes with the lock)"
    )


class LockMissing(KilnError):
    """An image that is built from a lock has none: an engine image for this engine version, or
    a recipe naming build.python_packages without its recipe.lock.json."""

    exit_code = 29
    hint = "write it: `kiln engine lock RECIPE`, then commit the lock file"


class EngineOutdated(KilnError):
    """`kiln engine outdated`: a recipe pins an older engine release than the newest one on the package index."""

    exit_code = 36
    hint = (
        "`kiln engine bump --to VERSION` ports the series to the newest release, then "
        "`kiln engine bump --to VERSION --recipe NAME` moves each recipe (docs/patches.md)"
    )


class PackageIndexUnreachable(KilnError):
    """The package index could not be asked: no connection, a TLS failure, a timeout, or an HTTP error status."""

    exit_code = 37
    hint = (
        "check the network and pip's configuration (`pip config list`: index-url, cert), "
        "or name another index with --index-url"
    )


class PackageIndexInvalid(KilnError):
    """The package index answered with a page that is no simple-API page (PEP 691 JSON or
    PEP 503 HTML), or one too large to read."""

    exit_code = 38
    hint = "--index-url must name a simple index (the URL pip's index-url names, e.g. https://pypi.org/simple)"
