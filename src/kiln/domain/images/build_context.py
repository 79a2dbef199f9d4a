"""Deterministic build contexts and input digests.

The digest is the image's identity: the same inputs always give the same digest and
any changed byte gives another one, so "is this image already built?" is one lookup.
The tar sent to the daemon is deterministic too (sorted entries, mtime 0, uid/gid 0),
which keeps the daemon's layer cache hitting across checkouts and machines.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

from kiln.basics.files import sha256_file

_SKIP_NAMES = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".git", ".DS_Store"}
_SKIP_SUFFIXES = (".pyc", ".pyo", ".swp")


@dataclass(frozen=True)
class _Entry:
    arcname: str
    mode: int
    body: Path | bytes  # a host file (read when the context is sent) or bytes kiln made
    # secret entries travel in the context but never into the digest or labels (CA bundle)
    in_digest: bool = True

    @property
    def source(self) -> Path | None:
        """The host file behind the entry; None for bytes kiln made."""
        return self.body if isinstance(self.body, Path) else None

    def content(self) -> bytes:
        return self.body if isinstance(self.body, bytes) else self.body.read_bytes()

    def size(self) -> int:
        return len(self.body) if isinstance(self.body, bytes) else self.body.stat().st_size

    def sha256(self) -> str:
        return hashlib.sha256(self.body).hexdigest() if isinstance(self.body, bytes) else sha256_file(self.body)


def _mode(path: Path) -> int:
    # only the executable bit is an input; umask differences between checkouts are not
    return 0o755 if path.stat().st_mode & 0o111 else 0o644


class BuildContext:
    """The files a docker build sees, plus the non-file inputs of its digest."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._params: dict[str, str] = {}
        self._appendix: dict[str, bytes] = {}
        self._sources: dict[Path, tuple[str, ...]] = {}  # host files/trees -> excluded subpaths

    # -- adding inputs -----------------------------------------------------
    def add_file(self, arcname: str, path: Path, *, in_digest: bool = True) -> None:
        """Add a file under `arcname`; with `in_digest`, its bytes count in the input digest."""
        if in_digest:
            self._sources.setdefault(path, ())
        self._put(_Entry(arcname, _mode(path), path, in_digest))

    def add_bytes(self, arcname: str, data: bytes, *, mode: int = 0o644, in_digest: bool = True) -> None:
        """Add bytes as a file under `arcname`."""
        self._put(_Entry(arcname, mode, data, in_digest))

    def add_tree(self, prefix: str, directory: Path, *, exclude: tuple[str, ...] = ()) -> None:
        """Add a folder's files under `prefix`, minus build debris and the relative paths in `exclude`."""
        self._sources[directory] = exclude
        for path in sorted(directory.rglob("*")):
            rel = path.relative_to(directory)
            if any(part in _SKIP_NAMES or part.endswith(".egg-info") for part in rel.parts):
                continue
            if path.is_dir() or path.name.endswith(_SKIP_SUFFIXES):
                continue
            if any(rel.as_posix() == ex or rel.as_posix().startswith(ex + "/") for ex in exclude):
                continue
            self._put(_Entry(f"{prefix}/{rel.as_posix()}" if prefix else rel.as_posix(), _mode(path), path))

    def add_source(self, path: Path) -> None:
        """A host file whose bytes went into an entry kiln made (`add_bytes`): a source of
        the image for its source date, though no entry is that file."""
        self._sources.setdefault(path, ())

    def append_at_build(self, arcname: str, data: bytes) -> None:
        """Bytes appended to an entry in the tar only, never in the digest: build-time
        facts such as the `created` label must not change an image's identity."""
        if arcname not in self._entries:
            raise KeyError(arcname)
        self._appendix[arcname] = data

    def add_param(self, key: str, value: str) -> None:
        """A non-file input (engine pin, base image ref, build args)."""
        self._params[key] = value

    def _put(self, entry: _Entry) -> None:
        name = entry.arcname.strip("/")
        if name in self._entries:
            raise ValueError(f"build context entry {name!r} added twice")
        self._entries[name] = replace(entry, arcname=name)

    # -- reading it back ---------------------------------------------------
    @property
    def entries(self) -> list[_Entry]:
        """The context's entries, by archive name."""
        return [self._entries[k] for k in sorted(self._entries)]

    @property
    def params(self) -> dict[str, str]:
        """The build parameters in the digest, sorted by name."""
        return dict(sorted(self._params.items()))

    @property
    def sources(self) -> dict[Path, tuple[str, ...]]:
        """The host files and folders (with their excluded subpaths) whose bytes are in
        the digest: what the image's source date is taken from."""
        return dict(self._sources)

    def has(self, arcname: str) -> bool:
        """Whether the context holds an entry at `arcname`."""
        return arcname in self._entries

    def manifest(self) -> list[tuple[str, int, str]]:
        """(arcname, mode, sha256) of every digested entry, sorted."""
        out = []
        for e in self.entries:
            if not e.in_digest:
                continue
            out.append((e.arcname, e.mode, e.sha256()))
        return out

    def digest(self) -> str:
        """The input digest: sha256 of the manifest and the parameters."""
        doc = {"files": self.manifest(), "params": self.params, "format": 1}
        raw = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
        return "sha256:" + hashlib.sha256(raw).hexdigest()

    def size(self) -> int:
        """The context's size in bytes, entries and appendix together."""
        return sum(e.size() for e in self.entries) + sum(len(v) for v in self._appendix.values())

    def write_tar(self, fileobj: IO[bytes]) -> None:
        """Write the context as a PAX tar with fixed owners, modes and times."""
        with tarfile.open(fileobj=fileobj, mode="w", format=tarfile.PAX_FORMAT) as tar:
            dirs: set[str] = set()
            for e in self.entries:
                parts = e.arcname.split("/")[:-1]
                for i in range(1, len(parts) + 1):
                    d = "/".join(parts[:i])
                    if d not in dirs:
                        dirs.add(d)
                        tar.addfile(_info(d, tarfile.DIRTYPE, 0o755, 0))
                extra = self._appendix.get(e.arcname)
                if extra is not None:
                    data = e.content() + extra
                    tar.addfile(_info(e.arcname, tarfile.REGTYPE, e.mode, len(data)), io.BytesIO(data))
                    continue
                info = _info(e.arcname, tarfile.REGTYPE, e.mode, e.size())
                if isinstance(e.body, bytes):
                    tar.addfile(info, io.BytesIO(e.body))
                else:
                    with e.body.open("rb") as fh:
                        tar.addfile(info, fh)

    def tar_bytes(self) -> bytes:
        """The context as tar bytes."""
        buf = io.BytesIO()
        self.write_tar(buf)
        return buf.getvalue()


def _info(name: str, kind: bytes, mode: int, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info
