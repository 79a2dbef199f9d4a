"""Making an engine lock (`kiln engine lock`) and asking the index about one (`--check`).

Resolution is uv's (`uv pip compile` per target platform, Python 3.11, binary wheels
only) on the engine wheel's own Requires-Dist, with the names the flavour's policy
excludes left out; the exact file per platform and its sha256 come from the index's
JSON API, or, for a wheel that exists only on a local find-links folder (torch's CPU
build), from hashing that file. Debian's closure is what apt in a throwaway container
of the engine's base image would install for the Dockerfiles' `kiln-apt-install` lines.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from kiln.basics import log
from kiln.basics.errors import LockInvalid
from kiln.basics.files import sha256_file
from kiln.domain.locks import engine_lock, lock_policy, lock_records
from kiln.domain.recipes.recipe_sections import Engine
from kiln.infra import binfmt, package_index, wheel_cache
from kiln.infra.docker import DockerDaemon

_WORKERS = 16


@dataclass(frozen=True)
class _LocalFile:
    """A wheel on a find-links folder, shaped like an index file for select_wheel."""

    filename: str
    path: Path
    requires_python: str | None = None


def _local_files() -> list[_LocalFile]:
    return [_LocalFile(p.name, p) for d in package_index.find_links() for p in sorted(Path(d).glob("*.whl"))]


class _Index:
    """Index pages fetched once per lock run, many at a time."""

    def __init__(self, cafile: Path | None) -> None:
        self.cafile = cafile
        self._pages: dict[str, package_index.Project] = {}
        self._local = _local_files()

    def prefetch(self, names: list[str]) -> None:
        todo = sorted({canonicalize_name(n) for n in names} - set(self._pages))
        with ThreadPoolExecutor(_WORKERS) as pool:
            for name, page in zip(
                todo, pool.map(lambda n: package_index.project(n, cafile=self.cafile), todo), strict=True
            ):
                self._pages[name] = page

    def page(self, name: str) -> package_index.Project:
        key = canonicalize_name(name)
        if key not in self._pages:
            self._pages[key] = package_index.project(key, cafile=self.cafile)
        return self._pages[key]

    def wheel(self, name: str, version: str, plat: engine_lock.TargetPlatform) -> lock_records.Wheel:
        picked = lock_policy.select_wheel(self.page(name).files, version, plat)
        if picked is not None:
            return lock_records.Wheel(picked.filename, picked.sha256, picked.url, "index")
        local = [
            f for f in self._local if canonicalize_name(parse_wheel_filename(f.filename)[0]) == canonicalize_name(name)
        ]
        found = lock_policy.select_wheel(local, version, plat)
        if found is not None:
            return lock_records.Wheel(found.filename, sha256_file(found.path), None, "file")
        raise LockInvalid(
            f"no {plat.name} wheel of {name} {version} on the index or pip's find-links",
            hint="only binary wheels are locked; check the version exists for that platform",
        )


def make_lock(
    engine: Engine,
    image_dir: Path,
    platforms: list[str],
    *,
    cafile: Path | None,
    docker: DockerDaemon | None,
    base_of: Callable[[str], str],
) -> lock_records.EngineLock:
    """`base_of(platform)`: the base image an engine image for that platform starts from
    (the images package knows; a lock is one of its inputs, so this package may not ask it)."""
    policy = lock_policy.POLICIES[engine.flavour]
    wheel = wheel_cache.engine_wheel(engine.version, engine.flavour)
    requirements = lock_policy.wheel_requirements(wheel)
    excludes = sorted(policy.excluded)
    overridden = policy.overrides_for(engine.version)
    overrides = [req for req, _ in overridden.values()]
    index = _Index(cafile)
    per_platform: dict[str, list[package_index.Pin]] = {}
    plain_pins: dict[str, list[package_index.Pin]] = {}
    for plat_name in platforms:
        plat = engine_lock.platform(plat_name)
        log.step(f"resolving {policy.distribution} {engine.version}'s requirements for {plat_name} with uv")
        pins = package_index.compile_pins(
            requirements,
            uv_platform=plat.uv,
            python=lock_records.PYTHON,
            cafile=cafile,
            excludes=excludes,
            overrides=overrides,
        )
        pins.append(package_index.Pin(policy.distribution, engine.version))
        per_platform[plat_name] = pins
        if policy.plain_anchor:
            # plain `pip install vllm==V`: the whole closure, at the versions locked above
            full = package_index.compile_pins(
                [f"{policy.distribution}=={engine.version}"],
                uv_platform=plat.uv,
                python=lock_records.PYTHON,
                cafile=cafile,
                overrides=overrides,
                constraints=[f"{p.name}=={p.version}" for p in pins],
            )
            have = {canonicalize_name(p.name) for p in pins}
            plain_pins[plat_name] = [p for p in full if canonicalize_name(p.name) not in have]
    uv_version = _uv_version()
    names = [p.name for pins in [*per_platform.values(), *plain_pins.values()] for p in pins] + ["uv"]
    log.step(f"reading {len(set(names))} projects' files and hashes from the index")
    index.prefetch(names)
    packages = _merge(per_platform, index)
    extra = _merge(plain_pins, index) if plain_pins else []
    tools = {"uv": _merge({p: [package_index.Pin("uv", uv_version)] for p in platforms}, index)[0]}
    requested = lock_policy.requested_debian(sorted(image_dir.glob("*Dockerfile")))
    debian: dict[str, list[lock_records.DebianPackage]] = {}
    if requested:
        if docker is None:
            raise LockInvalid("resolving the Debian closure needs the Docker daemon")
        host = engine_lock.host_platform()
        for plat_name in platforms:
            if plat_name == host or binfmt.state(plat_name).usable:
                # that platform's own base (kiln/base:bookworm-arm64 runs under qemu on x86-64)
                base = base_of(plat_name)
                debian[plat_name] = _debian_closure(docker, base, requested)
            else:
                # no emulation here: apt on this host's base, told that the foreign
                # architecture is its native one (what a fresh CI machine can do)
                base = base_of(host)
                debian[plat_name] = _debian_closure(
                    docker, base, requested, foreign=engine_lock.platform(plat_name).deb_arch
                )
    return lock_records.EngineLock(
        image=image_dir.name,
        engine_name=engine.name,
        engine_version=engine.version,
        distribution=policy.distribution,
        resolved_from=lock_records.Resolved(requirements),
        excluded=dict(policy.excluded),
        platforms=sorted(platforms),
        python_packages=packages,
        debian_requested=requested,
        debian_packages=debian,
        tools=tools,
        plain_extra_packages=extra,
        overridden=overridden,
    )


def make_recipe_lock(
    recipe: str,
    requested: list[str],
    engine_image_lock: lock_records.EngineLock,
    platforms: list[str],
    *,
    cafile: Path | None,
) -> lock_records.EngineLock:
    """A recipe's own lock (kiln.domain.locks.recipe_lock): `requested` (its
    build.python_packages) resolved per platform with the engine lock's versions as
    constraints, so that nothing the engine installs moves; what the engine lock holds
    already is left out (it is installed), the rest gets its file and sha256 from the
    index. Its uv is the engine lock's: the same tool installs both sets."""
    uv = engine_image_lock.tools.get("uv")
    missing = [p for p in platforms if uv is None or p not in uv.wheels]
    if uv is None or missing:
        raise LockInvalid(
            f"the {engine_image_lock.image} lock for {engine_image_lock.engine_name} "
            f"{engine_image_lock.engine_version} has no uv wheel for {', '.join(missing or platforms)} (tools.uv)"
        )
    index = _Index(cafile)
    per_platform: dict[str, list[package_index.Pin]] = {}
    for plat_name in platforms:
        plat = engine_lock.platform(plat_name)
        installed = {p.key: p.wheels[plat_name].version for p in engine_image_lock.python_packages_on(plat_name)}
        log.step(
            f"resolving {recipe}'s {' '.join(requested)} for {plat_name} with uv, "
            f"against {len(installed)} distributions the engine lock installs"
        )
        pins = package_index.compile_pins(
            requested,
            uv_platform=plat.uv,
            python=lock_records.PYTHON,
            cafile=cafile,
            constraints=[f"{name}=={version}" for name, version in sorted(installed.items())],
        )
        per_platform[plat_name] = [p for p in pins if canonicalize_name(p.name) not in installed]
    index.prefetch([p.name for pins in per_platform.values() for p in pins])
    return lock_records.EngineLock(
        image=recipe,
        engine_name=engine_image_lock.engine_name,
        engine_version=engine_image_lock.engine_version,
        distribution=engine_image_lock.distribution,
        resolved_from=lock_records.Resolved(sorted(requested)),
        excluded={},
        platforms=sorted(platforms),
        python_packages=_merge(per_platform, index),
        tools={"uv": uv},
    )


def _merge(per_platform: dict[str, list[package_index.Pin]], index: _Index) -> list[lock_records.LockedPackage]:
    """One LockedPackage per name, with the wheel each platform installs."""
    by_name: dict[str, tuple[str, str, dict[str, lock_records.Wheel]]] = {}
    for plat_name, pins in sorted(per_platform.items()):
        plat = engine_lock.platform(plat_name)
        for pin in pins:
            key = canonicalize_name(pin.name)
            _name, _version, wheels = by_name.setdefault(key, (pin.name, pin.version, {}))
            wheels[plat_name] = index.wheel(pin.name, pin.version, plat)
    return [lock_records.LockedPackage(name, version, wheels) for name, version, wheels in by_name.values()]


def _uv_version() -> str:
    out = subprocess.run(
        [package_index.uv_binary(), "--version"], capture_output=True, text=True, timeout=30, check=False
    )
    m = re.match(r"uv (\S+)", out.stdout)
    if out.returncode != 0 or not m:
        raise LockInvalid(f"cannot read uv's version: {out.stderr.strip() or out.stdout.strip()}")
    return m.group(1)


# apt-get -s: "Inst NAME [INSTALLED] (NEW RELEASE [ARCH])", INSTALLED only for an upgrade
_INST = re.compile(r"^Inst (?P<name>\S+) (?:\[(?P<installed>[^\]]*)\] )?\((?P<version>\S+) .*\[(?P<arch>[^\]]+)\]\)")


def _debian_closure(
    docker: DockerDaemon, base_image: str, requested: list[str], *, foreign: str | None = None
) -> list[lock_records.DebianPackage]:
    """What `apt-get install --no-install-recommends REQUESTED` installs on `base_image`
    today (names, versions, architectures), read from apt's simulation.

    `foreign` (a dpkg architecture: arm64) resolves for that architecture without running
    any of its binaries: apt in `base_image` takes it as its only architecture, reads that
    architecture's package lists, and sees the base's installed packages as that
    architecture's (a debootstrap minbase installs the same packages on either). On
    2026-12-02 this gave, for engine-cuda's eight requested packages, the same 69 arm64
    packages and versions as apt inside kiln/base:bookworm-arm64 under qemu."""
    where = f"{base_image} as {foreign}" if foreign else base_image
    log.step(f"resolving the Debian closure of {' '.join(requested)} on {where}")
    apt, prepare = "apt-get", ""
    if foreign is not None:
        apt = (
            f"apt-get -o APT::Architecture={foreign} -o APT::Architectures::={foreign} "
            "-o Dir::State::status=/tmp/kiln-status -o Dir::State::Lists=/tmp/kiln-lists "
            "-o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache="
        )
        prepare = (
            "mkdir -p /tmp/kiln-lists/partial && "
            f"sed '/^Architecture: all$/!s/^Architecture: .*/Architecture: {foreign}/' "
            "/var/lib/dpkg/status > /tmp/kiln-status && "
        )
    script = (
        f"{prepare}{apt} update -qq >/dev/null && "
        f"{apt} install -s --no-install-recommends -o APT::Get::Show-Versions=1 {' '.join(requested)}"
    )
    status, output = docker.run_command(base_image, ["sh", "-c", script], timeout_s=600, name_prefix="kiln-lock-apt-")
    if status != 0:
        tail = " | ".join(output.strip().splitlines()[-3:])
        raise LockInvalid(f"apt cannot install {' '.join(requested)} on {where}: {tail}")
    pkgs = []
    for line in output.splitlines():
        m = _INST.match(line)
        # as `foreign`, apt also lists some of the base's own packages as reinstalled at
        # the version it has (libc6, libstdc++6, ...): not part of what the install adds
        if m and m["installed"] != m["version"]:
            pkgs.append(lock_records.DebianPackage(m["name"].split(":")[0], m["version"], m["arch"]))
    if not pkgs:
        raise LockInvalid(f"apt's simulation on {where} installed nothing for {' '.join(requested)}")
    return sorted(pkgs, key=lambda d: d.name)


# -- `kiln engine lock --check` ----------------------------------------------------------
@dataclass(frozen=True)
class _Finding:
    name: str
    locked: str
    newest: str | None  # newest final release on the index, when newer than locked
    yanked: list[str]  # locked files the index marks yanked

    def line(self) -> str:
        parts = []
        if self.yanked:
            parts.append(f"YANKED ({', '.join(self.yanked)})")
        if self.newest:
            parts.append(f"newer release {self.newest}")
        return f"{self.name} {self.locked}: {'; '.join(parts)}"


def _newest(versions: list[str]) -> Version | None:
    parsed = []
    for v in versions:
        try:
            pv = Version(v)
        except InvalidVersion:
            continue
        if not pv.is_prerelease and not pv.is_devrelease:
            parsed.append(pv)
    return max(parsed) if parsed else None


def outdated(lock: lock_records.EngineLock, *, cafile: Path | None) -> list[_Finding]:
    """Locked versions the index marks yanked or has newer final releases of (only what
    the index says; the lock file is not touched)."""
    index = _Index(cafile)
    pkgs = [*lock.python_packages, *lock.plain_extra_packages, *lock.tools.values()]
    index.prefetch([p.name for p in pkgs])
    findings = []
    for pkg in sorted(pkgs, key=lambda p: p.key):
        page = index.page(pkg.name)
        files = {f.filename: f for f in page.files}
        yanked = sorted({w.file for w in pkg.wheels.values() if w.file in files and files[w.file].yanked})
        versions = page.versions or [
            str(parse_wheel_filename(f.filename)[1]) for f in page.files if f.filename.endswith(".whl")
        ]
        newest = _newest(versions)
        locked = Version(pkg.version)
        newer = str(newest) if newest is not None and newest > Version(locked.public) else None
        if yanked or newer:
            findings.append(_Finding(pkg.name, pkg.version, newer, yanked))
    return findings
