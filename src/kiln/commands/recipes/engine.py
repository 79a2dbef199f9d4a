"""`kiln engine bump|lock|outdated`: the engine a recipe pins, as one command group.

- `bump --to V [--recipe NAME]`: port the patch series to another engine version
  (kiln.domain.patching.bump), then move a recipe onto it and re-lock its images;
- `lock [RECIPE|--all] [--check] [--platform P] [--recipe-only]`: write (or, with
  --check, only ask the index about) each engine image's lock, then each recipe's own
  lock (build.python_packages -> recipes/NAME/recipe.lock.json), resolved against the
  engine lock just written;
- `outdated [--json] [--index-url URL]`: exit 36 (`EngineOutdated`) when a recipe pins
  an older engine than the newest release on the index, 37 when the index cannot be
  asked, 38 when its answer is no index page.

Argument parsing and printing only: the work is done in kiln.domain.patching and
kiln.domain.locks."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from kiln.basics import log
from kiln.basics.errors import EngineOutdated, LockInvalid, UsageError
from kiln.commands.options import Subparsers, reports
from kiln.domain.images.ca_bundle import resolve_ca
from kiln.domain.images.engine_image import EngineImage
from kiln.domain.locks import engine_lock, lock_records, lock_resolver, recipe_lock
from kiln.domain.patching import outdated, series
from kiln.domain.patching.bump import PortedEngine, bump, default_from, move_recipe
from kiln.domain.recipes.recipe import LoadedRecipe, load_recipe, recipe_dir, recipe_names
from kiln.domain.recipes.recipe_sections import Engine
from kiln.infra import package_index, wheel_cache
from kiln.infra.docker import DockerDaemon
from kiln.usecases.bump_report import command_line, write_bump_report

_HEADER = ("recipe", "distribution", "pinned", "newest on index", "newest with a kiln series", "status")


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


def _uses_locks(engine: Engine) -> bool:
    return engine_lock.uses_locks(engine_lock.engine_image_dir(engine.flavour))


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


def _lock_engine(
    recipe: str, engine: Engine, platforms: list[str] | None = None, docker: DockerDaemon | None = None
) -> lock_records.EngineLock:
    """Resolve and write one engine's lock (unchanged bytes are not rewritten)."""
    t0 = time.monotonic()
    folder = engine_lock.engine_image_dir(engine.flavour)
    path = engine_lock.lock_path(folder, engine.name, engine.version)
    if platforms is None:
        platforms = engine_lock.load(path).platforms if path.is_file() else _platforms_wanted(engine)
    cafile = resolve_ca(None).path
    lock = lock_resolver.make_lock(
        engine,
        folder,
        platforms,
        cafile=cafile,
        docker=docker or DockerDaemon(),
        base_of=lambda platform: EngineImage(engine, None, platform).base_ref,
    )
    changed = engine_lock.write(lock, path)
    debian = sum(len(v) for v in lock.debian_packages.values())
    what = (
        f"{len(lock.python_packages)} Python distributions"
        + (f" (+{len(lock.plain_extra_packages)} for the plain anchor)" if lock.plain_extra_packages else "")
        + f", {debian} Debian packages, {', '.join(lock.platforms)}"
    )
    verb = "wrote" if changed else "unchanged:"
    log.ok(f"{verb} {engine_lock.shown(path)}: {what} (for {recipe}) [{log.human_secs(time.monotonic() - t0)}]")
    return lock


def _lock_recipe(loaded: LoadedRecipe, platforms: list[str] | None = None) -> lock_records.EngineLock:
    """Resolve and write a recipe's own lock against its committed engine lock (unchanged
    bytes are not rewritten)."""
    t0 = time.monotonic()
    e = loaded.recipe.engine
    pinned_lock = engine_lock.for_image(engine_lock.engine_image_dir(e.flavour), e.name, e.version, loaded.name)
    if pinned_lock is None:
        raise LockInvalid(
            f"{engine_lock.shown(engine_lock.engine_image_dir(e.flavour))}: not built from a lock; "
            f"{loaded.name}'s build.python_packages are locked against its engine's lock"
        )
    path = recipe_lock.lock_path(loaded.dir)
    lock = lock_resolver.make_recipe_lock(
        loaded.name,
        list(loaded.recipe.build.python_packages),
        pinned_lock,
        platforms or list(e.platforms),
        cafile=resolve_ca(None).path,
    )
    verb = "wrote" if engine_lock.write(lock, path) else "unchanged:"
    names = ", ".join(f"{p.name} {p.version}" for p in lock.python_packages) or "nothing beyond the engine lock"
    took = log.human_secs(time.monotonic() - t0)
    log.ok(f"{verb} {engine_lock.shown(path)}: {names}, {', '.join(lock.platforms)} [{took}]")
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
        _lock_engine(recipe, engine, args.platform or None)
    for item in own:
        _lock_recipe(item, args.platform or None)
    return 0


def _committed(
    engines: list[tuple[str, Engine]], own: list[LoadedRecipe]
) -> list[tuple[Path, lock_records.EngineLock | None]]:
    """(lock file, its lock or None for an engine image without locks/) of each engine
    and each recipe's own packages, as committed: what `--check` asks the index about."""
    out: list[tuple[Path, lock_records.EngineLock | None]] = []
    for recipe, e in engines:
        folder = engine_lock.engine_image_dir(e.flavour)
        out.append(
            (engine_lock.lock_path(folder, e.name, e.version), engine_lock.for_image(folder, e.name, e.version, recipe))
        )
    return out + [(recipe_lock.lock_path(item.dir), recipe_lock.for_recipe(item)) for item in own]


def _check(locks: list[tuple[Path, lock_records.EngineLock | None]]) -> int:
    cafile = resolve_ca(None).path
    for path, lock in locks:
        if lock is None:
            log.info(f"{engine_lock.shown(path.parent.parent)}: not built from a lock")
            continue
        findings = lock_resolver.outdated(lock, cafile=cafile)
        total = len(lock.python_packages) + len(lock.plain_extra_packages) + len(lock.tools)
        yanked = sum(bool(f.yanked) for f in findings)
        newer = sum(bool(f.newest) for f in findings)
        log.out.print(
            f"{engine_lock.shown(path)}: {total} locked, {yanked} yanked, {newer} with newer releases", markup=False
        )
        for f in findings:
            log.out.print(f"  {f.line()}", markup=False)
    log.info("nothing was changed; `kiln engine lock RECIPE` re-locks")
    return 0


def _register_lock(es: Subparsers) -> None:
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
        choices=sorted(engine_lock.PLATFORMS),
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


def _cmd_engine_bump(args: argparse.Namespace) -> int:
    to_version = series.parse_engine(args.to)
    if args.report is not None and not args.dry_run:
        raise UsageError("--report goes with --dry-run (a report changes nothing)")
    ported = args.recipe and series.series_dir(to_version).is_dir() and not args.from_version
    if ported:  # moving one more recipe onto an engine whose series is already ported
        log.ok(f"{series.shown(series.series_dir(to_version))} exists; moving {args.recipe} onto it")
    else:
        from_version = series.parse_engine(args.from_version) if args.from_version else default_from(to_version)
        then = None
        if args.report is not None:
            command = command_line(to_version, args.from_version and from_version, args.flavour, args.report)

            def then(engine: PortedEngine) -> None:
                text, written = write_bump_report(
                    (from_version, to_version), args.flavour, engine, args.report, command
                )
                log.out.print(text, markup=False, end="")
                if written is not None:
                    log.ok(f"wrote {written}")

        bump(from_version, to_version, args.flavour, args.dry_run, then)
    if args.recipe and not args.dry_run:
        move_recipe(args.recipe, to_version)
        # the recipe's engine image needs a lock for the new version (input of its digest)
        loaded = series.load_recipe(args.recipe)
        moved = loaded.recipe.engine
        if _uses_locks(moved):
            _lock_engine(args.recipe, moved)
            if loaded.recipe.build.python_packages:  # its own lock is resolved against the engine's
                _lock_recipe(loaded)
    return 0


def _status(row: outdated.OutdatedRow) -> str:
    if row["status"] == "current":
        return "up to date"
    if row["status"] == "not-on-index":
        return "not on the index"
    ready = row["next"] is not None and "--recipe" in row["next"]
    return "lags (series ready)" if ready else f"lags (no series for {row['newest_on_index']} yet)"


def _table(doc: outdated.OutdatedDocument) -> list[str]:
    """The rows for a person: one line per recipe under a header, columns aligned."""
    cells = [_HEADER] + [
        (
            r["recipe"],
            r["distribution"],
            r["engine"]["version"],
            r["newest_on_index"] or "-",
            r["newest_with_series"] or "-",
            _status(r),
        )
        for r in doc["recipes"]
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(_HEADER) - 1)]
    return ["  ".join([*(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)), row[-1]]) for row in cells]


def _summary(doc: outdated.OutdatedDocument, behind: list[outdated.OutdatedRow]) -> str:
    """One line: how many recipes lag, and what is out per distribution."""
    news: dict[tuple[str, str], set[str]] = {}
    for r in behind:
        news.setdefault((r["distribution"], r["newest_on_index"] or ""), set()).add(r["engine"]["version"])
    what = "; ".join(
        f"{dist} {newest} is out (pinned: {', '.join(sorted(pins))})" for (dist, newest), pins in sorted(news.items())
    )
    return f"{len(behind)} of {len(doc['recipes'])} recipe(s) lag the package index {doc['index']}: {what}"


def _cmd_engine_outdated(args: argparse.Namespace) -> int:
    index = (args.index_url or package_index.index_url()).rstrip("/")
    cafile = package_index.index_cafile()
    doc = outdated.outdated(index, lambda dist: package_index.wheel_releases(dist, index=index, cafile=cafile))
    behind = outdated.lagging(doc)
    if args.json:
        log.emit_json(doc)
    else:
        for line in _table(doc):
            log.out.print(line, markup=False)
    if behind:
        for step in sorted({r["next"] for r in behind if r["next"]}):
            log.info(f"next: {step}")
        raise EngineOutdated(_summary(doc, behind))
    log.ok(f"{len(doc['recipes'])} recipe(s) pin the newest engine release on {index}")
    return 0


def _register_outdated(es: Subparsers) -> None:
    s = reports(
        es.add_parser(
            "outdated", help="does a recipe pin an older engine than the newest release on the package index? (exit 36)"
        )
    )
    s.add_argument(
        "--index-url",
        metavar="URL",
        help="the simple index to ask (default: pip's index-url, else https://pypi.org/simple)",
    )
    s.set_defaults(func=_cmd_engine_outdated)


def _register_bump(es: Subparsers) -> None:
    s = es.add_parser("bump", help="port the patch series to another engine version (--dry-run: only report)")
    s.add_argument("--to", required=True, help=f"{series.ENGINE}==Y or Y")
    s.add_argument("--from", dest="from_version", help="series to bump (default: the newest one older than --to)")
    s.add_argument("--dry-run", action="store_true", help="report per patch; change nothing")
    s.add_argument(
        "--flavour",
        choices=sorted(wheel_cache.DISTRIBUTIONS),
        help="wheel whose sources are used: cpu (default, smaller) or cuda",
    )
    s.add_argument(
        "--recipe",
        metavar="NAME",
        help="then pin this recipe to the new version (its features' series for that version must apply)",
    )
    s.add_argument(
        "--report",
        nargs="?",
        const="",
        metavar="FILE.md",
        help="with --dry-run: also report what moving the recipes on the old version would change "
        "(flags and speculative-config keys, every series' patches, requirements, image size); "
        "FILE.md: write it as Markdown too",
    )
    s.set_defaults(func=_cmd_engine_bump)


def register(sub: Subparsers) -> None:
    """Add `engine` (bump, lock, outdated) to the kiln CLI's subparsers."""
    e = sub.add_parser("engine", help="engine version management")
    es = e.add_subparsers(dest="engine_command", required=True, parser_class=type(e))
    _register_bump(es)
    _register_lock(es)
    _register_outdated(es)
