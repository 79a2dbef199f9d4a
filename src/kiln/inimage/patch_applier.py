"""The in-image patch applier: parse quilt-style series, apply them (or reverse them)
to an installed engine, swap in whole-file replacements, write the manifest.

Standard library only, in one file, on purpose: the harness copies this module (and no
other patch code) into engine build contexts as ``kiln_patching.py`` and runs it with the
image's python3 (``main()`` below). The host-side commands (`kiln patches ...`, in the
other modules of this package) apply series with the very same code, so "it applies on
my machine" and "it applies in the image" cannot disagree, while editing the host-only
diff/merge tools changes no engine image's inputs.

Semantics follow GNU patch with fuzz 0 (what quilt uses by default):

* paths are stripped of one component (-p1) and resolved against the root (site-packages);
* every context and removed line must match exactly; a hunk that is not at its stated
  line is searched for outward from it (forward first), after the previous hunk, and the
  offset is carried to the next hunk; a hunk with less leading than trailing context is
  anchored to the start of the file (and the reverse to the end), as GNU patch does;
* nothing is written unless every hunk of every patch applies (all-or-nothing).

Everything is bytes: files are never decoded, so CRLF, odd encodings and a missing final
newline survive a round trip exactly.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

# The in-image applier's exit statuses. Mirrors (this file must stay stdlib-only, so it
# cannot import kiln.basics.errors) of PatchFailed, OverrideDrift and PatchInvalid's exit codes:
# `kiln build` maps the status of the failed RUN step to those errors, and a test keeps
# the two in step.
EXIT_PATCH_FAILED = 6
EXIT_DRIFT = 7
EXIT_INVALID = 30

# The applier's last stderr line on failure starts with this; kiln replaces it with the
# typed error's own hint.
HINT_PREFIX = "hint: "
HINT_PATCH = "hint: reproduce without Docker: kiln patches check / kiln engine bump --to VERSION --dry-run"
HINT_OVERLAY = "hint: reproduce without Docker: kiln patches check --recipe RECIPE"
HINT_DRIFT = "hint: kiln override rebase RECIPE FEATURE --from OLD_VERSION merges the override onto this engine"
NO_NEWLINE = b"\\ No newline at end of file"
CONFLICT_MARKERS = (b"<<<<<<< ", b"||||||| ", b">>>>>>> ")


# -- errors ------------------------------------------------------------------------------
class PatchError(Exception):
    """A failure with one or more user-facing lines and an exit code."""

    exit_code = 1

    def __init__(self, lines: list[str]):
        super().__init__("\n".join(lines))
        self.lines = list(lines)


class PatchFormatError(PatchError):
    """A patch or series file that cannot be parsed, or lacks its header."""

    exit_code = EXIT_INVALID


class ApplyFailed(PatchError):
    """Hunks that do not apply; one line each."""

    exit_code = EXIT_PATCH_FAILED


class DriftError(PatchError):
    """A whole-file replacement whose upstream file is not the one it was forked from."""

    exit_code = EXIT_DRIFT


# -- small helpers -----------------------------------------------------------------------
def split_lines(data: bytes) -> list[bytes]:
    """Lines with their b'\\n' kept; only b'\\n' separates (bytes.splitlines would also
    split on \\r, \\x0b, \\x0c, \\x1c.. and break exact matching)."""
    if not data:
        return []
    parts = data.split(b"\n")
    out = [p + b"\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _show(line: bytes) -> str:
    return line.rstrip(b"\r\n").decode("utf-8", "replace").strip()


def _strip_path(raw: bytes, where: str) -> str | None:
    """`a/vllm/x.py<TAB>date` -> `vllm/x.py` (-p1); /dev/null -> None."""
    name = raw.split(b"\t", 1)[0].rstrip(b"\r\n").rstrip()
    if name == b"/dev/null":
        return None
    text = name.decode("utf-8", "surrogateescape")
    if text.startswith('"'):
        raise PatchFormatError([f"{where}: quoted file names are not supported: {text}"])
    parts = text.split("/", 1)
    if len(parts) < 2 or not parts[1]:
        raise PatchFormatError([f"{where}: file name {text!r} has no leading directory to strip (-p1)"])
    rel = parts[1]
    if rel.startswith("/") or ".." in rel.split("/"):
        raise PatchFormatError([f"{where}: file name {text!r} escapes the root"])
    return rel


# -- model -------------------------------------------------------------------------------
@dataclass
class Hunk:
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    heading: bytes  # text after the closing @@ (function context), kept for round trips
    lines: list[tuple[bytes, bytes]]  # (tag b" " | b"-" | b"+", line incl. its b"\n" if any)

    @property
    def old_lines(self) -> list[bytes]:
        return [text for tag, text in self.lines if tag != b"+"]

    @property
    def new_lines(self) -> list[bytes]:
        return [text for tag, text in self.lines if tag != b"-"]

    def context_counts(self) -> tuple[int, int]:
        """(leading, trailing) context lines, which decide GNU patch's anchoring."""
        lead = 0
        for tag, _ in self.lines:
            if tag != b" ":
                break
            lead += 1
        trail = 0
        for tag, _ in reversed(self.lines):
            if tag != b" ":
                break
            trail += 1
        if lead == len(self.lines):  # context only: no anchoring either way
            return lead, lead
        return lead, trail

    def first_context(self) -> str:
        """The first non-blank context line (a blank one identifies nothing), else the
        first line the hunk expects to find."""
        for tag, text in self.lines:
            if tag == b" " and text.strip():
                return _show(text)
        old = [t for t in self.old_lines if t.strip()] or self.old_lines
        return _show(old[0]) if old else ""

    def to_bytes(self) -> bytes:
        head = f"@@ -{self.old_start},{self.old_len} +{self.new_start},{self.new_len} @@".encode()
        return head + self.heading + b"\n" + b"".join(emit_line(tag, text) for tag, text in self.lines)

    def range_text(self) -> str:
        return f"@@ -{self.old_start},{self.old_len} +{self.new_start},{self.new_len} @@"

    def reversed(self) -> Hunk:
        swap = {b"-": b"+", b"+": b"-", b" ": b" "}
        return Hunk(self.new_start, self.new_len, self.old_start, self.old_len, self.heading,
                    [(swap[tag], text) for tag, text in self.lines])


@dataclass
class FileDiff:
    old_path: str | None  # None: /dev/null (the patch creates the file)
    new_path: str | None  # None: /dev/null (the patch deletes the file)
    hunks: list[Hunk]
    raw: bytes  # the section exactly as written, for byte-identical refresh
    preamble: list[bytes] = field(default_factory=list)  # `diff --git`, mode lines ...

    @property
    def target(self) -> str:
        return self.new_path or self.old_path  # type: ignore[return-value]  # the parser refuses /dev/null on both sides

    @property
    def creates(self) -> bool:
        return self.old_path is None

    @property
    def deletes(self) -> bool:
        return self.new_path is None

    def reversed(self) -> FileDiff:
        return FileDiff(self.new_path, self.old_path, [h.reversed() for h in self.hunks], self.raw, self.preamble)


@dataclass
class Patch:
    display: str  # the path as given, used in every message
    name: str  # the series entry
    data: bytes
    header: bytes
    files: list[FileDiff]

    @property
    def sha256(self) -> str:
        return sha256_bytes(self.data)

    @property
    def targets(self) -> list[str]:
        return [f.target for f in self.files]

    def header_problems(self) -> list[str]:
        """Every patch says why it exists and whether it is meant for upstream."""
        text = self.header.decode("utf-8", "replace")
        problems = []
        for key, why in (("Why", "say why this patch exists"),
                         ("Upstream", "say whether it is meant for upstream, e.g. `Upstream: yes, <PR url>` or `Upstream: no, kiln-only`")):
            if not re.search(rf"^\s*{key}:\s*\S", text, re.M):
                problems.append(f"{self.display}: header has no `{key}:` line before the first `---` ({why})")
        return problems


@dataclass
class Series:
    file: str  # display path of the series file ("" for an empty, absent series)
    patches: list[Patch]
    source: str = "series"  # manifest source: "series" or "feature:<name>"


# -- parsing -----------------------------------------------------------------------------
_HUNK_RE = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$", re.S)


def _starts_section(lines: list[bytes], i: int) -> bool:
    line = lines[i]
    if line.startswith(b"diff --git ") or line.startswith(b"diff -"):
        return True
    return line.startswith(b"--- ") and i + 1 < len(lines) and lines[i + 1].startswith(b"+++ ")


def _parse_hunk(lines: list[bytes], i: int, display: str) -> tuple[Hunk, int]:
    m = _HUNK_RE.match(lines[i].rstrip(b"\r\n"))
    if not m:
        raise PatchFormatError([f"{display}:{i + 1}: malformed hunk header {_show(lines[i])!r}"])
    a, b, c, d, heading = m.groups()
    hunk = Hunk(int(a), 1 if b is None else int(b), int(c), 1 if d is None else int(d), heading, [])
    want_old, want_new = hunk.old_len, hunk.new_len
    i += 1
    while want_old > 0 or want_new > 0:
        if i >= len(lines):
            raise PatchFormatError([f"{display}:{i}: hunk {hunk.range_text()} ends early (file truncated?)"])
        line = lines[i]
        tag, text = line[:1], line[1:]
        if line in (b"\n", b"\r\n"):  # context blank line whose leading space an editor ate
            tag, text = b" ", line
        if tag == b"\\":
            _drop_newline(hunk, display, i)
        elif tag == b" " and want_old > 0 and want_new > 0:
            want_old, want_new = want_old - 1, want_new - 1
            hunk.lines.append((tag, text))
        elif tag == b"-" and want_old > 0:
            want_old -= 1
            hunk.lines.append((tag, text))
        elif tag == b"+" and want_new > 0:
            want_new -= 1
            hunk.lines.append((tag, text))
        else:
            raise PatchFormatError([f"{display}:{i + 1}: line does not fit hunk {hunk.range_text()} "
                                    f"(line counts in the @@ header are wrong?)"])
        i += 1
    if i < len(lines) and lines[i].startswith(b"\\"):
        _drop_newline(hunk, display, i)
        i += 1
    return hunk, i


def _drop_newline(hunk: Hunk, display: str, i: int) -> None:
    """`\\ No newline at end of file` belongs to the line just before it."""
    if not hunk.lines or not hunk.lines[-1][1].endswith(b"\n"):
        raise PatchFormatError([f"{display}:{i + 1}: stray '\\ No newline at end of file'"])
    tag, text = hunk.lines[-1]
    hunk.lines[-1] = (tag, text[:-1])


def parse_patch(data: bytes, display: str, name: str | None = None) -> Patch:
    """Parse a unified diff: free-text header, then one section per file."""
    lines = split_lines(data)
    i = 0
    while i < len(lines) and not _starts_section(lines, i):
        i += 1
    header = b"".join(lines[:i])
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    files: list[FileDiff] = []
    while i < len(lines):
        start = i
        preamble = []
        while i < len(lines) and not lines[i].startswith(b"--- "):
            if lines[i].startswith((b"GIT binary patch", b"Binary files ")):
                raise PatchFormatError([f"{display}:{i + 1}: binary diffs are not supported"])
            if lines[i].startswith((b"rename from", b"copy from")):
                raise PatchFormatError([f"{display}:{i + 1}: renames and copies are not supported"])
            if i > start and _starts_section(lines, i):
                break
            preamble.append(lines[i])
            i += 1
        if i >= len(lines) or not lines[i].startswith(b"--- "):
            raise PatchFormatError([f"{display}:{start + 1}: file section without `---`/`+++` lines "
                                    "(mode-only or rename diffs are not supported)"])
        if i + 1 >= len(lines) or not lines[i + 1].startswith(b"+++ "):
            raise PatchFormatError([f"{display}:{i + 2}: `---` line not followed by `+++`"])
        old = _strip_path(lines[i][4:], f"{display}:{i + 1}")
        new = _strip_path(lines[i + 1][4:], f"{display}:{i + 2}")
        if old is None and new is None:
            raise PatchFormatError([f"{display}:{i + 1}: both sides are /dev/null"])
        if old is not None and new is not None and old != new:
            raise PatchFormatError([f"{display}:{i + 1}: {old} -> {new}: renames are not supported"])
        i += 2
        hunks = []
        while i < len(lines) and lines[i].startswith(b"@@"):
            hunk, i = _parse_hunk(lines, i, display)
            hunks.append(hunk)
        # Anything up to the next section (e.g. a format-patch signature) stays in `raw`.
        while i < len(lines) and not _starts_section(lines, i):
            if lines[i].startswith(b"@@"):
                raise PatchFormatError([f"{display}:{i + 1}: hunk outside a file section"])
            i += 1
        if not hunks:
            raise PatchFormatError([f"{display}:{start + 1}: {new or old}: no hunks"])
        files.append(FileDiff(old, new, hunks, data[offsets[start]:offsets[i]], preamble))
    # header + sections cover the file exactly: what refresh relies on for byte identity
    assert header + b"".join(f.raw for f in files) == data
    return Patch(display, name or os.path.basename(display), data, header, files)


def read_series_names(series_file: Path, display: str | None = None) -> list[str]:
    """quilt's series format: one patch per line, `#` comments, optional `-p1`."""
    shown = display or str(series_file)
    names: list[str] = []
    for lineno, raw in enumerate(series_file.read_text(encoding="utf-8").splitlines(), 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        name, opts = words[0], words[1:]
        if any(opt != "-p1" for opt in opts):
            raise PatchFormatError([f"{shown}:{lineno}: {name}: only -p1 is supported (got {' '.join(opts)})"])
        if name.startswith("/") or ".." in name.split("/"):
            raise PatchFormatError([f"{shown}:{lineno}: {name}: must stay inside the series folder"])
        if name in names:
            raise PatchFormatError([f"{shown}:{lineno}: {name}: listed twice"])
        names.append(name)
    return names


def load_series(series_file: Path, display: str | None = None, source: str = "series") -> Series:
    """Parse every patch a series file lists; a missing series file is an empty series."""
    shown = display or str(series_file)
    if not series_file.is_file():
        return Series("", [], source)
    base = os.path.dirname(shown)
    patches, problems = [], []
    for name in read_series_names(series_file, shown):
        pdisplay = f"{base}/{name}" if base else name
        path = series_file.parent / name
        if not path.is_file():
            problems.append(f"{pdisplay}: listed in {shown} but no such file")
            continue
        try:
            patches.append(parse_patch(path.read_bytes(), pdisplay, name))
        except PatchFormatError as exc:
            problems.extend(exc.lines)
    if problems:
        raise PatchFormatError(problems)
    return Series(shown, patches, source)


# -- the tree being patched ---------------------------------------------------------------
class Tree:
    """A root directory plus in-memory changes; `commit()` is the only thing that writes."""

    def __init__(self, root: Path):
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
class HunkResult:
    number: int  # 1-based, as in GNU patch's messages
    hunk: Hunk
    offset: int | None  # None: failed; 0: at the stated line; else lines off


@dataclass
class FileResult:
    target: str
    hunks: list[HunkResult]
    problem: str | None = None  # file-level: missing target, already exists

    @property
    def ok(self) -> bool:
        return self.problem is None and all(h.offset is not None for h in self.hunks)


@dataclass
class PatchResult:
    patch: Patch
    files: list[FileResult]
    reverse: bool = False

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.files)

    @property
    def offsets(self) -> list[tuple[str, int, int]]:
        return [(f.target, h.number, h.offset) for f in self.files for h in f.hunks if h.offset]

    @property
    def failed_hunks(self) -> list[tuple[str, HunkResult]]:
        return [(f.target, h) for f in self.files for h in f.hunks if h.offset is None]

    def failure_lines(self) -> list[str]:
        out = []
        for f in self.files:
            if f.problem:
                out.append(f"{self.patch.display}: {f.target}: {f.problem}")
                continue
            for h in f.hunks:
                if h.offset is None:
                    out.append(f'{self.patch.display}: {f.target}: hunk #{h.number} {h.hunk.range_text()} '
                               f'(first context line: "{h.hunk.first_context()}") does not apply')
        return out


def _candidates(guess: int, lo: int, hi: int):
    """Positions outward from `guess` within [lo, hi], forward first (GNU patch order)."""
    if lo <= guess <= hi:
        yield guess
    for d in range(1, max(hi - guess, guess - lo) + 1):
        if lo <= guess + d <= hi:
            yield guess + d
        if lo <= guess - d <= hi:
            yield guess - d


def locate_hunk(lines: list[bytes], hunk: Hunk, guess: int, lo: int) -> int | None:
    """Index where `hunk`'s old lines match exactly, searching outward from `guess` but
    never before `lo` (the end of the previous hunk)."""
    old = hunk.old_lines
    hi = len(lines) - len(old)
    if hi < lo:
        return None
    lead, trail = hunk.context_counts()
    if lead < trail:  # less context before than after: it can only sit at the start of the file
        spots = [0] if lo == 0 else []
    elif trail < lead:  # ... and the mirror case: only at the end of the file
        spots = [hi]
    else:
        spots = _candidates(min(max(guess, lo), hi), lo, hi)
    n = len(old)
    for pos in spots:
        if lines[pos:pos + n] == old:
            return pos
    return None


def stated_index(hunk: Hunk) -> int:
    # For a pure insertion (-a,0) GNU diff names the line *after which* it inserts.
    return hunk.old_start - 1 if hunk.old_len else hunk.old_start


def apply_file(content: bytes | None, fd: FileDiff, partial: bool = False) -> tuple[FileResult, bytes | None]:
    """Apply one file's hunks to `content` (None: the file does not exist). With
    `partial`, hunks that apply are applied even if others fail (`quilt push -f`)."""
    if fd.creates and content is not None:
        return FileResult(fd.target, [], "already exists, but the patch creates it"), content
    if not fd.creates and content is None:
        return FileResult(fd.target, [], "no such file"), None
    lines = split_lines(content or b"")
    results: list[HunkResult] = []
    placed: list[tuple[int, Hunk]] = []
    lo, carried = 0, 0
    for number, hunk in enumerate(fd.hunks, 1):
        stated = stated_index(hunk)
        pos = locate_hunk(lines, hunk, stated + carried, lo)
        if pos is None:
            results.append(HunkResult(number, hunk, None))
            continue
        carried = pos - stated
        results.append(HunkResult(number, hunk, carried))
        placed.append((pos, hunk))
        lo = pos + len(hunk.old_lines)
    result = FileResult(fd.target, results)
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


def apply_patch(tree: Tree, patch: Patch, reverse: bool = False, partial: bool = False) -> PatchResult:
    """Apply one patch to the tree's in-memory state; changes land only if all hunks
    apply, unless `partial` (then whatever applies lands, like `quilt push -f`)."""
    results: list[FileResult] = []
    pending: dict[str, bytes | None] = {}
    for fd in patch.files:
        fd = fd.reversed() if reverse else fd
        current = pending[fd.target] if fd.target in pending else tree.read(fd.target)
        res, new = apply_file(current, fd, partial)
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


def apply_series(tree: Tree, series_list: list[Series]) -> list[PatchResult]:
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
        raise ApplyFailed(failures)
    return results


# -- whole-file replacements -------------------------------------------------------------
@dataclass
class Replacement:
    feature: str
    target: str
    file: Path
    upstream_sha256: str


def apply_replacements(tree: Tree, reps: list[Replacement]) -> list[dict]:
    """Swap in whole files after checking each target is the upstream file it was forked
    from; raises DriftError listing every mismatch (and nothing is written)."""
    drift, entries = [], []
    for rep in reps:
        current = tree.read(rep.target)
        actual = sha256_bytes(current) if current is not None else "(file missing)"
        if actual != rep.upstream_sha256:
            drift.append(f"feature {rep.feature}: {rep.target}: forked from a different upstream file "
                         f"(expected sha256 {rep.upstream_sha256}, the engine has {actual})")
            continue
        data = rep.file.read_bytes()
        if any(line.startswith(CONFLICT_MARKERS) for line in split_lines(data)):
            drift.append(f"feature {rep.feature}: {rep.file}: unresolved conflict markers from `kiln override rebase`")
            continue
        tree.write(rep.target, data)
        entries.append({"feature": rep.feature, "target": rep.target, "sha256": sha256_bytes(data),
                        "upstream_sha256": rep.upstream_sha256})
    if drift:
        raise DriftError(drift)
    return entries


# -- hunk bytes ---------------------------------------------------------------------------
def emit_line(tag: bytes, text: bytes) -> bytes:
    """One diff line; a last line without newline gets GNU diff's marker line."""
    line = tag + text
    return line if text.endswith(b"\n") else line + b"\n" + NO_NEWLINE + b"\n"


# -- in-image command line -----------------------------------------------------------------
def _manifest_entries(results: list[PatchResult], sources: dict[int, str]) -> list[dict]:
    return [{"name": r.patch.name, "sha256": r.patch.sha256, "source": sources[id(r.patch)],
             "files": r.patch.targets} for r in results]


def _write_manifest(path: Path, patches: list[dict], replacements: list[dict], append: bool) -> None:
    doc: dict[str, list[dict]] = {"patches": [], "replacements": []}
    if append and path.is_file():
        doc = json.loads(path.read_text(encoding="utf-8"))
        doc.setdefault("patches", [])
        doc.setdefault("replacements", [])
    doc["patches"].extend(patches)
    doc["replacements"].extend(replacements)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


def load_overlays(overlays: Path) -> tuple[list[Series], list[Replacement]]:
    """Every `<overlays>/<feature>/overlay.json`, in feature-name order."""
    series_list, reps = [], []
    for fdir in sorted(p for p in overlays.iterdir() if (p / "overlay.json").is_file()):
        spec = json.loads((fdir / "overlay.json").read_text(encoding="utf-8"))
        name = spec["name"]
        if spec.get("series"):
            series_list.append(load_series(fdir / spec["series"], f"{fdir}/{spec['series']}", f"feature:{name}"))
        for rep in spec.get("replacements") or []:
            reps.append(Replacement(name, rep["target"], fdir / rep["file"], rep["upstream_sha256"]))
    return series_list, reps


def run_apply(root: Path, series_files: list[str], manifest: Path) -> None:
    series_list = [load_series(Path(s), s) for s in series_files]
    tree = Tree(root)
    results = apply_series(tree, series_list)
    tree.commit()
    sources = {id(p): s.source for s in series_list for p in s.patches}
    _write_manifest(manifest, _manifest_entries(results, sources), [], append=False)
    for r in results:
        shifted = "".join(f" (hunk #{n} offset {off:+d})" for _, n, off in r.offsets)
        print(f"applied {r.patch.display}{shifted}")


def run_apply_overlays(root: Path, overlays: Path, manifest: Path) -> None:
    series_list, reps = load_overlays(overlays)
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
            run_apply(args.root, args.series, args.manifest)
        else:
            run_apply_overlays(args.root, args.overlays, args.manifest_append)
    except PatchError as exc:
        for line in exc.lines:
            print(line, file=sys.stderr)
        hint = HINT_DRIFT if isinstance(exc, DriftError) else HINT_OVERLAY if args.cmd == "apply-overlays" else HINT_PATCH
        print(hint, file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
