"""Reading the engine and base lock files (the shape: docs of `kiln engine lock`).

The SBOM takes each Python distribution's wheel sha256 from the engine lock and the
provenance lists the locked distributions as resolved dependencies. This module only
reads: `kiln engine lock` writes the files. A missing lock is no error (an engine pinned
before locks existed has none); a lock that is there but unreadable is one, because a
supply-chain document built past it would silently drop hashes.

    docker-images/engine-<flavour>/locks/<engine>-<version>.lock.json
    docker-images/base/locks/<suite>.lock.json
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from kiln.basics.errors import SbomReadFailed
from kiln.basics.paths import repo_root
from kiln.domain.recipe import Engine


@dataclass(frozen=True)
class LockedWheel:
    name: str  # as the lock spells it
    version: str
    file: str
    sha256: str  # hex
    url: str | None  # None: only on a local find-links (e.g. torch's CPU build)


@dataclass(frozen=True)
class LockedDebian:
    name: str
    version: str
    architecture: str


@dataclass
class Lock:
    path: Path
    sha256: str  # of the file's bytes
    document: dict
    wheels: dict[str, list[LockedWheel]] = field(default_factory=dict)  # platform -> wheels
    debian: dict[str, list[LockedDebian]] = field(default_factory=dict)  # platform -> packages

    def wheel(self, platform: str, name: str, version: str) -> LockedWheel | None:
        """The locked wheel of this distribution at exactly this version, or None."""
        key = normalize(name)
        return next((w for w in self.wheels.get(platform, [])
                     if normalize(w.name) == key and w.version == version), None)

    @property
    def engine_distribution(self) -> str | None:
        return (self.document.get("engine") or {}).get("distribution")


def normalize(name: str) -> str:
    """PEP 503 normalised distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def engine_lock_path(engine: Engine) -> Path:
    return (repo_root() / "docker-images" / f"engine-{engine.flavour}" / "locks"
            / f"{engine.name}-{engine.version}.lock.json")


def base_lock_path(suite: str) -> Path:
    return repo_root() / "docker-images" / "base" / "locks" / f"{suite}.lock.json"


def read_lock(path: Path) -> Lock | None:
    """The lock at `path`, None when there is no file; SbomReadFailed naming the file and
    field when it is not a lock kiln can read."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SbomReadFailed(f"{path}: cannot read the lock: {exc.strerror}") from None
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise SbomReadFailed(f"{path}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("kiln_lock") != 1:
        raise SbomReadFailed(f"{path}: kiln_lock: expected 1 (a kiln lock file, format 1)")
    lock = Lock(path=path, sha256=hashlib.sha256(data).hexdigest(), document=doc)
    for i, pkg in enumerate(doc.get("python_packages") or []):
        where = f"{path}: python_packages[{i}]"
        if not isinstance(pkg, dict) or not isinstance(pkg.get("name"), str) or not isinstance(pkg.get("version"), str):
            raise SbomReadFailed(f"{where}: needs a name and a version")
        for platform, wheel in (pkg.get("wheels") or {}).items():
            sha = wheel.get("sha256") if isinstance(wheel, dict) else None
            if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
                raise SbomReadFailed(f"{where}: wheels.{platform}.sha256: expected 64 lowercase hex digits")
            lock.wheels.setdefault(platform, []).append(LockedWheel(
                pkg["name"], pkg["version"], str(wheel.get("file") or ""), sha, wheel.get("url")))
    for platform, pkgs in (doc.get("debian_packages") or {}).items():
        for i, pkg in enumerate(pkgs or []):
            if not isinstance(pkg, dict) or not all(isinstance(pkg.get(k), str) for k in ("name", "version")):
                raise SbomReadFailed(f"{path}: debian_packages.{platform}[{i}]: needs a name and a version")
            lock.debian.setdefault(platform, []).append(
                LockedDebian(pkg["name"], pkg["version"], str(pkg.get("architecture") or "")))
    return lock
