"""The dev and test toolchain's lock: requirements/dev.lock.

`make setup` installs exactly this file (hashes required) into the project's own
virtualenv, `.venv`, so that lint, types and tests see the same versions on every
machine, whatever the index serves that day (a new pydantic release on the index once
turned a passing mypy run red on fresh machines only).

The lock is resolved by `uv pip compile` for one target, the one CI and `make setup`
use: CPython 3.11 on x86-64 Linux (manylinux_2_28). Its inputs are the requirements the
three pyproject.toml files declare: kiln's dependencies and `dev` extra, kiln-testkit's
and kiln-engine's dependencies. Their digest is written into the lock's header, so a
unit test (tests/test_devlock.py) fails when a pyproject.toml changes and the lock was
not refreshed.

Refresh it with one command, `make lock-dev` (runs `python -m kiln_testkit.devlock`).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

LOCK = Path("requirements/dev.lock")
PYPROJECTS = {
    "kiln": Path("pyproject.toml"),
    "kiln-testkit": Path("testkit/pyproject.toml"),
    "kiln-engine": Path("engine/pyproject.toml"),
}
PYTHON_VERSION = "3.11"
PYTHON_PLATFORM = "x86_64-manylinux_2_28"
# the marker environment the lock is resolved for (what PYTHON_* above mean to a marker)
MARKERS = {
    "python_version": PYTHON_VERSION,
    "python_full_version": f"{PYTHON_VERSION}.0",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
}
INPUTS_PREFIX = "# kiln-dev-inputs: sha256:"


def declared(root: Path) -> dict[str, list[str]]:
    """Every requirement the lock must satisfy, by the project that declares it."""
    out: dict[str, list[str]] = {}
    for project, rel in PYPROJECTS.items():
        meta = tomllib.loads((root / rel).read_text())["project"]
        reqs = list(meta.get("dependencies", []))
        if project == "kiln":
            reqs += meta.get("optional-dependencies", {}).get("dev", [])
        out[project] = [str(Requirement(r)) for r in reqs]  # normalised: layout does not count
    return out


def inputs_digest(root: Path) -> str:
    """sha256 over the declared requirements and the resolution target."""
    doc = {
        "requirements": {k: sorted(v) for k, v in declared(root).items()},
        "python": PYTHON_VERSION,
        "platform": PYTHON_PLATFORM,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def recorded_digest(lock_text: str) -> str | None:
    """The input digest a dev lock's text records; None when it records none."""
    for line in lock_text.splitlines():
        if line.startswith(INPUTS_PREFIX):
            return line[len(INPUTS_PREFIX) :].strip()
    return None


def pins(lock_text: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, sha256 hashes) for every `name==version` entry of a hashed lock."""
    out: dict[str, tuple[str, list[str]]] = {}
    current = ""
    for line in lock_text.splitlines():
        text = line.split("#", 1)[0].strip().rstrip("\\").strip()
        if not text:
            continue
        if not line[0].isspace():  # `name==version \` starts an entry
            name, _, version = text.partition("==")
            current = canonicalize_name(Requirement(name).name)
            out[current] = (version.strip(), [])
        elif text.startswith("--hash=sha256:") and current:
            out[current][1].append(text.removeprefix("--hash=sha256:"))
    return out


def unmet(root: Path, lock_text: str) -> list[str]:
    """Declared requirements (for the lock's target) that no pin satisfies, one line each."""
    locked = pins(lock_text)
    problems = []
    for project, reqs in declared(root).items():
        for text in reqs:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate(MARKERS):
                continue
            name = canonicalize_name(req.name)
            if name not in locked:
                problems.append(f"{project}: {text} is not in {LOCK}")
            elif not req.specifier.contains(locked[name][0], prereleases=True):
                problems.append(f"{project}: {text} is not met by {name}=={locked[name][0]} in {LOCK}")
    return problems


def _find_links() -> list[str]:
    """pip's local find-links folders (torch's CPU wheel is served from one here)."""
    raw = (
        os.environ.get("PIP_FIND_LINKS")
        or subprocess.run(
            [sys.executable, "-m", "pip", "config", "get", "global.find-links"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
    )
    return [p for p in raw.split() if Path(p).is_dir()]


def compile_lock(root: Path) -> None:
    """Resolve the lock with uv (from the dev environment itself) and stamp its inputs."""
    from uv import find_uv_bin  # the dev environment's own uv, pinned in the lock

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "dev.lock"
        if (root / LOCK).is_file():  # uv keeps the output file's pins where the inputs allow:
            out.write_text((root / LOCK).read_text())  # a refresh moves only what it must
        cmd = [
            find_uv_bin(),
            "pip",
            "compile",
            *map(str, PYPROJECTS.values()),
            "--extra",
            "dev",
            "--generate-hashes",
            "--python-version",
            PYTHON_VERSION,
            "--python-platform",
            PYTHON_PLATFORM,
            "--custom-compile-command",
            "make lock-dev",
            "--no-config",
            "-q",
            "-o",
            str(out),
        ]
        for link in _find_links():
            cmd += ["--find-links", link]
        subprocess.run(cmd, cwd=root, check=True)
        body = out.read_text()
    header = (
        f"# the dev and test toolchain, installed by `make setup` into .venv "
        f"(testkit/kiln_testkit/devlock.py)\n{INPUTS_PREFIX}{inputs_digest(root)}\n"
    )
    (root / LOCK).parent.mkdir(exist_ok=True)
    (root / LOCK).write_text(header + body)
    print(f"{LOCK}: {len(pins(body))} pins, inputs sha256:{inputs_digest(root)[:12]}")


if __name__ == "__main__":
    compile_lock(Path.cwd())
