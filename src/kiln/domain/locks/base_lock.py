"""kiln's base image, as data: its spec (docker-images/base/base.yaml) and its package lock
(docker-images/base/locks/<suite>[-<arch>].lock.json), the one place both paths are made.
Building it is `kiln base build` (commands/images/base_image.py); the provenance cites the lock.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import NotRequired, TypedDict

import yaml

from kiln.basics import image_ref
from kiln.basics.documents import Shape, read_document
from kiln.basics.errors import BaseLockMismatch, RecipeInvalid
from kiln.basics.paths import repo_root


class _BaseSpecYaml(TypedDict):
    """docker-images/base/base.yaml, the base image's spec (written by hand)."""

    suite: str
    variant: str
    mirror: str
    security_mirror: str
    include: NotRequired[list[str]]
    strip: NotRequired[list[str]]
    tag: str


class _BaseLockJson(TypedDict):
    """A base lock file, as `kiln base build --relock` writes it."""

    suite: str
    variant: str
    mirror: str
    include: list[str]
    packages: dict[str, str]  # "name:arch" -> version
    how: str


_BASE_SPEC = Shape(_BaseSpecYaml)
_BASE_LOCK = Shape(_BaseLockJson)


@dataclass(frozen=True)
class BaseSpec:
    """The base image's spec (docker-images/base/base.yaml): Debian suite, mirrors, packages and tag."""

    suite: str
    variant: str
    mirror: str
    security_mirror: str
    include: tuple[str, ...]
    strip: tuple[str, ...]
    tag: str

    @classmethod
    def load(cls, path: Path | None = None) -> BaseSpec:
        """Read and validate the base image's spec (default: docker-images/base/base.yaml)."""
        path = path or repo_root() / "docker-images" / "base" / "base.yaml"
        invalid = functools.partial(_spec_invalid, hint=f"fix {shown(path)}, the base image's spec")
        try:
            loaded = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise invalid(f"{shown(path)}: cannot be read as YAML: {type(exc).__name__}") from None
        raw = _BASE_SPEC.check(loaded, source=shown(path), error=invalid)
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
    """The base image's folder: docker-images/base."""
    return repo_root() / "docker-images" / "base"


def lock_path_for_tag(tag: str) -> Path:
    """The lock of base image tag `tag` (`bookworm`, `bookworm-arm64`): tags are named
    after the suite and the platform, as the lock files are."""
    return base_dir() / "locks" / f"{tag}.lock.json"


# Debian's code names and release numbers (debian.org/releases): the purl distro of a
# package installed on a base of that suite, `debian-12`
_DEBIAN_RELEASES = {"bullseye": "11", "bookworm": "12", "trixie": "13"}


def debian_distro(base_ref: str) -> str | None:
    """`debian-<N>` for a Debian base image reference (`kiln/base:bookworm`,
    `debian:bookworm-slim@sha256:...`): its tag's suite; None when the tag names none."""
    tag = image_ref.parse(base_ref).tag or ""
    suite = tag.split("-", 1)[0]
    return f"debian-{_DEBIAN_RELEASES[suite]}" if suite in _DEBIAN_RELEASES else None


def lock_path(spec: BaseSpec, suffix: str = "") -> Path:
    """docker-images/base/locks/<suite>.lock.json: the Debian package set the base holds
    (<suite>-arm64.lock.json for linux/arm64, `suffix` "-arm64": other architectures, other
    versions)."""
    return lock_path_for_tag(f"{spec.suite}{suffix}")


def _spec_invalid(message: str, *, hint: str) -> RecipeInvalid:
    return RecipeInvalid([message], hint=hint)


def lock_document(spec: BaseSpec, packages: dict[str, str]) -> str:
    """The base lock file's text: the spec's suite, variant, mirror and includes, and each package's version."""
    doc: _BaseLockJson = {
        "suite": spec.suite,
        "variant": spec.variant,
        "mirror": spec.mirror,
        "include": list(spec.include),
        "packages": packages,
        "how": "written by `kiln base build --relock`; `kiln base build` fails when debootstrap installs any other set",
    }
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def check_lock(
    # the signature every lock kind's check shares
    spec: BaseSpec,  # noqa: ARG001
    packages: dict[str, str],
    path: Path,
) -> None:
    """The set debootstrap installed must be the locked one: the mirror moving on (a point
    release) would otherwise give another base, and every image on it another id."""
    damaged = functools.partial(
        BaseLockMismatch,
        hint="restore the lock from git, or write it again: `kiln base build --relock` (then review the diff)",
    )
    locked = read_document(path, _BASE_LOCK, damaged, source=shown(path))["packages"]
    changed = [
        f"{p} {locked.get(p, '(not locked)')} -> {packages.get(p, '(not installed)')}"
        for p in sorted(set(locked) | set(packages))
        if locked.get(p) != packages.get(p)
    ]
    if changed:
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        raise BaseLockMismatch(
            f"{shown(path)}: debootstrap installed another package set than the lock: {changed[0]}{more}"
        )


def shown(path: Path) -> str:
    """A path as messages show it: relative to the repository when inside it."""
    try:
        return path.relative_to(repo_root()).as_posix()
    except ValueError:
        return str(path)
