"""Build failures that the in-image half of the engine lock reports with its own exit
statuses (docker-images/common/kiln-apt-install, kiln-lock-tool), as kiln's typed errors:
the step's first marker line becomes one error line naming the package."""

from __future__ import annotations

from pathlib import Path

from kiln.basics.errors import (
    BuildFailed,
    DebianPinUnavailable,
    KilnError,
    LockInvalid,
    WheelHashMismatch,
)
from kiln.domain.locks.engine_lock import shown

_WHEEL_MISMATCH = 96  # kiln-lock-tool
_APT_MISSING = 97  # kiln-apt-install
_APT_UNLOCKED = 98  # kiln-apt-install
_TOOLS = {_WHEEL_MISMATCH: "kiln-lock-tool", _APT_MISSING: "kiln-apt-install", _APT_UNLOCKED: "kiln-apt-install"}


def typed(exc: BuildFailed, lock_file: Path | None, relock_command: str) -> KilnError | None:
    """The typed error for a failed RUN of one of the lock's in-image tools, else None."""
    tool = _TOOLS.get(exc.status or 0)
    if tool is None or tool not in exc.step:
        return None
    marker = next((ln.strip() for ln in exc.tail if ln.strip().startswith("KILN-")), "")
    words = marker.split()
    lock = shown(lock_file) if lock_file is not None else "the engine lock"
    relock = f"re-lock: `{relock_command}`"
    if exc.status == _WHEEL_MISMATCH and len(words) >= 6:
        _, name, version, file, want, got = words[:6]
        return WheelHashMismatch(f"{name} {version}: {file} has sha256 {got} in the build, {lock} locks {want}")
    if exc.status == _APT_MISSING and len(words) >= 4:
        _, name, version, arch = words[:4]
        return DebianPinUnavailable(
            f"{lock}: Debian package {name} {version} ({arch}) is no longer served by the mirror; {relock}"
        )
    if exc.status == _APT_UNLOCKED:
        what = " ".join(words[1:]) or "a package"
        return LockInvalid(f"{lock}: apt would install {what}, which the lock does not name; {relock}")
    return None
