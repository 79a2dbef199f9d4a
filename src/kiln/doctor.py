"""`kiln doctor`: is this machine ready to build, serve and publish?"""

from __future__ import annotations

import shutil

from . import log
from .ca import resolve_ca
from .dockerengine import DockerEngine
from .errors import KilnError
from .paths import cache_dir


def _row(ok: bool | None, what: str, detail: str) -> bool:
    mark = {True: "[green]ok[/]  ", False: "[red]FAIL[/]", None: "[yellow]warn[/]"}[ok]
    log.console.print(f"  {mark} {what}: {detail}", markup=True, highlight=False)
    return ok is not False


def _gpu() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    import subprocess

    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def doctor() -> int:
    good = True
    log.step("kiln doctor")
    try:
        version = DockerEngine().ping()
        good &= _row(True, "docker daemon", f"reachable, server {version}")
    except KilnError as exc:
        good &= _row(False, "docker daemon", exc.message)
    deb = shutil.which("debootstrap")
    _row(True if deb else None, "debootstrap", deb or "missing (needed only for `kiln base build`)")
    usage = shutil.disk_usage(cache_dir())
    free_gb = usage.free / 1e9
    good &= _row(free_gb > 15 if free_gb < 15 else True, "disk", f"{free_gb:.0f} GB free (an engine build needs ~10 GB)")
    try:
        ca = resolve_ca()
        _row(True, "CA bundle", f"{ca.path or 'none'} ({ca.origin})")
    except KilnError as exc:
        good &= _row(False, "CA bundle", exc.message)
    gpu = _gpu()
    _row(True if gpu else None, "GPU", gpu or "none visible (CPU recipes only; GPU smoke tests skip)")
    reg = shutil.which("docker-registry") or shutil.which("registry")
    _row(True if reg else None, "local registry binary", reg or "missing (publish tests need Debian's docker-registry)")
    return 0 if good else 1
