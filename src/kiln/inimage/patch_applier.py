"""The in-image patch applier: apply quilt-style series (or reverse them) to an
installed engine, swap in whole-file replacements, write the manifest.

Standard library only, on purpose: the harness copies this module and its one sibling,
the parser (kiln.inimage.patch_format), and no other patch code into engine build contexts
as ``kiln_patching.py`` and ``kiln_patchformat.py``, and runs the first with the image's
python3 (``main()`` below). The host-side commands (`kiln patches ...`, in
kiln.domain.patching) apply series with the very same code, so "it applies on my machine"
and "it applies in the image" cannot disagree, while editing the host-only diff/merge
tools changes no engine image's inputs.

Semantics follow GNU patch with fuzz 0 (what quilt uses by default):

* paths are stripped of one component (-p1) and resolved against the root (site-packages);
* every context and removed line must match exactly; a hunk that is not at its stated
  line is searched for outward from it (forward first), after the previous hunk, and the
  offset is carried to the next hunk; a hunk with less leading than trailing context is
  anchored to the start of the file (and the reverse to the end), as GNU patch does;
* nothing is written unless every hunk of every patch applies (all-or-nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

# One import per place this runs: relative on the host (kiln.inimage.patch_applier, and
# not `kiln.` by name: inimage imports no kiln), by its shipped name in the image build,
# where this runs as a script with kiln_patchformat.py next to it (kiln.domain.images.definitions).
if TYPE_CHECKING or __package__:
    from . import patch_format  # noqa: TID252  (see above)
else:  # next to it whatever sys.path holds (python -I or PYTHONSAFEPATH leave this folder out)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import kiln_patchformat as patch_format

# The applier's last stderr line on failure starts with this; kiln replaces it with the
# typed error's own hint.
HINT_PREFIX = "hint: "
_HINT_PATCH = "hint: reproduce without Docker: kiln patches check / kiln engine bump --to VERSION --dry-run"
_HINT_OVERLAY = "hint: reproduce without Docker: kiln patches check --recipe RECIPE"
_HINT_DRIFT = "hint: kiln override rebase RECIPE FEATURE --from OLD_VERSION merges the override onto this engine"


# -- the tree being patched ---------------------------------------------------------------
class Tree:
    """A root directory plus in-memory changes; `commit()` is the only thing that writes."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.changes: dict[str, bytes | None] = {}  # rel path -> new bytes, or None = deleted

    def read(self, rel: str) -> bytes | None:
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
        path = self.root / rel
        return path.read_bytes() if path.is_file() else None

    def write(self, rel: str, data: bytes | None) -> None:
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
    patch: patch_format.Patch
    files: list[_FileResult]
    reverse: bool = False

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.files)

    @property
    def offsets(self) -> list[tuple[str, int, int]]:
        return [(f.target, h.number, h.offset) for f in self.files for h in f.hunks if h.offset]

    @property
    def failed_hunks(self) -> list[tuple[str, _HunkResult]]:
        return [(f.target, h) for f in self.files for h in f.hunks if h.offset is None]

    def failure_lines(self) -> list[str]:
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


# -- the manifest (/opt/kiln/patches.json): what the image's engine was changed by ------
class _PatchEntry(TypedDict):
    name: str
    sha256: str
    source: str  # "series" (the engine's), or "feature:NAME" (a recipe's override)
    files: list[str]


class _ReplacementEntry(TypedDict):
    feature: str
    target: str
    sha256: str
    upstream_sha256: str


class _Manifest(TypedDict):
    patches: list[_PatchEntry]
    replacements: list[_ReplacementEntry]


# -- whole-file replacements -------------------------------------------------------------
@dataclass
class Replacement:
    feature: str
    target: str
    file: Path
    upstream_sha256: str


def apply_replacements(tree: Tree, reps: list[Replacement]) -> list[_ReplacementEntry]:
    """Swap in whole files after checking each target is the upstream file it was forked
    from; raises DriftError listing every mismatch (and nothing is written)."""
    drift: list[str] = []
    entries: list[_ReplacementEntry] = []
    for rep in reps:
        current = tree.read(rep.target)
        actual = patch_format.sha256_bytes(current) if current is not None else "(file missing)"
        if actual != rep.upstream_sha256:
            drift.append(
                f"feature {rep.feature}: {rep.target}: forked from a different upstream file "
                f"(expected sha256 {rep.upstream_sha256}, the engine has {actual})"
            )
            continue
        data = rep.file.read_bytes()
        if any(line.startswith(patch_format.CONFLICT_MARKERS) for line in patch_format.split_lines(data)):
            drift.append(f"feature {rep.feature}: {rep.file}: unresolved conflict markers from `kiln override rebase`")
            continue
        tree.write(rep.target, data)
        entries.append(
            {
                "feature": rep.feature,
                "target": rep.target,
                "sha256": patch_format.sha256_bytes(data),
                "upstream_sha256": rep.upstream_sha256,
            }
        )
    if drift:
        raise patch_format.DriftError(drift)
    return entries


# -- in-image command line -----------------------------------------------------------------
def _manifest_entries(results: list[PatchResult], sources: dict[int, str]) -> list[_PatchEntry]:
    return [
        {"name": r.patch.name, "sha256": r.patch.sha256, "source": sources[id(r.patch)], "files": r.patch.targets}
        for r in results
    ]


def _json_object(path: Path, lists: tuple[str, ...] = (), strings: tuple[str, ...] = ()) -> dict[str, Any]:
    """The JSON object in `path`, each of `lists` (when there) a list and each of `strings`
    a string: plain checks, as no pydantic runs here. PatchFormatError naming the file and
    the field, one line, when it is not."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise patch_format.PatchFormatError([f"{path}: not JSON ({exc})"]) from None
    if not isinstance(doc, dict):
        raise patch_format.PatchFormatError([f"{path}: not a JSON object"])
    for key in lists:
        if not isinstance(doc.get(key, []), list):
            raise patch_format.PatchFormatError([f"{path}: {key}: must be a list"])
    for key in strings:
        if not isinstance(doc.get(key), str):
            raise patch_format.PatchFormatError([f"{path}: {key}: must be a string"])
    return doc


def _write_manifest(
    path: Path, patches: list[_PatchEntry], replacements: list[_ReplacementEntry], append: bool
) -> None:
    doc: _Manifest = {"patches": [], "replacements": []}
    if append and path.is_file():  # the engine's own series' manifest, written at its build
        found = _json_object(path, lists=("patches", "replacements"))
        doc = {"patches": found.get("patches", []), "replacements": found.get("replacements", [])}
    doc["patches"].extend(patches)
    doc["replacements"].extend(replacements)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


def _load_overlays(overlays: Path) -> tuple[list[patch_format.Series], list[Replacement]]:
    """Every `<overlays>/<feature>/overlay.json`, in feature-name order."""
    series_list, reps = [], []
    for fdir in sorted(p for p in overlays.iterdir() if (p / "overlay.json").is_file()):
        path = fdir / "overlay.json"  # kiln.domain.patching.overlay._OverlayJson
        spec = _json_object(path, lists=("replacements",), strings=("name",))
        name, series = spec["name"], spec.get("series")
        if series is not None and not isinstance(series, str):
            raise patch_format.PatchFormatError([f"{path}: series: must be a string or null"])
        if series:
            series_list.append(patch_format.load_series(fdir / series, f"{fdir}/{series}", f"feature:{name}"))
        for i, rep in enumerate(spec.get("replacements", [])):
            if not isinstance(rep, dict) or not all(
                isinstance(rep.get(k), str) for k in ("target", "file", "upstream_sha256")
            ):
                raise patch_format.PatchFormatError(
                    [f"{path}: replacements[{i}]: must hold the strings target, file and upstream_sha256"]
                )
            reps.append(Replacement(name, rep["target"], fdir / rep["file"], rep["upstream_sha256"]))
    return series_list, reps


def _run_apply(root: Path, series_files: list[str], manifest: Path) -> None:
    series_list = [patch_format.load_series(Path(s), s) for s in series_files]
    tree = Tree(root)
    results = apply_series(tree, series_list)
    tree.commit()
    sources = {id(p): s.source for s in series_list for p in s.patches}
    _write_manifest(manifest, _manifest_entries(results, sources), [], append=False)
    for r in results:
        shifted = "".join(f" (hunk #{n} offset {off:+d})" for _, n, off in r.offsets)
        print(f"applied {r.patch.display}{shifted}")


def _run_apply_overlays(root: Path, overlays: Path, manifest: Path) -> None:
    series_list, reps = _load_overlays(overlays)
    tree = Tree(root)
    results = apply_series(tree, series_list)
    entries = apply_replacements(tree, reps)
    tree.commit()
    sources = {id(p): s.source for s in series_list for p in s.patches}
    _write_manifest(manifest, _manifest_entries(results, sources), entries, append=True)
    for r in results:
        print(f"applied {r.patch.display}")
    for e in entries:
        print(f"replaced {e['target']} (feature {e['feature']})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kiln_patching", description="apply kiln patch series to an installed engine")
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("apply", help="apply the engine's patch series")
    a.add_argument("--root", required=True, type=Path, help="site-packages holding vllm/")
    a.add_argument("--series", action="append", required=True, help="series file (repeatable, applied in order)")
    a.add_argument("--manifest", required=True, type=Path)
    o = sub.add_parser("apply-overlays", help="apply a recipe's switched-on experimental features")
    o.add_argument("--root", required=True, type=Path)
    o.add_argument("--overlays", required=True, type=Path)
    o.add_argument("--manifest-append", required=True, type=Path)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "apply":
            _run_apply(args.root, args.series, args.manifest)
        else:
            _run_apply_overlays(args.root, args.overlays, args.manifest_append)
    except patch_format.PatchError as exc:
        for line in exc.lines:
            print(line, file=sys.stderr)
        hint = (
            _HINT_DRIFT
            if isinstance(exc, patch_format.DriftError)
            else _HINT_OVERLAY
            if args.cmd == "apply-overlays"
            else _HINT_PATCH
        )
        print(hint, file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
