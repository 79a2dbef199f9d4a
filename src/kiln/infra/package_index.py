"""The Python package index and uv, as `kiln engine lock` and the locked wheelhouse use them.

- `project(name)`: one project's files and versions from the index's JSON simple API
  (PEP 691; PEP 700 for `versions`), with each file's sha256 and yanked flag. A
  transient failure (a resolver that answers "try again", a timeout, a reset, HTTP 429
  or 5xx) is tried again after 1, 2 and 4 s; anything else fails at once.
- `compile_pins(...)`: `uv pip compile` for one target platform, read back as pins.
- `wheel_releases(name, index=..., cafile=...)`: the final releases of one project that
  have a wheel not yanked, from the JSON simple API (PEP 691) or, where the index only
  speaks HTML, from its PEP 503 page (`kiln engine outdated`). Tried again as `project`.
- `download(url, dest, sha256)`: one file, hashed while it streams, moved into place
  only when the hash is the expected one.
- `_pip_setting(key)`: pip's own configuration (index-url, find-links, cert), so kiln
  resolves and downloads from where the host's pip does; `index_cafile()` the CA bundle
  for the index's TLS (pip's cert, else REQUESTS_CA_BUNDLE).
"""

from __future__ import annotations

import hashlib
import http.client
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from html.parser import HTMLParser
from pathlib import Path
from typing import NotRequired, TypedDict

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from kiln.basics.documents import Shape
from kiln.basics.errors import (
    EngineFetchFailed,
    LockInvalid,
    PackageIndexInvalid,
    PackageIndexUnreachable,
    one_line,
)
from kiln.basics.paths import cache_dir

_DEFAULT_INDEX = "https://pypi.org/simple"
_ACCEPT = "application/vnd.pypi.simple.v1+json"
# Waits before each new try of an index page. CI met "Temporary failure in name
# resolution" for pypi.org mid-run, twice in one day, each gone within seconds; a lock
# or a bump that fails on one such blip costs the whole run, while waiting 7 s does not.
_RETRY_WAITS_S = (1.0, 2.0, 4.0)
_TRANSIENT_HTTP = frozenset({429, 500, 502, 503, 504})
# `wheel_releases` asks for JSON and takes HTML (PEP 691's content negotiation)
_SIMPLE_ACCEPT = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.1"
_JSON_TYPES = frozenset({"application/vnd.pypi.simple.v1+json", "application/json"})
_HTML_TYPES = frozenset({"application/vnd.pypi.simple.v1+html", "text/html"})
# PyPI's page for vllm is ~130 kB; a page far larger is no index page worth reading
_MAX_PAGE_BYTES = 32 << 20


# -- a PEP 691 (JSON simple API) project page: what kiln reads of it
_IndexFileJson = TypedDict(
    "_IndexFileJson",
    {
        "filename": str,
        "url": str,
        "hashes": NotRequired[dict[str, str]],  # hash name -> hex digest
        "yanked": NotRequired[bool | str | None],  # false, true, or the reason (yanked)
        "requires-python": NotRequired[str | None],
    },
)


class _ProjectPageJson(TypedDict):
    name: NotRequired[str]
    versions: NotRequired[list[str]]  # PEP 700
    files: list[_IndexFileJson]


_PROJECT_PAGE = Shape(_ProjectPageJson)


@dataclass(frozen=True)
class _IndexFile:
    filename: str
    url: str
    sha256: str
    yanked: bool
    requires_python: str | None


@dataclass(frozen=True)
class Project:
    """A project on the package index: its name, every version it lists and its files."""

    name: str
    versions: list[str]  # every release the index lists (PEP 700), in its order
    files: list[_IndexFile]


@dataclass(frozen=True)
class Pin:
    """A distribution pinned to one version."""

    name: str
    version: str


@cache
def _pip_setting(key: str) -> str | None:
    """`pip config get global.<key>` (the PIP_<KEY> variable wins, as in pip)."""
    env = os.environ.get("PIP_" + key.upper().replace("-", "_"))
    if env:
        return env
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "config", "get", f"global.{key}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def index_url() -> str:
    """The package index kiln reads: pip's configured index-url, else PyPI's."""
    return (_pip_setting("index-url") or _DEFAULT_INDEX).rstrip("/")


def find_links() -> list[str]:
    """pip's find-links that are local folders (torch's CPU build lives in one)."""
    raw = _pip_setting("find-links") or ""
    return [p for p in raw.split() if p and not p.startswith(("http://", "https://")) and Path(p).is_dir()]


def index_cafile() -> Path | None:
    """The CA bundle pip trusts for the index (PIP_CERT, pip's `cert`), else
    REQUESTS_CA_BUNDLE; None: the system's default trust store."""
    value = _pip_setting("cert") or os.environ.get("REQUESTS_CA_BUNDLE")
    return Path(value) if value else None


def _ssl_context(cafile: Path | None) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(cafile) if cafile else None)


def _normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def project(name: str, *, cafile: Path | None, index: str | None = None) -> Project:
    """One project's index page, as JSON."""
    url = f"{index or index_url()}/{_normalise(name)}/"
    doc = _PROJECT_PAGE.parse(_index_page(url, cafile), source=f"package index {url}", error=PackageIndexInvalid)
    files = []
    for f in doc["files"]:
        sha = (f.get("hashes") or {}).get("sha256")
        if not sha:
            continue  # a file the index gives no sha256 for cannot be locked
        files.append(_IndexFile(f["filename"], f["url"], sha, bool(f.get("yanked")), f.get("requires-python")))
    return Project(doc.get("name", name), list(doc.get("versions") or []), files)


def _transient(exc: BaseException) -> bool:
    """A failure that the same request may not meet a few seconds later."""
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code in _TRANSIENT_HTTP
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, socket.gaierror):
        return reason.errno == socket.EAI_AGAIN  # "try again"; not "no such name"
    return isinstance(reason, (TimeoutError, ConnectionResetError))


def _index_page(url: str, cafile: Path | None) -> bytes:
    req = urllib.request.Request(url, headers={"Accept": _ACCEPT})
    for wait in (*_RETRY_WAITS_S, None):
        try:
            with urllib.request.urlopen(req, timeout=120, context=_ssl_context(cafile)) as resp:
                body: bytes = resp.read()
                return body
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
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=600, context=_ssl_context(cafile)) as resp:
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


def compile_pins(
    requirements: list[str],
    *,
    uv_platform: str,
    python: str,
    cafile: Path | None,
    excludes: Sequence[str] = (),
    constraints: Sequence[str] = (),
    overrides: Sequence[str] = (),
) -> list[Pin]:
    """`uv pip compile` of `requirements` for one target platform: exact pins, sorted."""
    with tempfile.TemporaryDirectory(prefix="kiln-lock-") as tmp:
        d = Path(tmp)
        (d / "in.txt").write_text("".join(r + "\n" for r in requirements))
        cmd = [
            uv_binary(),
            "pip",
            "compile",
            str(d / "in.txt"),
            "-o",
            str(d / "out.txt"),
            "--python-platform",
            uv_platform,
            "--python-version",
            python,
            "--index-url",
            index_url(),
            "--no-header",
            "--no-annotate",
            "--quiet",
            "--only-binary",
            ":all:",
        ]
        for flag, lines, fname in (
            ("--excludes", excludes, "ex.txt"),
            ("--constraints", constraints, "c.txt"),
            ("--overrides", overrides, "ov.txt"),
        ):
            if lines:
                (d / fname).write_text("".join(x + "\n" for x in lines))
                cmd += [flag, str(d / fname)]
        for link in find_links():
            cmd += ["--find-links", link]
        env = {
            **os.environ,
            **({"SSL_CERT_FILE": str(cafile)} if cafile else {}),
            "UV_NO_CONFIG": "1",
            "UV_CACHE_DIR": os.environ.get("UV_CACHE_DIR", str(cache_dir() / "uv")),
        }
        env.pop("UV_INDEX_URL", None)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, check=False)
        if proc.returncode != 0:
            lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
            raise LockInvalid(f"uv pip compile ({uv_platform}) found no solution: " + " ".join(lines[-4:])[:600])
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


def wheel_releases(name: str, *, index: str, cafile: Path | None) -> list[str] | None:
    """The final releases (no pre- or dev releases) of project `name` on `index` that
    have at least one wheel that is not yanked, oldest first; None when the index has
    no page for the project (HTTP 404). A page that is neither simple-API JSON nor
    HTML with links is `PackageIndexInvalid`; no answer at all `PackageIndexUnreachable`."""
    url = f"{index.rstrip('/')}/{canonicalize_name(name)}/"
    answer = _simple_page(url, cafile)
    if answer is None:
        return None
    media, body = answer
    is_json = media in _JSON_TYPES or (media not in _HTML_TYPES and body.lstrip()[:1] == b"{")
    files = _json_files(url, body) if is_json else _html_files(url, body)
    versions: set[Version] = set()
    for filename, yanked in files:
        if yanked or not filename.endswith(".whl"):
            continue
        try:
            project, version, _, _ = parse_wheel_filename(filename)
        except (InvalidWheelFilename, InvalidVersion):
            continue  # not a wheel pip could install either
        if project == canonicalize_name(name) and not version.is_prerelease:
            versions.add(version)
    return [str(v) for v in sorted(versions)]


def _simple_page(url: str, cafile: Path | None) -> tuple[str, bytes] | None:
    """(media type, body) of one index page, None on HTTP 404; transient failures are
    tried again as `project`'s are."""
    req = urllib.request.Request(url, headers={"Accept": _SIMPLE_ACCEPT})
    for wait in (*_RETRY_WAITS_S, None):
        try:
            with urllib.request.urlopen(req, timeout=60, context=_ssl_context(cafile)) as resp:
                media = (resp.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
                body = resp.read(_MAX_PAGE_BYTES + 1)
            if len(body) > _MAX_PAGE_BYTES:
                raise PackageIndexInvalid(
                    f"package index {url}: the answer is over {_MAX_PAGE_BYTES:,} bytes; no index page is that large"
                )
            return media, body
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            if wait is None or not _transient(exc):
                raise PackageIndexUnreachable(f"could not ask the package index {url}: HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
            if wait is None or not _transient(exc):
                reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
                raise PackageIndexUnreachable(
                    f"could not ask the package index {url}: {one_line(str(reason) or type(reason).__name__)}"
                ) from None
        time.sleep(wait)
    raise AssertionError("unreachable: the last try returns or raises")


def _json_files(url: str, body: bytes) -> list[tuple[str, bool]]:
    """(filename, yanked) of each file a PEP 691 JSON page lists."""
    doc = _PROJECT_PAGE.parse(body, source=f"package index {url}", error=PackageIndexInvalid)
    # PEP 691: `yanked` is false, true, or the reason (a string) when yanked
    return [(f["filename"], f.get("yanked") not in (None, False)) for f in doc["files"]]


class _Links(HTMLParser):
    """The anchors of a PEP 503 page: (filename, yanked) each."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, bool]] = []
        self._open: tuple[str, bool] | None = None
        self._text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            found = dict(attrs)
            path = urllib.parse.urlsplit(found.get("href") or "").path
            self._open = (urllib.parse.unquote(path.rsplit("/", 1)[-1]), "data-yanked" in found)
            self._text = ""

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._text += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._open is not None:
            filename, yanked = self._open
            self.links.append((filename or self._text.strip(), yanked))
            self._open = None


def _html_files(url: str, body: bytes) -> list[tuple[str, bool]]:
    """(filename, yanked) of each link of a PEP 503 page; a page without links is no index page."""
    parser = _Links()
    parser.feed(body.decode("utf-8", errors="replace"))
    parser.close()
    if not parser.links:
        raise PackageIndexInvalid(
            f"package index {url}: the answer is neither simple-API JSON nor an HTML page with links (PEP 503)"
        )
    return parser.links
