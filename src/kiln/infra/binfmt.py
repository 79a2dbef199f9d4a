"""Emulation of other architectures: the kernel's binfmt_misc table, where qemu-user
registers itself (qemu-user + qemu-user-binfmt, 10 or newer: `scripts/setup.sh
--arm64`).

A RUN step of a linux/arm64 build, or an arm64 container, on an x86-64 host
runs only when `qemu-aarch64` is registered and enabled there; with flag F (fix binary)
the kernel opens the interpreter at registration, so it works inside containers whose
filesystem has no qemu.

Read-only: kiln never registers anything itself (that needs root and changes the
machine for everyone); it reports the state (`kiln doctor`) and stops with a clear
error (EmulationUnavailable) before a build that would fail with `exec format error`."""

from __future__ import annotations

import os
import platform as _platform
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from kiln.basics.errors import EmulationUnavailable

_BINFMT = Path("/proc/sys/fs/binfmt_misc")
# OCI platform -> (uname machine names, binfmt_misc entry)
# every kiln image imports torch, and torch 2.14.0's aarch64 build segfaults under qemu-user
# 7.2 (bookworm's), after which the emulated process never exits; 10.0.2 imports it
# (docs/multiarch.md). Older emulators are refused before a build or smoke starts.
QEMU_MIN_MAJOR = 10
ENTRIES = {"linux/amd64": (("x86_64", "amd64"), "qemu-x86_64"), "linux/arm64": (("aarch64", "arm64"), "qemu-aarch64")}


@dataclass(frozen=True)
class Emulation:
    """What binfmt_misc says about one platform's emulator."""

    platform: str
    native: bool  # this machine runs it without emulation
    mounted: bool  # binfmt_misc is mounted at /proc/sys/fs/binfmt_misc
    registered: bool  # the qemu entry exists
    enabled: bool
    flags: str  # e.g. "PF" (P: preserve argv[0], F: fix binary, usable inside containers)
    interpreter: str

    @property
    def usable(self) -> bool:
        """Builds and containers of this platform can run here."""
        return self.native or (self.enabled and "F" in self.flags)

    def why_not(self) -> str:
        """Why the platform's emulation cannot run containers, as one line."""
        entry = ENTRIES[self.platform][1]
        if not self.mounted:
            return f"binfmt_misc is not mounted at {_BINFMT}"
        if not self.registered:
            return f"no {entry} entry in {_BINFMT} (qemu-user-binfmt not installed or not registered)"
        if not self.enabled:
            return f"{_BINFMT / entry} is registered but disabled"
        return f"{_BINFMT / entry} lacks flag F (flags {self.flags or 'none'}): containers cannot open its interpreter"

    def describe(self) -> str:
        """The emulation's state as one line: native, the interpreter, or why it is unusable."""
        if self.native:
            return "native (no emulation needed)"
        if self.usable:
            return f"qemu: {self.interpreter} (flags {self.flags})"
        return self.why_not()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def state(plat: str, root: Path | None = None) -> Emulation:
    """How this host runs containers of a platform: natively, or through which binfmt_misc entry and its flags."""
    root = root or _BINFMT
    machines, entry = ENTRIES[plat]
    native = _platform.machine() in machines
    mounted = (root / "status").exists()
    text = _read(root / entry) if mounted else ""
    fields = dict(line.split(" ", 1) for line in text.splitlines() if " " in line)
    return Emulation(
        plat,
        native,
        mounted,
        bool(text),
        text.startswith("enabled"),
        fields.get("flags:", "").strip(),
        fields.get("interpreter", "").strip(),
    )


def qemu_version(interpreter: str) -> str | None:
    """The emulator's version from `--version`, run by its real path: Debian's entry names
    an `aarch64-binfmt-P` link that refuses to run outside binfmt_misc. None when the
    interpreter is not on this filesystem (registered from a container) or says nothing."""
    real = os.path.realpath(interpreter) if interpreter else ""
    if not real or not os.access(real, os.X_OK):
        return None
    try:
        out = subprocess.run([real, "--version"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"version (\d+(?:\.\d+)*)", out)
    return m.group(1) if m else None


def too_old(version: str | None, min_major: int = QEMU_MIN_MAJOR) -> bool:
    """A known version below `min_major` (an unknown one is given the benefit of the doubt)."""
    return version is not None and int(version.split(".")[0]) < min_major


def require(plat: str, *, min_major: int | None = None) -> Emulation:
    """The state of `plat`'s emulation; EmulationUnavailable when it cannot run here, or
    (with `min_major`) when the registered qemu is older than that."""
    got = state(plat)
    if not got.usable:
        raise EmulationUnavailable(f"{plat} on this {_platform.machine()} host needs qemu emulation: {got.why_not()}")
    if min_major is not None and not got.native:
        version = qemu_version(got.interpreter)
        if too_old(version, min_major):
            raise EmulationUnavailable(
                f"{plat}: the registered emulator {got.interpreter} is qemu {version}; kiln's "
                f"images import torch, which needs qemu {min_major} or newer under emulation"
            )
    return got
