"""A recipe's own Python packages (`build.python_packages`), locked as the engine's are.

A recipe whose image needs a distribution its engine image leaves out (tiny-kindling:
triton, which the CPU engine lock excludes) names it in `build.python_packages`;
`kiln engine lock NAME --recipe-only` resolves those requirements against the engine
lock (its versions are constraints, and what it installs already is left out) into
`recipes/NAME/recipe.lock.json`, in the engine lock's own file format (one reader, one
wheelhouse, one SBOM path for both). The build fetches the locked wheels on the host,
hash-checked, into the recipe's build context (`_kiln/wheels/`, with `_kiln/lock/`'s
requirement files), and the recipe's Dockerfile installs them from there, offline and
with hashes required: the same way in as every engine wheel, so the recipe builds
air-gapped and the SBOM cites the lock for each file.

This module finds, reads and checks a recipe's lock (no network); kiln.domain.locks.lock_resolver
makes one.
"""

from __future__ import annotations

from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from kiln.basics.errors import KilnError, LockInvalid, LockMissing
from kiln.domain.locks import engine_lock
from kiln.domain.locks.lock_records import EngineLock
from kiln.domain.recipes.recipe import LoadedRecipe

_FILE = "recipe.lock.json"
# what the recipe's build context carries from its lock (engine_lock.context_files' names):
# the requirement lines with hashes, every wheel file with its sha256, and uv's wheel
_CONTEXT_FILES = ("python.txt", "wheels.txt", "uv.txt")


def lock_path(recipe_dir: Path) -> Path:
    """The path of a recipe's own lock file, in its folder."""
    return recipe_dir / _FILE


def relock_command(recipe: str) -> str:
    """The command that rewrites a recipe's own lock."""
    return f"kiln engine lock {recipe} --recipe-only"


def for_recipe(loaded: LoadedRecipe) -> EngineLock | None:
    """The lock a recipe image installs its own packages from; None when it names none.
    LockMissing when it names some and has no lock; LockInvalid (the first problem, one
    line naming the file and field) when the lock is unreadable or no longer matches."""
    if not loaded.recipe.build.python_packages:
        return None
    path = lock_path(loaded.dir)
    if not path.is_file():
        raise LockMissing(
            f"{engine_lock.shown(path)}: no lock for the build.python_packages of "
            f"{loaded.where('build', 'python_packages')} "
            f"({', '.join(loaded.recipe.build.python_packages)})",
            hint=f"write it: `{relock_command(loaded.name)}`, then commit it",
        )
    lock = engine_lock.load(path)
    problems = _mismatches(loaded, lock, path)
    if problems:
        raise LockInvalid(problems[0], hint=f"re-lock: `{relock_command(loaded.name)}`, then review the diff")
    return lock


def committed(loaded: LoadedRecipe) -> engine_lock.LockFile | None:
    """The recipe's committed lock with its file digest (what the SBOM and the provenance
    cite), None when it has none; LockInvalid when it is there but unreadable."""
    path = lock_path(loaded.dir)
    return engine_lock.load_file(path) if path.is_file() else None


def problems(loaded: LoadedRecipe) -> list[str]:
    """`kiln check`'s lines for a recipe's own lock: one line per way it is missing,
    unreadable, stale, or at odds with the engine lock it is installed on."""
    path = lock_path(loaded.dir)
    rerun = f" ({relock_command(loaded.name)})"
    if not loaded.recipe.build.python_packages:
        return (
            [f"{engine_lock.shown(path)}: the recipe names no build.python_packages; remove the lock or name them"]
            if path.is_file()
            else []
        )
    if not path.is_file():
        return [f"{engine_lock.shown(path)}: no lock for build.python_packages{rerun}"]
    try:
        lock = engine_lock.load(path)
    except LockInvalid as exc:
        return [exc.message + rerun]
    return [line + rerun for line in _mismatches(loaded, lock, path) + _engine_overlap(loaded, lock, path)]


def _mismatches(loaded: LoadedRecipe, lock: EngineLock, path: Path) -> list[str]:
    """Ways the lock is not the one this recipe's build.python_packages and engine make."""
    where, recipe, engine = engine_lock.shown(path), loaded.recipe, loaded.recipe.engine
    out = []
    if lock.image != recipe.name:
        out.append(f"{where}: image: locks {lock.image!r}'s packages, not {recipe.name!r}'s")
    if (lock.engine_name, lock.engine_version) != (engine.name, engine.version):
        out.append(
            f"{where}: engine: resolved against {lock.engine_name} {lock.engine_version}'s lock, "
            f"the recipe pins {engine.name} {engine.version}"
        )
    wanted, locked = sorted(recipe.build.python_packages), sorted(lock.resolved_from.requirements)
    if wanted != locked:
        added, dropped = sorted(set(wanted) - set(locked)), sorted(set(locked) - set(wanted))
        parts = ([f"now names {', '.join(added)}"] if added else []) + (
            [f"no longer names {', '.join(dropped)}"] if dropped else []
        )
        out.append(
            f"{where}: resolved_from: build.python_packages changed since the lock was made: " + "; ".join(parts)
        )
    for plat in engine.platforms:
        out += _platform_problems(lock, plat, where)
    return out


def _platform_problems(lock: EngineLock, plat: str, where: str) -> list[str]:
    """Each requirement has a locked wheel for `plat` inside its specifier, and so does uv."""
    if plat not in lock.platforms:
        return [f"{where}: platforms: no {plat} entries (the recipe declares {plat})"]
    out = []
    env = engine_lock.platform(plat).marker_env()
    for raw in lock.resolved_from.requirements:
        req = Requirement(raw)
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        pkg = lock.package(req.name)
        if pkg is None or plat not in pkg.wheels:
            out.append(f"{where}: python_packages: {req.name} is not locked for {plat}")
        elif not req.specifier.contains(pkg.wheels[plat].version, prereleases=True):
            out.append(f"{where}: python_packages: {pkg.name} {pkg.wheels[plat].version} ({plat}) violates {raw}")
    uv = lock.tools.get("uv")
    if uv is None or plat not in uv.wheels:
        out.append(f"{where}: tools: no uv wheel for {plat} (the Dockerfile installs with it)")
    return out


def _engine_overlap(loaded: LoadedRecipe, lock: EngineLock, path: Path) -> list[str]:
    """A distribution both locks install: the recipe's install would replace the engine's."""
    e = loaded.recipe.engine
    try:
        engine_image_lock = engine_lock.for_image(
            engine_lock.engine_image_dir(e.flavour), e.name, e.version, loaded.name
        )
    except KilnError:
        return []  # the engine lock's own problem is kiln check's line already
    if engine_image_lock is None:
        return []
    engine_names = {p.key: p for p in engine_image_lock.python_packages}
    return [
        f"{engine_lock.shown(path)}: python_packages: {p.name} {p.version}: the engine lock installs "
        f"{engine_names[p.key].name} {engine_names[p.key].version} already"
        for p in lock.python_packages
        if canonicalize_name(p.name) in engine_names
    ]


def context_files(lock: EngineLock, plat: str) -> dict[str, bytes]:
    """The lock's files a recipe build context carries under _kiln/lock/ (functions of the
    lock's bytes, which the context holds too)."""
    files = engine_lock.context_files(lock, plat)
    missing = [name for name in _CONTEXT_FILES if name not in files]
    if missing:  # only uv.txt can be: a lock without a uv wheel for the platform
        raise LockInvalid(
            f"the {lock.image} lock has no uv wheel for {plat} (tools.uv)",
            hint=f"re-lock: `{relock_command(lock.image)}`",
        )
    return {name: files[name] for name in _CONTEXT_FILES}
