"""The wall clock, in the forms kiln writes it (records, labels, SBOM metadata).

One place reads the time, so every document kiln writes spells it the same way and a
test can tell a timestamp kiln made from one it was handed."""

from __future__ import annotations

import datetime as _dt


def now() -> _dt.datetime:
    """The current time, timezone-aware, in UTC."""
    return _dt.datetime.now(_dt.UTC)


def timestamp() -> str:
    """RFC 3339 UTC to the second with a `Z` (2026-12-01T21:17:19Z): OCI's
    `org.opencontainers.image.created`, CycloneDX's `metadata.timestamp`, records."""
    return now().replace(microsecond=0).isoformat().replace("+00:00", "Z")


def file_stamp() -> str:
    """The current time for a file name, sortable and unique per microsecond
    (20261201T211719.123456Z): no colons, which some file systems refuse."""
    return now().strftime("%Y%m%dT%H%M%S.%fZ")
