"""`kiln engine lock [RECIPE|--all] [--check] [--platform P] [--recipe-only]`: write (or,
with --check, only ask the index about) the lock of each engine image the recipes use,
then each recipe's own lock (build.python_packages -> recipes/NAME/recipe.lock.json,
kiln.domain.locks.recipe_lock), resolved against the engine lock just written;
`--recipe-only` leaves the engine locks as they are and writes only the recipes'."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from kiln.basics import log
from kiln.basics.errors import LockInvalid, UsageError
from kiln.commands.options import Subparsers
from kiln.domain.images.ca_bundle import resolve_ca
from kiln.domain.images.engine_image import EngineImage
from kiln.domain.locks import engine_lock as L
from kiln.domain.locks import lock_records as LR
from kiln.domain.locks import lock_resolver, recipe_lock
from kiln.domain.recipes.recipe import LoadedRecipe, load_recipe, recipe_dir, recipe_names
from kiln.domain.recipes.recipe_sections import Engine
from kiln.infra.docker import DockerDaemon


def _recipes(args: argparse.Namespace) -> list[LoadedRecipe]:
    if args.all == bool(args.recipe):
        raise UsageError("name one recipe or pass --all")
    names = [args.recipe] if args.recipe else recipe_names()
    return [load_recipe(recipe_dir(n)) for n in names]


def _engines(loaded: list[LoadedRecipe]) -> list[tuple[str, Engine]]:
    """(a recipe that uses it, engine) per distinct engine image and version."""
    seen: dict[tuple[str, str, str], tuple[str, Engine]] = {}
    for item in loaded:
        e = item.recipe.engine
        seen.setdefault((e.flavour, e.name, e.version), (item.name, e))
    return [seen[k] for k in sorted(seen)]


def uses_locks(engine: Engine) -> bool:
    return L.uses_locks(L.engine_image_dir(engine.flavour))


def _platforms_wanted(engine: Engine) -> list[str]:
    """A new lock's platforms: every platform a recipe on this engine image and version
    builds for (a bump's first lock would otherwise hold linux/amd64 only, and the
    recipe's arm64 build would then fail for want of its wheels)."""
    wanted = {str(p) for p in engine.platforms}
    for name in recipe_names():
        e = load_recipe(recipe_dir(name)).recipe.engine
        if (e.flavour, e.name, e.version) == (engine.flavour, engine.name, engine.version):
            wanted.update(str(p) for p in e.platforms)
    return sorted(wanted)


def lock_engine(
    recipe: str, engine: Engine, platforms: list[str] | None = None, docker: DockerDaemon | None = None
) -> LR.EngineLock:
    """Resolve and write one engine's lock (unchanged bytes are not rewritten)."""
    t0 = time.monotonic()
    folder = L.engine_image_dir(engine.flavour)
    path = L.lock_path(folder, engine.name, engine.version)
    if platforms is None:
        platforms = L.load(path).platforms if path.is_file() else _platforms_wanted(engine)
    cafile = resolve_ca(None).path
    lock = lock_resolver.make_lock(
        engine,
        folder,
        platforms,
        cafile=cafile,
        docker=docker or DockerDaemon(),
        base_of=lambda platform: EngineImage(engine, None, platform).base_ref,
    )
    changed = L.write(lock, path)
    debian = sum(len(v) for v in lock.debian_packages.values())
    what = (
        f"{len(lock.python_packages)} Python distributions"
        + (f" (+{len(lock.plain_extra_packages)} for the plain anchor)" if lock.plain_extra_packages else "")
        + f", {debian} Debian packages, {', '.join(lock.platforms)}"
    )
    verb = "wrote" if changed else "unchanged:"
    log.ok(f"{verb} {L.shown(path)}: {what} (for {recipe}) [{log.human_secs(time.monotonic() - t0)}]")
    return lock


def lock_recipe(loaded: LoadedRecipe, platforms: list[str] | None = None) -> LR.EngineLock:
    """Resolve and write a recipe's own lock against its committed engine lock (unchanged
    bytes are not rewritten)."""
    t0 = time.monotonic()
    e = loaded.recipe.engine
    engine_lock = L.for_image(L.engine_image_dir(e.flavour), e.name, e.version, loaded.name)
    if engine_lock is None:
        raise LockInvalid(
            f"{L.shown(L.engine_image_dir(e.flavour))}: not built from a lock; "
            f"{loaded.name}'s build.python_packages are locked against its engine's lock"
        )
    path = recipe_lock.lock_path(loaded.dir)
    lock = lock_resolver.make_recipe_lock(
        loaded.name,
        list(loaded.recipe.build.python_packages),
        engine_lock,
        platforms or list(e.platforms),
        cafile=resolve_ca(None).path,
    )
    verb = "wrote" if L.write(lock, path) else "unchanged:"
    names = ", ".join(f"{p.name} {p.version}" for p in lock.python_packages) or "nothing beyond the engine lock"
    log.ok(f"{verb} {L.shown(path)}: {names}, {', '.join(lock.platforms)} [{log.human_secs(time.monotonic() - t0)}]")
    return lock


def _cmd_engine_lock(args: argparse.Namespace) -> int:
    loaded = _recipes(args)
    engines = [] if args.recipe_only else _engines(loaded)
    own = [item for item in loaded if item.recipe.build.python_packages]
    if args.recipe_only and not own:
        raise UsageError(f"--recipe-only: {args.recipe or 'no recipe'} names no build.python_packages")
    if args.check:
        return _check(_committed(engines, own))
    for recipe, engine in engines:
        lock_engine(recipe, engine, args.platform or None)
    for item in own:
        lock_recipe(item, args.platform or None)
    return 0


def _committed(engines: list[tuple[str, Engine]], own: list[LoadedRecipe]) -> list[tuple[Path, LR.EngineLock | None]]:
    """(lock file, its lock or None for an engine image without locks/) of each engine
    and each recipe's own packages, as committed: what `--check` asks the index about."""
    out: list[tuple[Path, LR.EngineLock | None]] = []
    for recipe, e in engines:
        folder = L.engine_image_dir(e.flavour)
        out.append((L.lock_path(folder, e.name, e.version), L.for_image(folder, e.name, e.version, recipe)))
    return out + [(recipe_lock.lock_path(item.dir), recipe_lock.for_recipe(item)) for item in own]


def _check(locks: list[tuple[Path, LR.EngineLock | None]]) -> int:
    cafile = resolve_ca(None).path
    for path, lock in locks:
        if lock is None:
            log.info(f"{L.shown(path.parent.parent)}: not built from a lock")
            continue
        findings = lock_resolver.outdated(lock, cafile=cafile)
        total = len(lock.python_packages) + len(lock.plain_extra_packages) + len(lock.tools)
        yanked = sum(bool(f.yanked) for f in findings)
        newer = sum(bool(f.newest) for f in findings)
        log.out.print(f"{L.shown(path)}: {total} locked, {yanked} yanked, {newer} with newer releases", markup=False)
        for f in findings:
            log.out.print(f"  {f.line()}", markup=False)
    log.info("nothing was changed; `kiln engine lock RECIPE` re-locks")
    return 0


def register_engine(es: Subparsers) -> None:
    """`kiln engine lock` (added to the `kiln engine` subcommands)."""
    s = es.add_parser("lock", help="pin every Python wheel (by sha256) and Debian package an engine image installs")
    s.add_argument("recipe", nargs="?", help="the recipe whose engine image to lock")
    s.add_argument("--all", action="store_true", help="every engine image and version the recipes use")
    s.add_argument(
        "--check",
        action="store_true",
        help="only say which locked versions are yanked or have newer releases; change nothing",
    )
    s.add_argument(
        "--platform",
        action="append",
        choices=sorted(L.PLATFORMS),
        help="lock for this platform (repeatable; default: the lock's own, else every "
        "platform the recipes on that engine build for; a recipe's own lock: its engine.platforms)",
    )
    s.add_argument(
        "--recipe-only",
        action="store_true",
        help="only the recipe's own packages (build.python_packages -> recipes/NAME/recipe.lock.json), "
        "resolved against the committed engine lock, which is left as it is",
    )
    s.set_defaults(func=_cmd_engine_lock)
