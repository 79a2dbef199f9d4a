"""Quilt-style scratch trees: `kiln patches checkout` and `kiln patches refresh`, for the
engine-wide series and for a recipe feature's own series.

A scratch tree is the full `vllm/` tree with the series applied, plus `.pc/<patch>/<file>`
holding each touched file as it was *before* that patch. `refresh` regenerates every
patch as the diff between its `.pc` snapshot and the next snapshot of that file (or the
working file, for the last patch touching it), so an edit lands in the top-most patch
that touches the file, as in `quilt refresh`.

A feature's series applies on top of the engine-wide series of the same engine version
(as in the image): that series is applied to the scratch tree first and is not tracked.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from kiln.basics import log
from kiln.basics.errors import PatchFailed, UsageError
from kiln.domain.patching.quilt_state import (
    STATE_FILE,
    PatchState,
    QuiltState,
    Target,
    dirty_files,
    file_sha,
    read_state,
    scratch_dir,
    sha_or_none,
)
from kiln.domain.patching.series import (
    ENGINE,
    engine_root,
    series_dir,
    series_for,
    shown,
    translate,
)
from kiln.domain.patching.text_diff import file_diff, merge3
from kiln.infra import wheel_cache
from kiln.inimage import patch_format, patch_tree


def checkout(target: Target, flavour: str | None = None, force: bool = False, force_apply: bool = False) -> Path:
    """Materialise `target.from_version`'s series applied to `target.version`'s sources
    under cache_dir()/scratch/, with quilt-style .pc snapshots for refresh."""
    series = target.series(target.from_version)
    root, used = engine_root(target.version, flavour)
    scratch = scratch_dir(target, used)
    if (scratch / ".pc" / STATE_FILE).is_file() and not force:
        edited = dirty_files(scratch, read_state(scratch))
        if edited:
            raise UsageError(
                f"{scratch} has edits not yet refreshed into patches: {', '.join(edited)}",
                hint="run `kiln patches refresh` first, or pass --force to discard them",
            )
    if scratch.exists():
        shutil.rmtree(scratch)
    shutil.copytree(root, scratch, ignore=shutil.ignore_patterns(wheel_cache.MARKER))
    tree = patch_tree.Tree(scratch)
    _apply_base(tree, target)
    pc = scratch / ".pc"
    entries: list[PatchState] = []
    failures: list[str] = []
    old = _old_engine(target, used)
    for patch in series.patches:
        before = {t: tree.read(t) for t in patch.targets}
        res = patch_tree.apply_patch(tree, patch, partial=force_apply or old is not None)
        merged = _merge_port(old, tree, patch, res, before) if old is not None and not res.ok else set()
        if old is not None:
            patch_tree.apply_patch(old, patch)  # the old engine advances in step, for the next merge
        if merged:
            res = patch_tree.PatchResult(patch, [f for f in res.files if f.target not in merged])
        failures += res.failure_lines()
        for target_file, number, off in res.offsets:
            log.info(
                f"{patch.display}: {target_file}: hunk #{number} applies with offset {off:+d} lines "
                "(refresh rewrites it)"
            )
        for t, data in before.items():
            if data is not None:
                snap = pc / patch.name / t
                snap.parent.mkdir(parents=True, exist_ok=True)
                snap.write_bytes(data)
        entries.append(
            {
                "name": patch.name,
                "sha256": patch.sha256,
                "exact": res.ok and not res.offsets and not merged,  # else refresh must regenerate it
                "before": {t: sha_or_none(d) for t, d in before.items()},
                "after": {t: sha_or_none(tree.read(t)) for t in patch.targets},
            }
        )
        for t, hr in res.failed_hunks:
            rej = scratch / f"{t}.rej"
            rej.parent.mkdir(parents=True, exist_ok=True)
            with rej.open("ab") as fh:
                fh.write(hr.hunk.to_bytes())
    if failures and not force_apply:
        shutil.rmtree(scratch)
        raise PatchFailed(failures, hint="pass --force-apply to check out what applies and get .rej files for the rest")
    tree.commit()
    final = {t: sha_or_none(tree.read(t)) for p in series.patches for t in p.targets}
    pc.mkdir(exist_ok=True)
    (pc / "applied-patches").write_text("".join(f"{p.name}\n" for p in series.patches))
    state: QuiltState = {
        "engine": target.version,
        "flavour": used,
        "series_from": target.from_version,
        "feature": target.feature_name(),
        "patches": entries,
        "final": final,
    }
    (pc / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
    _save_finals(scratch, state)
    for line in failures:
        log.warn(line)
    return scratch


_FINAL = ".final"  # .pc/.final/<file>: every patched file as the last checkout/refresh left it


def _save_finals(scratch: Path, state: QuiltState) -> None:
    """Keep the bytes behind state["final"]: `refresh --patch` needs them as the base
    of the merge that moves an edit under the patches after the one it belongs to."""
    root = scratch / ".pc" / _FINAL
    shutil.rmtree(root, ignore_errors=True)
    for rel in state["final"]:
        if (scratch / rel).is_file():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(scratch / rel, root / rel)


def _old_engine(target: Target, flavour: str) -> patch_tree.Tree | None:
    """When the series is ported from another version (--series-from), that version's
    engine as its image installs it (the engine series under a feature's), in memory:
    the base of the 3-way merges of hunks that no longer apply as written."""
    if target.from_version == target.version:
        return None
    old = patch_tree.Tree(engine_root(target.from_version, flavour)[0])
    if target.feature is not None and (series_dir(target.from_version) / "series").is_file():
        try:
            patch_tree.apply_series(old, [series_for(target.from_version)])
        except patch_format.PatchError as exc:
            raise translate(exc) from None
    return old


def _merge_port(
    old: patch_tree.Tree,
    tree: patch_tree.Tree,
    patch: patch_format.Patch,
    res: patch_tree.PatchResult,
    before: dict[str, bytes | None],
) -> set[str]:
    """Port the files of `patch` whose hunks did not all apply by merging (old file ->
    patched old file) into the new file, as `git merge-file` does (`kiln engine bump`
    does the same for the engine series). Files that merge without conflict, and still
    compile, are written to `tree` and their names returned; the others keep what
    applied (and get .rej files)."""
    patched_old = old.fork()
    if not patch_tree.apply_patch(patched_old, patch).ok:
        return set()  # not a patch of the old version as it stands: nothing to merge from
    ported = set()
    for f in res.files:
        if f.ok:
            continue
        base, ours, theirs = old.read(f.target), patched_old.read(f.target), before.get(f.target)
        if base is None or ours is None or theirs is None:
            continue
        result = merge3(base, ours, theirs, ("patch", "old engine", "new engine"))
        if result.conflicts:
            continue
        if f.target.endswith(".py") and patch_tree.compile_problems(_one_file(tree, f.target, result.data), {}):
            continue
        tree.write(f.target, result.data)
        ported.add(f.target)
        hunks = ", ".join(f"#{h.number}" for h in f.hunks if h.offset is None)
        log.info(
            f"{patch.display}: {f.target}: ported by 3-way merge (hunk(s) {hunks} did not apply as written; "
            "refresh rewrites it)"
        )
    return ported


def _one_file(tree: patch_tree.Tree, target: str, data: bytes) -> patch_tree.Tree:
    probe = patch_tree.Tree(tree.root)
    probe.write(target, data)
    return probe


def _apply_base(tree: patch_tree.Tree, target: Target) -> None:
    """The engine series under a feature's, committed to the scratch tree first: the
    upstream state the feature's patches are diffs against."""
    base = target.base()
    if not base or not base[0].patches:
        return
    try:
        patch_tree.apply_series(tree, base)
    except patch_format.PatchError as exc:
        raise translate(exc, hint=f"port the engine series first: `kiln engine bump --to {target.version}`") from None
    tree.commit()


def refresh(target: Target, flavour: str | None = None, into: str | None = None) -> list[str]:
    """Regenerate the target's series for `target.version` from the scratch tree.
    Unchanged patches keep their exact bytes; returns the names of the patch files rewritten.
    An edit goes into the last patch touching its file, unless `into` names a patch:
    then edits of the files that patch touches go into it (the patches after it are
    rebased over them), and so do edited files no patch touches (a new file section)."""
    _, used = engine_root(target.version, flavour)
    scratch = scratch_dir(target, used)
    state = read_state(scratch)
    rejects = sorted(str(p.relative_to(scratch)) for p in scratch.rglob("*.rej"))
    if rejects:
        raise UsageError(
            f"{scratch}: unresolved rejects: {', '.join(rejects)}",
            hint="port those hunks by hand, delete the .rej files, then refresh",
        )
    if into is not None:
        _move_edits(scratch, state, into, target)
    source = target.series_folder(state["series_from"])
    dest = target.series_folder(target.version)
    by_name = {p.name: p for p in target.series(state["series_from"]).patches}
    written, afters = [], []
    for i, entry in enumerate(state["patches"]):
        patch = by_name.get(entry["name"])
        if patch is None or patch.sha256 != entry["sha256"]:
            raise UsageError(
                f"{shown(source / entry['name'])} changed since checkout; refreshing would lose that",
                hint="run `kiln patches checkout --force` to start over from the current patch files",
            )
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
    _warn_untracked_edits(scratch, state, target)
    # The refreshed patches are the new baseline: a second refresh is a no-op.
    new_state: QuiltState = {
        **state,
        "series_from": target.version,
        "patches": [
            {**e, "sha256": patch_format.sha256_bytes((dest / e["name"]).read_bytes()), "exact": True, "after": after}
            for e, after in zip(state["patches"], afters, strict=True)
        ],
    }
    new_state["final"] = {rel: file_sha(scratch / rel) for rel in state["final"]}
    (scratch / ".pc" / STATE_FILE).write_text(json.dumps(new_state, indent=2) + "\n")
    _save_finals(scratch, new_state)
    return written


def _move_edits(scratch: Path, state: QuiltState, name: str, target: Target) -> None:
    """Make the scratch tree's edits belong to patch `name` (quilt would need a pop to
    the patch, an edit and a push): for each edited file it touches, the snapshots of
    the later patches touching that file get the edit too (a 3-way merge: base = the
    file as checkout left it, ours = the edited file, theirs = the snapshot), so the
    edit lands in `name`'s diff and not in theirs; each edited file no patch touches
    becomes a new section of `name`. Updates `state` and the .pc snapshots in place."""
    entries = state["patches"]
    k = next((i for i, e in enumerate(entries) if e["name"] == name), None)
    if k is None:
        raise UsageError(f"--patch {name}: not in the checked-out series ({', '.join(e['name'] for e in entries)})")
    finals = scratch / ".pc" / _FINAL
    for rel, sha in state["final"].items():
        if rel not in entries[k]["before"] or file_sha(scratch / rel) == sha:
            continue
        later = [e for e in entries[k + 1 :] if rel in e["before"]]
        if not later:
            continue  # `name` is the top patch of this file: the edit goes there anyway
        base = finals / rel
        if not base.is_file() or file_sha(base) != sha:
            raise UsageError(
                f"{scratch}: no record of {rel} as checkout left it",
                hint="check out again (`kiln patches checkout --force`), redo the edit, then refresh",
            )
        if sha is None or not (scratch / rel).is_file():
            raise UsageError(f"--patch {name}: {rel} was created or deleted; move that by hand")
        ours = (scratch / rel).read_bytes()
        for e in later:
            snap = scratch / ".pc" / e["name"] / rel
            if e["before"][rel] is None:
                raise UsageError(f"--patch {name}: {e['name']} creates {rel}; move the edit by hand")
            merged = merge3(base.read_bytes(), ours, snap.read_bytes(), ("edit", "checkout", e["name"]))
            if merged.conflicts:
                raise UsageError(
                    f"--patch {name}: the edit of {rel} conflicts with {e['name']} "
                    f"(lines {', '.join(f'{a}-{b}' for a, b in merged.conflicts)})",
                    hint=f"refresh without --patch, or edit {e['name']} by hand",
                )
            snap.write_bytes(merged.data)
            e["before"][rel] = patch_format.sha256_bytes(merged.data)
        log.info(f"{rel}: the edit goes into {name}, under {', '.join(e['name'] for e in later)}")
    for rel in _untracked_edits(scratch, state, target):
        pristine = _pristine(state, target).read(rel)
        if pristine is not None:
            snap = scratch / ".pc" / name / rel
            snap.parent.mkdir(parents=True, exist_ok=True)
            snap.write_bytes(pristine)
        entries[k]["before"][rel] = sha_or_none(pristine)
        entries[k]["after"][rel] = sha_or_none(pristine)
        state["final"][rel] = sha_or_none(pristine)
        log.info(f"{rel}: not in any patch; added to {name}")


def _regenerate(
    scratch: Path, state: QuiltState, index: int, patch: patch_format.Patch, exact: bool
) -> tuple[bytes, dict[str, str | None]]:
    """Patch `index`'s new bytes, and the sha256 of each of its files' post-images."""
    entries = state["patches"]
    parts = [patch.header]
    after_shas: dict[str, str | None] = {}
    sections: list[tuple[str, patch_format.FileDiff | None]] = [(fd.target, fd) for fd in patch.files]
    # files `refresh --patch` added to this patch: a new section each
    sections += [(t, None) for t in entries[index]["before"] if t not in patch.targets]
    for t, fd in sections:
        before = _snapshot(scratch, entries[index], t)
        nxt = next((e for e in entries[index + 1 :] if t in e["before"]), None)
        after = _snapshot(scratch, nxt, t) if nxt else ((scratch / t).read_bytes() if (scratch / t).is_file() else None)
        after_sha = after_shas[t] = sha_or_none(after)
        if fd is not None and exact and after_sha == entries[index]["after"][t]:
            parts.append(fd.raw)  # untouched: keep the bytes as written
        else:
            parts.append(file_diff(t, before, after, fd.preamble if fd is not None else ()))
    return b"".join(parts), after_shas


def _snapshot(scratch: Path, entry: PatchState, target: str) -> bytes | None:
    if entry["before"][target] is None:
        return None
    return (scratch / ".pc" / entry["name"] / target).read_bytes()


def _pristine(state: QuiltState, target: Target) -> patch_tree.Tree:
    """The engine as the scratch tree had it before the series (a feature's tree carries
    the engine series: not an edit)."""
    pristine = patch_tree.Tree(engine_root(state["engine"], state["flavour"])[0])
    for series in target.base():
        patch_tree.apply_series(pristine, [series])
    return pristine


def _untracked_edits(scratch: Path, state: QuiltState, target: Target) -> list[str]:
    """Files of the scratch tree that differ from the engine but belong to no patch."""
    pristine = _pristine(state, target)
    tracked = set(state["final"])
    out = []
    for path in sorted((scratch / ENGINE).rglob("*")):
        if not path.is_file():
            continue
        rel = str(path.relative_to(scratch))
        if rel in tracked:
            continue
        orig = pristine.read(rel)
        if orig is None or len(orig) != path.stat().st_size or orig != path.read_bytes():
            out.append(rel)
    return out


def _warn_untracked_edits(scratch: Path, state: QuiltState, target: Target) -> None:
    for rel in _untracked_edits(scratch, state, target):
        log.warn(
            f"{rel} differs from upstream but belongs to no patch; its change is not recorded "
            "(`kiln patches refresh --patch NAME` adds it to patch NAME)"
        )
