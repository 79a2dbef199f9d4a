"""kiln's base image, as data: its spec (docker-images/base/base.yaml) and its package lock
(docker-images/base/locks/<suite>[-<arch>].lock.json), the one place both paths are made.
Building it is `kiln base build` (commands/images/baseimage.py); the provenance cites the lock.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from kiln.basics import imageref
from kiln.basics.errors import BaseLockMismatch
from kiln.basics.paths import repo_root


@dataclass(frozen=True)
class BaseSpec:
    suite: str
    variant: str
    mirror: str
    security_mirror: str
    include: tuple[str, ...]
    strip: tuple[str, ...]
    tag: str

    @classmethod
    def load(cls, path: Path | None = None) -> BaseSpec:
        path = path or repo_root() / "docker-images" / "base" / "base.yaml"
        raw = yaml.safe_load(path.read_text())
        return cls(
            suite=raw["suite"],
            variant=raw["variant"],
            mirror=raw["mirror"],
            security_mirror=raw["security_mirror"],
            include=tuple(raw.get("include", [])),
            strip=tuple(raw.get("strip", [])),
            tag=raw["tag"],
        )


def base_dir() -> Path:
    return repo_root() / "docker-images" / "base"


def lock_path_for_tag(tag: str) -> Path:
    """The lock of base image tag `tag` (`bookworm`, `bookworm-arm64`): tags are named
    after the suite and the platform, as the lock files are."""
    return base_dir() / "locks" / f"{tag}.lock.json"


# Debian's code names and release numbers (debian.org/releases): the purl distro of a
# package installed on a base of that suite, `debian-12`
DEBIAN_RELEASES = {"bullseye": "11", "bookworm": "12", "trixie": "13"}


def debian_distro(base_ref: str) -> str | None:
    """`debian-<N>` for a Debian base image reference (`kiln/base:bookworm`,
    `debian:bookworm-slim@sha256:...`): its tag's suite; None when the tag names none."""
    tag = imageref.parse(base_ref).tag or ""
    suite = tag.split("-", 1)[0]
    return f"debian-{DEBIAN_RELEASES[suite]}" if suite in DEBIAN_RELEASES else None


def lock_path(spec: BaseSpec, suffix: str = "") -> Path:
    """docker-images/base/locks/<suite>.lock.json: the Debian package set the base holds
    (<suite>-arm64.lock.json for linux/arm64, `suffix` "-arm64": other architectures, other
    versions)."""
    return lock_path_for_tag(f"{spec.suite}{suffix}")


def lock_document(spec: BaseSpec, packages: dict[str, str]) -> str:
    doc = {"suite": spec.suite, "variant": spec.variant, "mirror": spec.mirror,
           "include": list(spec.include), "packages": packages,
           "how": "written by `kiln base build --relock`; `kiln base build` fails when debootstrap "
                  "installs any other set"}
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def check_lock(spec: BaseSpec, packages: dict[str, str], path: Path) -> None:
    """The set debootstrap installed must be the locked one: the mirror moving on (a point
    release) would otherwise give another base, and every image on it another id."""
    try:
        locked = json.loads(path.read_text())["packages"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BaseLockMismatch(f"{path}: cannot be read as a base lock: {exc}") from None
    changed = [f"{p} {locked.get(p, '(not locked)')} -> {packages.get(p, '(not installed)')}"
               for p in sorted(set(locked) | set(packages)) if locked.get(p) != packages.get(p)]
    if changed:
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        raise BaseLockMismatch(f"{shown(path)}: debootstrap installed another package set than the lock: "
                               f"{changed[0]}{more}")


def shown(path: Path) -> str:
    try:
        return path.relative_to(repo_root()).as_posix()
    except ValueError:
        return str(path)


