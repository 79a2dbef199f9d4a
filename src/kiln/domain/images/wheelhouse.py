"""The wheelhouse: local wheels copied into an engine build context.

An engine image built from a lock (docker-images/engine-<flavour>/locks/) gets exactly the
wheels its lock names, each checked against the lock's sha256 (`fetch_locked`), and so
does a recipe image for its own packages (recipes/NAME/recipe.lock.json, the same format);
the older `wheelhouse.txt` pins below serve images without a lock (the test stand-in).

Some wheels an engine needs are not on the index the build container sees (the CPU
torch build lives on the host's find-links, a corporate mirror, or an air-gapped
disk). kiln fetches them once on the host with the host's pip configuration into
`~/.cache/kiln/wheelhouse/` and ships them in the context. Pins come from the engine
image's `wheelhouse.txt`, with `{engine_version}` and `{torch}` filled in from the recipe.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kiln.basics import log
from kiln.basics.errors import EngineFetchFailed, WheelHashMismatch
from kiln.basics.files import sha256_file
from kiln.basics.paths import cache_dir, shown_home
from kiln.domain.locks import engine_lock, lock_records
from kiln.domain.recipes.recipe_sections import Engine
from kiln.infra import package_index

_FILE = "wheelhouse.txt"


def requirements(image_dir: Path, engine: Engine) -> list[str]:
    """The engine image's wheelhouse requirements, each line with the engine's version and torch filled in."""
    path = image_dir / _FILE
    if not path.is_file():
        return []
    values = {"engine_version": engine.version, "torch": engine.torch or ""}
    out = []
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            out.append(line.format(**values))
    return out


def _prefix(req: str) -> str:
    name, _, version = req.partition("==")
    if not version:
        raise EngineFetchFailed(f"wheelhouse requirement {req!r} must pin an exact version (name==version)")
    return re.sub(r"[-_.]+", "_", name).lower() + "-" + version + "-"


def _find(directory: Path, req: str) -> Path | None:
    prefix = _prefix(req)
    for whl in sorted(directory.glob("*.whl")):
        if whl.name.lower().startswith(prefix.lower()):
            return whl
    return None


def fetch(reqs: list[str], flavour: str) -> list[Path]:
    """Download each requirement's wheel into the cache unless there already; the wheels' paths."""
    directory = cache_dir() / "wheelhouse" / flavour
    directory.mkdir(parents=True, exist_ok=True)
    wheels = []
    for req in reqs:
        found = _find(directory, req)
        if found is None:
            log.step(f"wheelhouse: pip download --no-deps {req}")
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--only-binary=:all:",
                    "--python-version",
                    "3.11",
                    "-d",
                    str(directory),
                    req,
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            found = _find(directory, req)
            if proc.returncode != 0 or found is None:
                last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                raise EngineFetchFailed(f"wheelhouse: cannot fetch {req}: {last}")
        wheels.append(found)
    return wheels


# -- locked wheelhouse: the exact files an engine lock names ------------------------------
_LOCKED = "locked"
_WORKERS = 8


def _locked_dir() -> Path:
    """Content-checked cache of locked wheels, by file name (every use re-hashes them)."""
    return cache_dir() / "wheels" / _LOCKED


def _local_copy(file: str) -> Path | None:
    """A wheel the lock says lives only on a find-links folder (url null)."""
    for folder in [*package_index.find_links(), str(cache_dir() / "wheelhouse" / "cpu"), str(cache_dir() / "wheels")]:
        cand = Path(folder) / file
        if cand.is_file():
            return cand
    return None


def fetch_locked(
    lock: lock_records.EngineLock, plat: str, *, lock_file: Path, cafile: Path | None, plain: bool = False
) -> list[Path]:
    """Every wheel a build for `plat` installs, from the cache or downloaded (several at
    once), each checked against the lock's sha256: a file with other bytes is refused
    (WheelHashMismatch, one line naming the package and both hashes), never used."""
    return _fetch(engine_lock.all_wheels(lock, plat, plain=plain), lock_file=lock_file, cafile=cafile)


def fetch_files(wanted: list[engine_lock.LockedFile], *, lock_file: Path, cafile: Path | None) -> list[Path]:
    """Some of a lock's wheel files (a parser environment's), with `fetch_locked`'s cache and checks."""
    return _fetch(wanted, lock_file=lock_file, cafile=cafile)


def fetch_tools(lock: lock_records.EngineLock, plat: str, *, lock_file: Path, cafile: Path | None) -> list[Path]:
    """The locked tool wheels (uv) for `plat`: what a cross-placed build's builder stages,
    which run on the host's machine, take instead of the target's (`fetch_locked`'s checks)."""
    tools = [engine_lock.LockedFile(t.name, t.version, t.wheels[plat]) for t in lock.tools.values() if plat in t.wheels]
    return _fetch(tools, lock_file=lock_file, cafile=cafile)


def _fetch(wanted: list[engine_lock.LockedFile], *, lock_file: Path, cafile: Path | None) -> list[Path]:
    cache = _locked_dir()
    cache.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    todo: list[engine_lock.LockedFile] = []
    for item in wanted:
        name, version, wheel = item
        cached = cache / wheel.file
        local = cached if cached.is_file() else (_local_copy(wheel.file) if wheel.url is None else None)
        if local is not None:
            paths[wheel.file] = local
        elif wheel.url is None:
            raise EngineFetchFailed(
                f"{name} {version}: {wheel.file} is only on a local find-links folder "
                f"(sha256_from: file) and none of pip's has it",
                hint="put the wheel into pip's find-links folder or ~/.cache/kiln/wheels/locked",
            )
        else:
            todo.append(item)
    if todo:
        size = "" if not todo else f" ({len(todo)} of {len(wanted)} not cached)"
        log.step(f"wheelhouse: downloading{size} locked wheels into {shown_home(cache)}")
        t0 = time.monotonic()

        def get(item: engine_lock.LockedFile) -> str:
            """The sha256 of what came (the file is kept only when it is the locked one)."""
            url = item.wheel.url
            assert url is not None, "only wheels with a url are left to download"  # noqa: S101
            return package_index.download(url, cache / item.wheel.file, item.wheel.sha256, cafile=cafile)

        with ThreadPoolExecutor(_WORKERS) as pool:
            for (name, version, wheel), got in zip(todo, pool.map(get, todo), strict=True):
                if got != wheel.sha256:
                    raise _mismatch(name, version, wheel, got, lock_file, wheel.url or "")
                paths[wheel.file] = cache / wheel.file
        log.ok(f"wheelhouse: {len(todo)} wheels downloaded and verified [{log.human_secs(time.monotonic() - t0)}]")
    # every file is hashed on every build: the cache is a convenience, the lock the truth
    files = [(name, version, wheel, paths[wheel.file]) for name, version, wheel in wanted]
    with ThreadPoolExecutor(2) as pool:
        hashes = list(pool.map(lambda item: sha256_file(item[3]), files))
    for (name, version, wheel, path), got in zip(files, hashes, strict=True):
        if got != wheel.sha256:
            raise _mismatch(name, version, wheel, got, lock_file, str(path))
    return [path for *_, path in files]


def _mismatch(
    name: str, version: str, wheel: lock_records.Wheel, got: str, lock_file: Path, where: str
) -> WheelHashMismatch:
    return WheelHashMismatch(
        f"{name} {version}: {wheel.file} has sha256 {got}, {engine_lock.shown(lock_file)} locks "
        f"{wheel.sha256} ({shown_home(Path(where)) if where.startswith('/') else where})"
    )
