"""Is this machine ready to build, serve and publish (`kiln doctor`)? Each check a row."""

from __future__ import annotations

import shutil
import subprocess
from typing import Literal

from typing_extensions import TypedDict

from kiln.basics.errors import KilnError
from kiln.basics.paths import cache_dir, repo_root, shown_home, state_dir
from kiln.domain.images.ca_bundle import resolve_ca
from kiln.infra import binfmt
from kiln.infra.docker import DockerDaemon


class DoctorCheck(TypedDict):
    """One check of this machine and what it found."""

    check: str
    status: Literal["ok", "warn", "fail"]
    detail: str


class DoctorDocument(TypedDict):
    """`kiln doctor --json` (src/kiln/schemas/doctor.json): every check; `ok` unless one failed."""

    ok: bool
    checks: list[DoctorCheck]


_ROWS: list[DoctorCheck] = []
# a check's outcome (None: a warning) as its row's status
_STATUS: dict[bool | None, Literal["ok", "warn", "fail"]] = {True: "ok", False: "fail", None: "warn"}


def _row(ok: bool | None, what: str, detail: str) -> bool:
    _ROWS.append(DoctorCheck(check=what, status=_STATUS[ok], detail=detail))
    return ok is not False


def _gpu() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def check_machine() -> DoctorDocument:
    """Every check of this machine, in order; `ok` unless one failed."""
    _ROWS.clear()
    good = True
    try:
        version = DockerDaemon().ping()
        good &= _row(True, "docker daemon", f"reachable, server {version}")
    except KilnError as exc:
        good &= _row(False, "docker daemon", exc.message)
    deb = shutil.which("debootstrap")
    _row(True if deb else None, "debootstrap", deb or "missing (needed only for `kiln base build`)")
    usage = shutil.disk_usage(cache_dir())
    free_gb = usage.free / 1e9
    good &= _row(
        free_gb > 15 if free_gb < 15 else True, "disk", f"{free_gb:.0f} GB free (an engine build needs ~10 GB)"
    )
    try:
        ca = resolve_ca()
        _row(True, "CA bundle", f"{ca.path or 'none'} ({ca.origin})")
    except KilnError as exc:
        good &= _row(False, "CA bundle", exc.message)
    gpu = _gpu()
    _row(True if gpu else None, "GPU", gpu or "none visible (CPU recipes only; GPU smoke tests skip)")
    reg = shutil.which("docker-registry") or shutil.which("registry")
    _row(True if reg else None, "local registry binary", reg or "missing (publish tests need Debian's docker-registry)")
    for plat in binfmt.ENTRIES:
        emu = binfmt.state(plat)
        if not emu.native:  # a warning: only builds for that platform need it
            _row(*_emulation_row(emu))
    _row(True, "records", f"{shown_home(state_dir())} (smoke passes and publish results; $KILN_STATE_DIR moves them)")
    _row(*_checkout())
    return DoctorDocument(ok=good, checks=list(_ROWS))


def _emulation_row(emu: binfmt.Emulation) -> tuple[bool | None, str, str]:
    fix = f"(needed only to build or run {emu.platform} images: scripts/setup.sh --arm64)"
    if not emu.usable:
        return None, f"emulation {emu.platform}", f"{emu.why_not()} {fix}"
    version = binfmt.qemu_version(emu.interpreter)
    said = f"{emu.describe()}, qemu {version or 'version unknown'}"
    if binfmt.too_old(version):
        return None, f"emulation {emu.platform}", f"{said}: below {binfmt.QEMU_MIN_MAJOR}, torch does not import {fix}"
    return True, f"emulation {emu.platform}", said


def _checkout() -> tuple[bool | None, str, str]:
    try:
        return True, "checkout", str(repo_root())
    except KilnError as exc:
        return None, "checkout", f"{exc.message} (recipe commands need one)"


# the use-case's surface: what a command, or a caller in Python, imports from here
__all__ = ["DoctorCheck", "DoctorDocument", "check_machine"]
