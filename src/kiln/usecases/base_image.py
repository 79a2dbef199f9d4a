"""A Debian base image from Debian packages alone, no registry (`kiln base build`), and the
builder base of cross-placed engine builds."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from kiln.basics.errors import BuildFailed, DebootstrapMissing
from kiln.basics.files import write_atomic
from kiln.basics.log import human_secs, human_size
from kiln.basics.paths import local_ref
from kiln.domain.images.build_context import BuildContext
from kiln.domain.images.image_naming import platform_suffix
from kiln.domain.locks import engine_lock
from kiln.domain.locks.base_lock import (
    BaseSpec,
    base_dir,
    check_lock,
    lock_document,
    lock_path,
    shown,
)
from kiln.domain.recipes.recipe_sections import DEFAULT_PLATFORM
from kiln.domain.reproducible import normalise_image, source_date
from kiln.infra import binfmt
from kiln.infra.docker import DockerDaemon, Image, id_of
from kiln.usecases import progress

# files debootstrap copies from the build host, or stamps with today's date: Docker
# provides /etc/hostname and /etc/resolv.conf at run time
_HOST_FILES = ("etc/hostname", "etc/resolv.conf", "etc/machine-id")
_SHADOW = ("etc/shadow", "etc/gshadow", "etc/shadow-", "etc/gshadow-")


def _run(cmd: list[str], what: str) -> str:
    progress.debug(" ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        progress.output(tail)
        raise BuildFailed(f"base image: {what} failed (exit {proc.returncode})")
    return proc.stdout


def _sources_list(spec: BaseSpec) -> str:
    return (
        f"deb {spec.mirror} {spec.suite} main\n"
        f"deb {spec.mirror} {spec.suite}-updates main\n"
        f"deb {spec.security_mirror} {spec.suite}-security main\n"
    )


def _base_tag(spec_tag: str, platform: str | None) -> str:
    """kiln/base:bookworm for linux/amd64 (as always), kiln/base:bookworm-arm64 for arm64."""
    return spec_tag + platform_suffix(platform or DEFAULT_PLATFORM)


def _installed(root: Path) -> dict[str, str]:
    out = _run(
        ["chroot", str(root), "dpkg-query", "-W", "-f", "${Package}:${Architecture}=${Version}\\n"], "dpkg-query"
    )
    return dict(sorted(line.split("=", 1) for line in out.split()))


def _scrub(root: Path) -> None:
    """What only makes two debootstraps differ: host files, password-change days."""
    for rel in _HOST_FILES:
        (root / rel).unlink(missing_ok=True)
    for rel in _SHADOW:
        path = root / rel
        if not path.is_file():
            continue
        lines = []
        for line in path.read_text().splitlines():
            fields = line.split(":")
            if rel.startswith("etc/shadow") and len(fields) > 2:
                fields[2] = ""  # the day of the last password change: build day, not content
            lines.append(":".join(fields))
        path.write_text("\n".join(lines) + "\n")


def build_base(
    docker: DockerDaemon,
    *,
    spec: BaseSpec | None = None,
    tag: str | None = None,
    force: bool = False,
    relock: bool = False,
    platform: str | None = None,
) -> str:
    """The base image's id, built by debootstrap unless the current inputs' base is tagged.
    `platform` (linux/arm64): debootstrap --arch for it, its second stage and
    dpkg-query running under qemu (binfmt_misc, checked first)."""
    spec = spec or BaseSpec.load()
    tag = tag or local_ref(_base_tag(spec.tag, platform))
    tagged = docker.image(tag)
    date = source_date.of({base_dir(): ()})
    if tagged is not None and not force:
        if tagged.attrs.get("Created") == source_date.rfc3339(date.epoch):
            progress.ok(f"{tag} already exists ({id_of(tagged)[:19]}); --force rebuilds it")
            return id_of(tagged)
        # made by an older kiln (not normalised) or from older base inputs: not the base
        # these inputs give on a fresh machine
        progress.warn(
            f"{tag} ({id_of(tagged)[:19]}) is not the base of the current inputs "
            f"(created {tagged.attrs.get('Created')}): rebuilding it"
        )
    if shutil.which("debootstrap") is None:
        raise DebootstrapMissing("debootstrap is not installed")
    if os.geteuid() != 0:
        raise DebootstrapMissing("debootstrap needs root")
    if platform is not None:
        binfmt.require(platform)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kiln-base-") as tmp:
        root = Path(tmp) / "rootfs"
        progress.step(f"debootstrap --variant={spec.variant} {spec.suite} ({spec.mirror})")
        cmd = ["debootstrap", f"--variant={spec.variant}"]
        if platform is not None:
            cmd.append(f"--arch={engine_lock.platform(platform).deb_arch}")
        if spec.include:
            cmd.append("--include=" + ",".join(spec.include))
        _run([*cmd, spec.suite, str(root), spec.mirror], "debootstrap")
        progress.info(f"debootstrap: {human_secs(time.monotonic() - t0)}")
        (root / "etc/apt/sources.list").write_text(_sources_list(spec))
        installed = _installed(root)
        lock = lock_path(spec, platform_suffix(platform or DEFAULT_PLATFORM))
        if relock or not lock.is_file():
            lock.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(lock, lock_document(spec, installed))
            progress.warn(f"wrote {shown(lock)} ({len(installed)} packages): commit it")
        else:
            check_lock(spec, installed, lock)
        packages = _run(["chroot", str(root), "dpkg-query", "-W", "-f", "${Package}=${Version}\\n"], "dpkg-query")
        pkg_sha = hashlib.sha256("\n".join(sorted(packages.split())).encode()).hexdigest()
        for rel in spec.strip:
            target = root / rel
            if target.is_dir():
                for child in target.iterdir():
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child)
                    else:
                        child.unlink()
            elif target.exists():
                target.unlink()
        _scrub(root)
        tarball = Path(tmp) / "rootfs.tar"
        progress.step("packing rootfs (sorted, mtime 0, numeric owners)")
        _run(
            [
                "tar",
                "-C",
                str(root),
                "--sort=name",
                "--numeric-owner",
                "--mtime=@0",
                "--exclude=./dev/*",
                "--exclude=./proc/*",
                "--exclude=./sys/*",
                "-cf",
                str(tarball),
                ".",
            ],
            "tar",
        )
        labels = {
            "org.opencontainers.image.title": spec.tag,
            "org.opencontainers.image.description": f"Debian {spec.suite} {spec.variant} from debootstrap",
            "org.opencontainers.image.base.name": f"debootstrap:{spec.suite}",
            "ai.kiln.base.suite": spec.suite,
            "ai.kiln.base.variant": spec.variant,
            "ai.kiln.base.mirror": spec.mirror,
            "ai.kiln.base.packages-sha256": pkg_sha,
            "ai.kiln.base.packages-count": str(len(packages.split())),
        }
        changes = [f'LABEL "{k}"="{v}"' for k, v in labels.items()]
        changes += [
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "ENV LANG=C.UTF-8",
            'CMD ["/bin/bash"]',
        ]
        if platform is None or platform == engine_lock.host_platform():
            progress.step(f"docker import -> {tag}")
            imported = docker.import_rootfs(tarball, None, changes)
        else:
            imported = _import_for(docker, tarball, tag, changes, platform)
        if imported is None:
            raise BuildFailed(f"base image: docker import did not produce {tag}")
        norm = normalise_image.make_reproducible(docker, id_of(imported), date.epoch, label="base")
        docker.tag(norm.image_id, tag)
        image = docker.require_image(norm.image_id)
    progress.summary(
        "base image built",
        {
            "tag": tag,
            "image id": id_of(image),
            "size": human_size(image.attrs.get("Size", 0)),
            "packages": f"{len(packages.split())} (sha256 {pkg_sha[:12]})",
            "took": human_secs(time.monotonic() - t0),
        },
    )
    return id_of(image)


def _import_for(docker: DockerDaemon, tarball: Path, tag: str, changes: list[str], platform: str) -> Image | None:
    """The rootfs as an image of another platform: the daemon's import stamps its own
    architecture into the config, so a FROM-scratch build for `platform` ADDs the tar
    (the same one layer; no RUN step, nothing executes). Untagged: the caller tags the
    normalised image."""
    progress.step(f"docker build --platform {platform} (FROM scratch, ADD rootfs) -> {tag}")
    ctx = BuildContext()
    ctx.add_bytes("Dockerfile", ("FROM scratch\nADD rootfs.tar /\n" + "".join(c + "\n" for c in changes)).encode())
    ctx.add_file("rootfs.tar", tarball)
    result = docker.build(ctx, label=f"base {platform}", platform=platform, quiet=True)
    return docker.image(result.image_id)


def builder_base(docker: DockerDaemon, host_base: str, platform: str, tag: str) -> str:
    """`tag`: the host's base image `host_base`, its files unchanged, marked as `platform`.
    A cross-placed engine build runs its builder stages on it: the legacy builder lets a
    stage COPY only from images of the build's platform, and the architecture in an
    image's config is all it compares, so these x86-64 files run natively while the
    builder's /opt/kiln may be copied into the arm64 image. Only builder stages start
    FROM it; no layer of it reaches an image kiln tags. Rebuilt when `host_base` moves."""
    source = docker.require_image(host_base)
    made = docker.image(tag)
    if made is not None and (made.labels or {}).get(_BUILDER_FROM) == id_of(source):
        return id_of(made)
    progress.step(f"{tag}: {host_base}'s files, marked {platform} (builder stages of cross-placed builds)")
    with tempfile.TemporaryDirectory(prefix="kiln-builder-base-") as tmp:
        tarball = Path(tmp) / "rootfs.tar"
        docker.export_filesystem(id_of(source), tarball)
        changes = [
            f'LABEL "{_BUILDER_FROM}"="{id_of(source)}"',
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "ENV LANG=C.UTF-8",
        ]
        imported = _import_for(docker, tarball, tag, changes, platform)
    if imported is None:
        raise BuildFailed(f"builder base: the build did not produce {tag}")
    docker.tag(id_of(imported), tag)
    return id_of(imported)


_BUILDER_FROM = "ai.kiln.base.builder-from"  # the id of the host base whose files it carries


# the use-case's surface: what a command, or a caller in Python, imports from here
__all__ = ["build_base", "builder_base"]
