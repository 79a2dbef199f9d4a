"""`kiln engine bump`: port the engine-wide series to another engine version."""

from __future__ import annotations

import shutil
from pathlib import Path

from .. import log
from ..errors import PatchFailed, UsageError
from . import applier
from .quilt import Target, checkout, refresh
from .series import ENGINE, engine_root, pinned_versions, series_dir, series_for, shown, version_key


def classify(tree: applier.Tree, patch: applier.Patch) -> tuple[str, str, list[str]]:
    """(status, detail, failure lines) of one patch against `tree`, applying it to the
    tree if it applies. status: clean | offset | upstream (it reverse-applies: the change
    is already there) | fails."""
    res = applier.apply_patch(tree, patch)
    if res.ok:
        if not res.offsets:
            return "clean", "applies cleanly", []
        where = ", ".join(f"{t} hunk #{n} {o:+d}" for t, n, o in res.offsets)
        return "offset", f"applies with offset: {where}", []
    if applier.apply_patch(tree.fork(), patch, reverse=True).ok:
        return "upstream", "already upstream (reverse-applies): drop it from the series", []
    parts = []
    for target, hr in res.failed_hunks:
        content = tree.read(target)
        rev = hr.hunk.reversed()
        # a failing hunk whose reverse is found: this part of the change is upstream already
        upstream = content is not None and applier.locate_hunk(
            applier.split_lines(content), rev, applier.stated_index(rev), 0) is not None
        parts.append(f"{target} hunk #{hr.number}" + (" (already upstream)" if upstream else ""))
    parts += [f"{f.target}: {f.problem}" for f in res.files if f.problem]
    return "fails", "fails: " + ", ".join(parts), res.failure_lines()


def bump_report(from_version: str, to_version: str, flavour: str | None = None) -> list[tuple[str, str, str, list[str]]]:
    """(patch name, status, detail, failure lines) for every patch of `from_version`'s
    series against `to_version`'s sources, in series order (a patch that applies is
    applied before the next one is classified, as the build would)."""
    series = series_for(from_version)
    tree = applier.Tree(engine_root(to_version, flavour)[0])
    return [(patch.name, *classify(tree, patch)) for patch in series.patches]


def default_from(to_version: str) -> str:
    """The newest series older than `to_version` (what a bump normally starts from)."""
    target = version_key(to_version)
    older = [v for v in pinned_versions() if target is None or version_key(v) < target]
    if not older:
        have = ", ".join(pinned_versions()) or "none"
        raise UsageError(f"no series older than {to_version} under patches/{ENGINE}/ (series exist for: {have})",
                         hint="name the one to port with --from")
    return older[-1]


def bump(from_version: str, to_version: str, flavour: str | None, dry_run: bool) -> list[tuple]:
    rows = bump_report(from_version, to_version, flavour)
    log.out.print(f"{ENGINE} {from_version} -> {to_version}: {len(rows)} patch(es)", markup=False)
    width = max((len(r[0]) for r in rows), default=0)
    for name, _, detail, _ in rows:
        log.out.print(f"  {name.ljust(width)}  {detail}", markup=False)
    failures = [line for row in rows for line in row[3]]
    if failures:
        raise PatchFailed(failures, hint=f"port them: `kiln patches checkout --engine {ENGINE}=={to_version} "
                                         f"--series-from {from_version} --force-apply`, fix, "
                                         f"`kiln patches refresh --engine {ENGINE}=={to_version}`")
    if not dry_run:
        write_bumped_series(from_version, to_version, rows, flavour)
    return rows


def write_bumped_series(from_version: str, to_version: str, rows, flavour: str | None) -> Path:
    """patches/vllm/<to>/: the old series minus patches already upstream, with patches
    that applied at an offset regenerated against the new sources (checkout + refresh).
    Only called when every patch ported; a folder that already exists is never touched."""
    dest = series_dir(to_version)
    if dest.exists():
        raise UsageError(f"{shown(dest)} already exists", hint="remove it or edit it with checkout/refresh")
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
        target = Target(to_version, to_version)
        checkout(target, flavour, force=True)
        rewritten = refresh(target, flavour)
    except BaseException:
        shutil.rmtree(dest)
        raise
    log.ok(f"wrote {shown(dest)}: {len(kept)} patch(es), {len(dropped)} dropped as upstream, "
           f"{len(rewritten)} regenerated for offsets")
    log.info(f"next: port each feature used on {to_version} (`kiln patches checkout --feature RECIPE/FEATURE "
             f"--engine {ENGINE}=={to_version} --series-from {from_version}`, then `kiln patches refresh "
             f"--feature RECIPE/FEATURE --engine {ENGINE}=={to_version}`), set engine.version: {to_version} "
             "in the recipes, `kiln check --all`, `kiln build NAME`")
    return dest
