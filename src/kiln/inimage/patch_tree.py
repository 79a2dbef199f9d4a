"""The patch engine of the in-image applier: a tree of files with in-memory changes, and
quilt-style patches applied to it with GNU patch's semantics (fuzz 0).

Standard library only: engine build contexts carry this module next to the applier
(``kiln_patchtree.py`` beside ``kiln_patching.py``, see kiln.inimage.patch_applier), and
the host-side commands (`kiln patches ...`, in kiln.domain.patching) apply series with
the very same code.

Semantics follow GNU patch with fuzz 0 (what quilt uses by default):

* paths are stripped of one component (-p1) and resolved against the root (site-packages);
* every context and removed line must match exactly; a hunk that is not at its stated
  line is searched for outward from it (forward first), after the previous hunk, and the
  offset is carried to the next hunk; a hunk with less leading than trailing context is
  anchored to the start of the file (and the reverse to the end), as GNU patch does;
* nothing is written unless every hunk of every patch applies (all-or-nothing).
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

# One import per place this runs: relative on the host (kiln.inimage.patch_tree, and not
# `kiln.` by name: inimage imports no kiln), by its shipped name in the image build, where
# the applier imports this as kiln_patchtree with kiln_patchformat.py next to it
# (kiln.domain.images.engine_image).
if TYPE_CHECKING or __package__:
    from . import patch_format  # noqa: TID252  (see above)
else:  # next to it whatever sys.path holds (python -I or PYTHONSAFEPATH leave this folder out)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import kiln_patchformat as patch_format


# -- the tree being patched ---------------------------------------------------------------
class Tree:
    """A root directory plus in-memory changes; `commit()` is the only thing that writes."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.changes: dict[str, bytes | None] = {}  # rel path -> new bytes, or None = deleted

    def read(self, rel: str) -> bytes | None:
        """A file's bytes with the pending changes applied; None when it does not exist."""
        if rel in self.changes:
            return self.changes[rel]
        path = self.root / rel
        return path.read_bytes() if path.is_file() else None

    def fork(self) -> Tree:
        """A copy whose changes do not reach this tree (for what-if probes)."""
        other = Tree(self.root)
        other.changes = dict(self.changes)
        return other

    def pristine(self, rel: str) -> bytes | None:
        """A file's bytes on disk, without the pending changes; None when it does not exist."""
        path = self.root / rel
        return path.read_bytes() if path.is_file() else None

    def write(self, rel: str, data: bytes | None) -> None:
        """Record a file's new bytes (None: deleted), to be written on commit."""
        self.changes[rel] = data

    def commit(self) -> None:
        """Stage every file next to its target first, then rename them all: a failure
        while staging (disk full) leaves the installed engine untouched."""
        staged: list[tuple[Path, Path | None]] = []
        try:
            for rel, data in sorted(self.changes.items()):
                dest = self.root / rel
                if data is None:
                    staged.append((dest, None))
                    continue
                dest.parent.mkdir(parents=True, exist_ok=True)
                fd, staging = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.kiln-")
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                mode = dest.stat().st_mode & 0o7777 if dest.exists() else 0o644
                os.chmod(staging, mode)
                staged.append((dest, Path(staging)))
        except BaseException:
            for _, tmp in staged:
                if tmp is not None:
                    tmp.unlink(missing_ok=True)
            raise
        for dest, tmp in staged:
            if tmp is None:
                dest.unlink(missing_ok=True)
            else:
                os.replace(tmp, dest)
        self.changes.clear()


# -- applying ----------------------------------------------------------------------------
@dataclass
class _HunkResult:
    number: int  # 1-based, as in GNU patch's messages
    hunk: patch_format.Hunk
    offset: int | None  # None: failed; 0: at the stated line; else lines off


@dataclass
class _FileResult:
    target: str
    hunks: list[_HunkResult]
    problem: str | None = None  # file-level: missing target, already exists

    @property
    def ok(self) -> bool:
        return self.problem is None and all(h.offset is not None for h in self.hunks)


@dataclass
class PatchResult:
    """How a patch applied: each file's hunks, their offsets and failures."""

    patch: patch_format.Patch
    files: list[_FileResult]
    reverse: bool = False

    @property
    def ok(self) -> bool:
        """Whether every file of the patch applied."""
        return all(f.ok for f in self.files)

    @property
    def offsets(self) -> list[tuple[str, int, int]]:
        """Each hunk that applied at an offset: its file, number and offset."""
        return [(f.target, h.number, h.offset) for f in self.files for h in f.hunks if h.offset]

    @property
    def failed_hunks(self) -> list[tuple[str, _HunkResult]]:
        """Each hunk that did not apply, with its file."""
        return [(f.target, h) for f in self.files for h in f.hunks if h.offset is None]

    def failure_lines(self) -> list[str]:
        """What failed, one line per file problem or failed hunk."""
        out = []
        for f in self.files:
            if f.problem:
                out.append(f"{self.patch.display}: {f.target}: {f.problem}")
                continue
            for h in f.hunks:
                if h.offset is None:
                    out.append(
                        f"{self.patch.display}: {f.target}: hunk #{h.number} {h.hunk.range_text()} "
                        f'(first context line: "{h.hunk.first_context()}") does not apply'
                    )
        return out


def _candidates(guess: int, lo: int, hi: int) -> Iterator[int]:
    """Positions outward from `guess` within [lo, hi], forward first (GNU patch order)."""
    if lo <= guess <= hi:
        yield guess
    for d in range(1, max(hi - guess, guess - lo) + 1):
        if lo <= guess + d <= hi:
            yield guess + d
        if lo <= guess - d <= hi:
            yield guess - d


def locate_hunk(lines: list[bytes], hunk: patch_format.Hunk, guess: int, lo: int) -> int | None:
    """Index where `hunk`'s old lines match exactly, searching outward from `guess` but
    never before `lo` (the end of the previous hunk)."""
    old = hunk.old_lines
    hi = len(lines) - len(old)
    if hi < lo:
        return None
    lead, trail = hunk.context_counts()
    spots: Iterable[int]
    if lead < trail:  # less context before than after: it can only sit at the start of the file
        spots = [0] if lo == 0 else []
    elif trail < lead:  # ... and the mirror case: only at the end of the file
        spots = [hi]
    else:
        spots = _candidates(min(max(guess, lo), hi), lo, hi)
    n = len(old)
    for pos in spots:
        if lines[pos : pos + n] == old:
            return pos
    return None


def stated_index(hunk: patch_format.Hunk) -> int:
    """The 0-based line index the hunk's header places it at (for a pure insertion, the line it goes before)."""
    # For a pure insertion (-a,0) GNU diff names the line *after which* it inserts.
    return hunk.old_start - 1 if hunk.old_len else hunk.old_start


def _apply_file(
    content: bytes | None, fd: patch_format.FileDiff, partial: bool = False
) -> tuple[_FileResult, bytes | None]:
    """Apply one file's hunks to `content` (None: the file does not exist). With
    `partial`, hunks that apply are applied even if others fail (`quilt push -f`)."""
    if fd.creates and content is not None:
        return _FileResult(fd.target, [], "already exists, but the patch creates it"), content
    if not fd.creates and content is None:
        return _FileResult(fd.target, [], "no such file"), None
    lines = patch_format.split_lines(content or b"")
    results: list[_HunkResult] = []
    placed: list[tuple[int, patch_format.Hunk]] = []
    lo, carried = 0, 0
    for number, hunk in enumerate(fd.hunks, 1):
        stated = stated_index(hunk)
        pos = locate_hunk(lines, hunk, stated + carried, lo)
        if pos is None:
            results.append(_HunkResult(number, hunk, None))
            continue
        carried = pos - stated
        results.append(_HunkResult(number, hunk, carried))
        placed.append((pos, hunk))
        lo = pos + len(hunk.old_lines)
    result = _FileResult(fd.target, results)
    if fd.deletes and result.ok and (lines[lo:] or placed[0][0] != 0):
        # Deleting needs the whole file to match, not just a prefix of it.
        results[-1].offset = None
    if fd.deletes:
        return result, (None if result.ok else content)
    if not result.ok and not partial:
        return result, content
    out: list[bytes] = []
    cursor = 0
    for pos, hunk in placed:
        out.extend(lines[cursor:pos])
        out.extend(hunk.new_lines)
        cursor = pos + len(hunk.old_lines)
    out.extend(lines[cursor:])
    return result, b"".join(out)


def apply_patch(tree: Tree, patch: patch_format.Patch, reverse: bool = False, partial: bool = False) -> PatchResult:
    """Apply one patch to the tree's in-memory state; changes land only if all hunks
    apply, unless `partial` (then whatever applies lands, like `quilt push -f`)."""
    results: list[_FileResult] = []
    pending: dict[str, bytes | None] = {}
    for fd in patch.files:
        fd = fd.reversed() if reverse else fd  # the same file diff, turned round  # noqa: PLW2901
        current = pending[fd.target] if fd.target in pending else tree.read(fd.target)
        res, new = _apply_file(current, fd, partial)
        results.append(res)
        pending[fd.target] = new
    outcome = PatchResult(patch, results, reverse)
    if outcome.ok or partial:
        for rel, data in pending.items():
            tree.write(rel, data)
    return outcome


def _compiles(data: bytes, rel: str) -> SyntaxError | None:
    with warnings.catch_warnings():  # upstream's invalid-escape warnings are not ours to print
        warnings.simplefilter("ignore")
        try:
            compile(data, rel, "exec", dont_inherit=True)
        except SyntaxError as exc:
            return exc
    return None


def compile_problems(tree: Tree, owners: dict[str, list[str]]) -> list[str]:
    """Patched .py files that no longer compile (only those whose upstream version did:
    an engine using syntax newer than this interpreter is not a patch problem)."""
    out = []
    for rel, data in sorted(tree.changes.items()):
        if data is None or not rel.endswith(".py"):
            continue
        exc = _compiles(data, rel)
        if exc is not None:
            before = tree.pristine(rel)
            if before is not None and _compiles(before, rel) is not None:
                continue
            names = ", ".join(owners.get(rel, [])) or "?"
            out.append(f"{rel}: does not compile after patching ({names}): {exc.msg} at line {exc.lineno}")
    return out


def apply_series(tree: Tree, series_list: list[patch_format.Series]) -> list[PatchResult]:
    """Apply every patch of every series in order, in memory. Keeps going after a failed
    patch so that one run reports every failing hunk; raises ApplyFailed if any failed.
    The caller commits the tree only after this returns."""
    results, failures = [], []
    owners: dict[str, list[str]] = {}
    for series in series_list:
        for patch in series.patches:
            res = apply_patch(tree, patch)
            results.append(res)
            failures.extend(res.failure_lines())
            for target in patch.targets:
                owners.setdefault(target, []).append(patch.name)
    failures.extend(compile_problems(tree, owners))
    if failures:
        raise patch_format.ApplyFailed(failures)
    return results
