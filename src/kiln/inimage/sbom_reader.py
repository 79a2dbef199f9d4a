"""What an image holds, read from its own filesystem: runs INSIDE the image.

`kiln.domain.supplychain.sbom` sends this file's source as `python -c` to a network-less container
of the image (the image's own interpreter, so its `sys.path` is the serving
environment's) and reads the one JSON line it prints after ``KILN-SBOM ``. It imports
nothing of kiln and only the standard library, so it runs on any Python >= 3.8 an image
carries. On the host, tests call `inventory()` on a directory laid out like an image.

Read, never guessed:
- Debian packages from dpkg's database (`/var/lib/dpkg/status`, plus distroless-style
  `/var/lib/dpkg/status.d/*`), every package with files on disk;
- Python distributions from every ``*.dist-info`` / ``*.egg-info`` of each Python
  environment: the interpreter's `sys.path` plus the usual system and `/opt` locations;
- kiln's patch manifest (`/opt/kiln/patches.json`), the OS release, and
- every regular file under the model roots the caller names (path, size, sha256).

Environment (all optional): KILN_SBOM_ROOT (default "/"), KILN_SBOM_MODEL_ROOTS (JSON
list of absolute paths), KILN_SBOM_SITE_DIRS (JSON list; replaces the discovered ones).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import sys
from collections.abc import Iterable
from email.parser import HeaderParser
from typing import Any, TypedDict

_MARKER = "KILN-SBOM"
# dpkg states whose files are on disk (`not-installed` and `config-files` have none)
_ON_DISK = {"installed", "unpacked", "half-installed", "half-configured", "triggers-awaited", "triggers-pending"}
_LICENSE_TEXT_MAX = 2000  # a License field may hold the whole licence text; the start is enough
_SYSTEM_SITE_GLOBS = (
    "/usr/lib/python3/dist-packages",
    "/usr/lib/python3*/site-packages",
    "/usr/local/lib/python3*/dist-packages",
    "/usr/local/lib/python3*/site-packages",
    "/opt/*/lib/python3*/site-packages",
    "/opt/*/*/lib/python3*/site-packages",
)


class _DebianPackage(TypedDict):
    name: str
    version: str
    architecture: str
    source: str
    source_version: str
    state: str
    maintainer: str
    homepage: str
    summary: str
    installed_size_kib: str
    database: str  # the status file it is listed in (image path)


class _Distribution(TypedDict):
    name: str
    version: str
    summary: str
    license_expression: str
    license: str
    classifiers: list[str]  # the License :: ones
    home_page: str
    project_urls: list[str]
    author: str
    installer: str
    direct_url: Any
    owns_files: bool | None
    location: str
    metadata_dir: str


class _ModelFile(TypedDict):
    path: str
    root: str
    size: int
    sha256: str


class _Inventory(TypedDict):
    """The document printed after MARKER (kiln.domain.supplychain.sbom reads it)."""

    os_release: dict[str, str]
    debian_packages: list[_DebianPackage]
    site_dirs: list[str]
    python_distributions: list[_Distribution]
    patch_manifest: Any
    model_roots: list[str]
    model_files: list[_ModelFile]
    python: str


def _under(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _image_path(root: str, path: str) -> str:
    """`path` (on the host) as the image sees it."""
    rel = os.path.relpath(path, root)
    return "/" + ("" if rel == "." else rel)


# -- Debian ---------------------------------------------------------------------------
def _parse_dpkg_status(text: str) -> list[dict[str, str]]:
    """Each paragraph of a dpkg status file as a dict (continuation lines joined)."""
    out: list[dict[str, str]] = []
    cur: dict[str, str] = {}
    key: str | None = None
    for line in text.splitlines():
        if not line.strip():
            if cur:
                out.append(cur)
            cur, key = {}, None
        elif line[0] in " \t":
            if key is not None:
                cur[key] += "\n" + line[1:]
        elif ":" in line:
            key, _, value = line.partition(":")
            cur[key] = value.strip()
    if cur:
        out.append(cur)
    return out


def debian_packages(root: str) -> list[_DebianPackage]:
    """The Debian packages dpkg records under `root` (status and status.d)."""
    files = [_under(root, "/var/lib/dpkg/status")]
    files += sorted(glob.glob(_under(root, "/var/lib/dpkg/status.d/*")))
    out: list[_DebianPackage] = []
    for path in files:
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as fh:
            paragraphs = _parse_dpkg_status(fh.read())
        for p in paragraphs:
            state = (p.get("Status") or "install ok installed").split()[-1]
            if "Package" not in p or state not in _ON_DISK:
                continue
            source, source_version = p.get("Source", ""), ""
            if "(" in source:  # "Source: glibc (2.36-9+deb12u9)": built from another version
                source, _, rest = source.partition("(")
                source, source_version = source.strip(), rest.rstrip(")").strip()
            out.append(
                {
                    "name": p["Package"],
                    "version": p.get("Version", ""),
                    "architecture": p.get("Architecture", ""),
                    "source": source,
                    "source_version": source_version,
                    "state": state,
                    "maintainer": p.get("Maintainer", ""),
                    "homepage": p.get("Homepage", ""),
                    "summary": (p.get("Description") or "").split("\n", 1)[0],
                    "installed_size_kib": p.get("Installed-Size", ""),
                    "database": _image_path(root, path),
                }
            )
    return out


# -- Python ---------------------------------------------------------------------------
def _site_dirs(root: str) -> list[str]:
    """Absolute (image) paths of the directories that can hold distributions."""
    given = os.environ.get("KILN_SBOM_SITE_DIRS")
    if given:
        candidates = _env_paths("KILN_SBOM_SITE_DIRS")
    else:
        # the running interpreter's path only describes the image when it runs in it
        candidates = [p for p in sys.path if p and os.path.isabs(p)] if root == "/" else []
        for pattern in _SYSTEM_SITE_GLOBS:
            candidates += sorted(_image_path(root, p) for p in glob.glob(_under(root, pattern)))
    out: list[str] = []
    seen: set[str] = set()
    for d in candidates:
        host = _under(root, d)
        if not os.path.isdir(host):
            continue
        real = os.path.realpath(host)
        if real in seen:
            continue
        seen.add(real)
        out.append(d)
    return out


def _read(path: str, limit: int | None = None) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read() if limit is None else fh.read(limit)
    except OSError:
        return None


def _record_owns_files(info_dir: str) -> bool | None:
    """Whether RECORD lists a file outside the metadata directory itself: a dist whose
    RECORD does not (or that has none) installed no code of its own."""
    record = _read(os.path.join(info_dir, "RECORD"))
    if record is None:
        return None
    base = os.path.basename(info_dir) + "/"
    return any(line and not line.startswith(base) for line in record.splitlines())


def _distribution(info_dir: str, location: str) -> _Distribution | None:
    meta_file = "PKG-INFO" if info_dir.endswith(".egg-info") else "METADATA"
    if os.path.isfile(info_dir):  # a bare `NAME.egg-info` file is the metadata itself
        text, meta_file = _read(info_dir), ""
    else:
        text = _read(os.path.join(info_dir, meta_file))
    if text is None:
        return None
    msg = HeaderParser().parsestr(text)
    name, version = msg.get("Name"), msg.get("Version")
    if not name or not version:
        return None
    direct_url: Any = None  # direct_url.json (PEP 610), as the installer wrote it
    raw = _read(os.path.join(info_dir, "direct_url.json")) if os.path.isdir(info_dir) else None
    if raw:
        try:
            direct_url = json.loads(raw)
        except ValueError:
            direct_url = None
    license_text = msg.get("License") or ""
    return {
        "name": name.strip(),
        "version": version.strip(),
        "summary": (msg.get("Summary") or "").strip(),
        "license_expression": (msg.get("License-Expression") or "").strip(),
        "license": license_text.strip()[:_LICENSE_TEXT_MAX],
        "classifiers": [c.strip() for c in msg.get_all("Classifier") or [] if c.strip().startswith("License ::")],
        "home_page": (msg.get("Home-page") or "").strip(),
        "project_urls": [u.strip() for u in msg.get_all("Project-URL") or []],
        "author": (msg.get("Author") or msg.get("Author-email") or "").strip(),
        "installer": (_read(os.path.join(info_dir, "INSTALLER")) or "").strip() if os.path.isdir(info_dir) else "",
        "direct_url": direct_url,
        "owns_files": _record_owns_files(info_dir) if os.path.isdir(info_dir) else None,
        "location": location,
        "metadata_dir": location.rstrip("/") + "/" + os.path.basename(info_dir),
    }


def _python_distributions(root: str, dirs: list[str]) -> list[_Distribution]:
    out: list[_Distribution] = []
    for d in dirs:
        host = _under(root, d)
        for entry in sorted(os.listdir(host)):
            if not entry.endswith((".dist-info", ".egg-info")):
                continue
            dist = _distribution(os.path.join(host, entry), d)
            if dist is not None:
                out.append(dist)
    return out


# -- kiln's own records, the OS, model files -------------------------------------------
def _patch_manifest(root: str) -> Any:  # kiln_patching.py's manifest, as it wrote it
    raw = _read(_under(root, "/opt/kiln/patches.json"))
    if raw is None:
        return None
    return json.loads(raw)


def _os_release(root: str) -> dict[str, str]:
    for path in ("/etc/os-release", "/usr/lib/os-release"):
        raw = _read(_under(root, path))
        if raw is None:
            continue
        out: dict[str, str] = {}
        for line in raw.splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip() and not key.startswith("#"):
                out[key.strip()] = value.strip().strip('"').strip("'")
        return out
    return {}


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _model_files(root: str, roots: Iterable[str]) -> list[_ModelFile]:
    """Every regular file under each existing model root (symlinks are not followed:
    what they point to is listed where it lives, if under a root)."""
    out: list[_ModelFile] = []
    seen: set[str] = set()
    for model_root in roots:
        host_root = _under(root, model_root)
        if not os.path.isdir(host_root):
            continue
        for dirpath, dirnames, filenames in os.walk(host_root):
            dirnames.sort()
            for fname in sorted(filenames):
                host = os.path.join(dirpath, fname)
                path = _image_path(root, host)
                if path in seen or os.path.islink(host) or not os.path.isfile(host):
                    continue
                seen.add(path)
                out.append({"path": path, "root": model_root, "size": os.path.getsize(host), "sha256": _sha256(host)})
    return out


def inventory(root: str = "/", model_roots: Iterable[str] = ()) -> _Inventory:
    """What an SBOM needs of the filesystem at `root`: OS release, Debian and Python packages, the patch manifest and
    model folders."""
    dirs = _site_dirs(root)
    return {
        "os_release": _os_release(root),
        "debian_packages": debian_packages(root),
        "site_dirs": dirs,
        "python_distributions": _python_distributions(root, dirs),
        "patch_manifest": _patch_manifest(root),
        "model_roots": [r for r in model_roots if os.path.isdir(_under(root, r))],
        "model_files": _model_files(root, model_roots),
        "python": ".".join(str(n) for n in sys.version_info[:3]),
    }


def _env_paths(name: str) -> list[str]:
    """$`name` as kiln sets it: a JSON list of paths (plain checks: no pydantic here);
    SystemExit, one line, when it is not one."""
    try:
        raw: Any = json.loads(os.environ.get(name) or "[]")
    except ValueError as exc:
        raise SystemExit(f"{name}: not JSON ({exc})") from None
    if not isinstance(raw, list) or not all(isinstance(p, str) for p in raw):
        raise SystemExit(f"{name}: must be a JSON list of paths")
    paths: list[str] = raw
    return paths


def main() -> None:
    """Print the inventory of KILN_SBOM_ROOT as one marked JSON line."""
    root = os.environ.get("KILN_SBOM_ROOT", "/")
    model_roots = _env_paths("KILN_SBOM_MODEL_ROOTS")
    print(_MARKER + " " + json.dumps(inventory(root, model_roots), sort_keys=True))


if __name__ == "__main__":
    main()
