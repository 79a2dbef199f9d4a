"""Files on disk: whole-file atomic writes and the sha256 of a file.

A record, cache entry, lock or SBOM that a reader finds must be whole: each is written
to a temporary file in the same folder (same file system, so the rename is atomic) and
renamed over its name. Callers make the folder; a folder that is not there is their
error to report (`kiln sbom -o missing/x.json` must not create `missing/`)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, data: str | bytes, *, mode: int = 0o644) -> None:
    """Replace `path` with `data` (text as UTF-8) in one rename: a reader sees the old
    file or the new one, never half of one, and a failure leaves no temporary file
    behind. The file gets `mode` (mkstemp's own 0600 would hide a lock or an SBOM from
    the other users of a checkout). OSError as the file system raised it."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), mode)
            fh.write(raw)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in blocks (wheels run to gigabytes)."""
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()
