"""The wheelhouse: local wheels copied into an engine build context.

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
from pathlib import Path

from kiln.basics import log
from kiln.basics.errors import EngineFetchFailed
from kiln.basics.paths import cache_dir
from kiln.domain.recipe import Engine

FILE = "wheelhouse.txt"


def requirements(image_dir: Path, engine: Engine) -> list[str]:
    path = image_dir / FILE
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
    directory = cache_dir() / "wheelhouse" / flavour
    directory.mkdir(parents=True, exist_ok=True)
    wheels = []
    for req in reqs:
        found = _find(directory, req)
        if found is None:
            log.step(f"wheelhouse: pip download --no-deps {req}")
            proc = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                 "--python-version", "3.11", "-d", str(directory), req],
                capture_output=True, text=True,
            )
            found = _find(directory, req)
            if proc.returncode != 0 or found is None:
                last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                raise EngineFetchFailed(f"wheelhouse: cannot fetch {req}: {last}")
        wheels.append(found)
    return wheels
