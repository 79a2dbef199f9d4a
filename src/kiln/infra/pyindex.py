"""The Python package index and uv, as `kiln engine lock` and the locked wheelhouse use them.

- `project(name)`: one project's files and versions from the index's JSON simple API
  (PEP 691; PEP 700 for `versions`), with each file's sha256 and yanked flag. A
  transient failure (a resolver that answers "try again", a timeout, a reset, HTTP 429
  or 5xx) is tried again after 1, 2 and 4 s; anything else fails at once.
- `compile_pins(...)`: `uv pip compile` for one target platform, read back as pins.
- `download(url, dest, sha256)`: one file, hashed while it streams, moved into place
  only when the hash is the expected one.
- `pip_setting(key)`: pip's own configuration (index-url, find-links, cert), so kiln
  resolves and downloads from where the host's pip does.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from kiln.basics.errors import EngineFetchFailed, LockInvalid
from kiln.basics.paths import cache_dir

DEFAULT_INDEX = "https://pypi.org/simple"
_ACCEPT = "application/vnd.pypi.simple.v1+json"
# Waits before each new try of an index page. CI met "Temporary failure in name
# resolution" for pypi.org mid-run, twice in one day, each gone within seconds; a lock
# or a bump that fails on one such blip costs the whole run, while waiting 7 s does not.
_RETRY_WAITS_S = (1.0, 2.0, 4.0)
_TRANSIENT_HTTP = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True)
class IndexFile:
    filename: str
    url: str
    sha256: str
    yanked: bool
    requires_python: str | None


@dataclass(frozen=True)
class Project:
    name: str
    versions: list[str]  # every release the index lists (PEP 700), in its order
    files: list[IndexFile]


@dataclass(frozen=True)
class Pin:
    name: str
    version: str


@cache
def pip_setting(key: str) -> str | None:
    """`pip config get global.<key>` (the PIP_<KEY> variable wins, as in pip)."""
    env = os.environ.get("PIP_" + key.upper().replace("-", "_"))
    if env:
        return env
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "get", f"global.{key}"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def index_url() -> str:
    return (pip_setting("index-url") or DEFAULT_INDEX).rstrip("/")


def find_links() -> list[str]:
    """pip's find-links that are local folders (torch's CPU build lives in one)."""
    raw = pip_setting("find-links") or ""
    return [p for p in raw.split() if p and not p.startswith(("http://", "https://")) and Path(p).is_dir()]


def _ssl_context(cafile: Path | None) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(cafile) if cafile else None)


def _normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def project(name: str, *, cafile: Path | None, index: str | None = None) -> Project:
    """One project's index page, as JSON."""
    url = f"{index or index_url()}/{_normalise(name)}/"
    doc = _index_page(url, cafile)
    files = []
    for f in doc.get("files", []):
        sha = (f.get("hashes") or {}).get("sha256")
        if not sha:
            continue  # a file the index gives no sha256 for cannot be locked
        files.append(IndexFile(f["filename"], f["url"], sha, bool(f.get("yanked")), f.get("requires-python")))
    return Project(doc.get("name", name), list(doc.get("versions") or []), files)


def _transient(exc: BaseException) -> bool:
    """A failure that the same request may not meet a few seconds later."""
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code in _TRANSIENT_HTTP
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, socket.gaierror):
        return reason.errno == socket.EAI_AGAIN  # "try again"; not "no such name"
    return isinstance(reason, (TimeoutError, ConnectionResetError))


def _index_page(url: str, cafile: Path | None) -> dict[str, Any]:
    req = urllib.request.Request(url, headers={"Accept": _ACCEPT})
    for wait in (*_RETRY_WAITS_S, None):
        try:
            with urllib.request.urlopen(req, timeout=120, context=_ssl_context(cafile)) as resp:
                doc: dict[str, Any] = json.load(resp)
                return doc
        except (urllib.error.URLError, OSError, ValueError) as exc:
            if wait is None or not _transient(exc):
                detail = f"HTTP {exc.code}" if isinstance(exc, urllib.error.HTTPError) else str(exc)
                raise EngineFetchFailed(f"package index: {url}: {detail}") from None
            time.sleep(wait)
    raise AssertionError("unreachable: the last try returns or raises")


def download(url: str, dest: Path, sha256: str, *, cafile: Path | None) -> str:
    """Stream `url` into `dest` and return its sha256. `dest` appears only when the
    hash is `sha256`; otherwise the bytes are dropped and the hash that came is returned."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".dl-")
    try:
        with os.fdopen(fd, "wb") as out, \
                urllib.request.urlopen(url, timeout=600, context=_ssl_context(cafile)) as resp:
            for chunk in iter(lambda: resp.read(1 << 20), b""):
                h.update(chunk)
                out.write(chunk)
        got = h.hexdigest()
        if got == sha256:
            os.replace(tmp, dest)
        return got
    except (urllib.error.URLError, OSError) as exc:
        raise EngineFetchFailed(f"download {url}: {exc}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def uv_binary() -> str:
    """The uv that kiln's dev extra installs next to it (PyPI's `uv` package)."""
    try:
        from uv import find_uv_bin  # optional: only `kiln engine lock` resolves
    except ImportError:
        raise LockInvalid("`kiln engine lock` needs uv: pip install uv (it is in kiln's dev extra)") from None
    return find_uv_bin()


def compile_pins(requirements: list[str], *, uv_platform: str, python: str, cafile: Path | None,
                 excludes: Sequence[str] = (), constraints: Sequence[str] = (),
                 overrides: Sequence[str] = ()) -> list[Pin]:
    """`uv pip compile` of `requirements` for one target platform: exact pins, sorted."""
    with tempfile.TemporaryDirectory(prefix="kiln-lock-") as tmp:
        d = Path(tmp)
        (d / "in.txt").write_text("".join(r + "\n" for r in requirements))
        cmd = [uv_binary(), "pip", "compile", str(d / "in.txt"), "-o", str(d / "out.txt"),
               "--python-platform", uv_platform, "--python-version", python,
               "--index-url", index_url(), "--no-header", "--no-annotate", "--quiet",
               "--only-binary", ":all:"]
        for flag, lines, fname in (("--excludes", excludes, "ex.txt"), ("--constraints", constraints, "c.txt"),
                                   ("--overrides", overrides, "ov.txt")):
            if lines:
                (d / fname).write_text("".join(x + "\n" for x in lines))
                cmd += [flag, str(d / fname)]
        for link in find_links():
            cmd += ["--find-links", link]
        env = {**os.environ, **({"SSL_CERT_FILE": str(cafile)} if cafile else {}),
               "UV_NO_CONFIG": "1", "UV_CACHE_DIR": os.environ.get("UV_CACHE_DIR", str(cache_dir() / "uv"))}
        env.pop("UV_INDEX_URL", None)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
        if proc.returncode != 0:
            lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
            raise LockInvalid(f"uv pip compile ({uv_platform}) found no solution: "
                              + " ".join(lines[-4:])[:600])
        pins = []
        for raw in (d / "out.txt").read_text().splitlines():
            line = raw.split("#", 1)[0].strip()
            if not line or line.startswith("-"):
                continue
            name, sep, version = line.partition("==")
            if not sep:
                raise LockInvalid(f"uv pip compile wrote an unpinned line: {line!r}")
            pins.append(Pin(name.strip(), version.split(";", 1)[0].strip()))
        return sorted(pins, key=lambda p: _normalise(p.name))
