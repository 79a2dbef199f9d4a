"""The patch format of the in-image applier: quilt-style patches and series files,
parsed into hunks, plus the errors (with their exit statuses) every patch tool raises.

Standard library only: engine build contexts carry this module next to the applier
(``kiln_patchformat.py`` beside ``kiln_patching.py``, see kiln.inimage.patch_applier),
and the host-side commands (`kiln patches ...`) parse series with the very same code.

Everything is bytes: files are never decoded, so CRLF, odd encodings and a missing final
newline survive a round trip exactly.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

# The in-image applier's exit statuses. Mirrors (this file must stay stdlib-only, so it
# cannot import kiln.basics.errors) of PatchFailed, OverrideDrift and PatchInvalid's exit codes:
# `kiln build` maps the status of the failed RUN step to those errors, and a test keeps
# the two in step.
_EXIT_PATCH_FAILED = 6
_EXIT_DRIFT = 7
_EXIT_INVALID = 30

_NO_NEWLINE = b"\\ No newline at end of file"
CONFLICT_MARKERS = (b"<<<<<<< ", b"||||||| ", b">>>>>>> ")


# -- errors ------------------------------------------------------------------------------
class PatchError(Exception):
    """A failure with one or more user-facing lines and an exit code."""

    exit_code = 1

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = list(lines)


class PatchFormatError(PatchError):
    """A patch or series file that cannot be parsed, or lacks its header."""

    exit_code = _EXIT_INVALID


class ApplyFailed(PatchError):
    """Hunks that do not apply; one line each."""

    exit_code = _EXIT_PATCH_FAILED


class DriftError(PatchError):
    """A whole-file replacement whose upstream file is not the one it was forked from."""

    exit_code = _EXIT_DRIFT


# -- small helpers -----------------------------------------------------------------------
def split_lines(data: bytes) -> list[bytes]:
    r"""Lines with their b'\n' kept; only b'\n' separates (bytes.splitlines would also
    split on \r, \x0b, \x0c, \x1c.. and break exact matching)."""
    if not data:
        return []
    parts = data.split(b"\n")
    out = [p + b"\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


def sha256_bytes(data: bytes) -> str:
    """The sha256 hex digest of some bytes."""
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
    """One hunk of a unified diff: its old and new ranges, heading and tagged lines."""

    old_start: int
    old_len: int
    new_start: int
    new_len: int
    heading: bytes  # text after the closing @@ (function context), kept for round trips
    lines: list[tuple[bytes, bytes]]  # (tag b" " | b"-" | b"+", line incl. its b"\n" if any)

    @property
    def old_lines(self) -> list[bytes]:
        """The hunk's lines before the change (context and removed)."""
        return [text for tag, text in self.lines if tag != b"+"]

    @property
    def new_lines(self) -> list[bytes]:
        """The hunk's lines after the change (context and added)."""
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
        """The hunk as diff text: its @@ header, heading and lines."""
        head = f"@@ -{self.old_start},{self.old_len} +{self.new_start},{self.new_len} @@".encode()
        return head + self.heading + b"\n" + b"".join(emit_line(tag, text) for tag, text in self.lines)

    def range_text(self) -> str:
        """The hunk's @@ header, for messages."""
        return f"@@ -{self.old_start},{self.old_len} +{self.new_start},{self.new_len} @@"

    def reversed(self) -> Hunk:
        """The hunk that undoes this one."""
        swap = {b"-": b"+", b"+": b"-", b" ": b" "}
        return Hunk(
            self.new_start,
            self.new_len,
            self.old_start,
            self.old_len,
            self.heading,
            [(swap[tag], text) for tag, text in self.lines],
        )


@dataclass
class FileDiff:
    """One file's section of a patch: its old and new paths, hunks and exact bytes."""

    old_path: str | None  # None: /dev/null (the patch creates the file)
    new_path: str | None  # None: /dev/null (the patch deletes the file)
    hunks: list[Hunk]
    raw: bytes  # the section exactly as written, for byte-identical refresh
    preamble: list[bytes] = field(default_factory=list)  # `diff --git`, mode lines ...

    @property
    def target(self) -> str:
        """The path the section changes: the new path, else the old one."""
        # the parser refuses /dev/null on both sides
        return self.new_path or self.old_path  # type: ignore[return-value]

    @property
    def creates(self) -> bool:
        """Whether the section creates its file."""
        return self.old_path is None

    @property
    def deletes(self) -> bool:
        """Whether the section deletes its file."""
        return self.new_path is None

    def reversed(self) -> FileDiff:
        """The section that undoes this one."""
        return FileDiff(self.new_path, self.old_path, [h.reversed() for h in self.hunks], self.raw, self.preamble)


@dataclass
class Patch:
    """One patch file of a series: its name, bytes, header and file sections."""

    display: str  # the path as given, used in every message
    name: str  # the series entry
    data: bytes
    header: bytes
    files: list[FileDiff]

    @property
    def sha256(self) -> str:
        """The sha256 of the patch file's bytes."""
        return sha256_bytes(self.data)

    @property
    def targets(self) -> list[str]:
        """The paths the patch changes."""
        return [f.target for f in self.files]

    def header_problems(self) -> list[str]:
        """Every patch says why it exists and whether it is meant for upstream."""
        text = self.header.decode("utf-8", "replace")
        problems = []
        for key, why in (
            ("Why", "say why this patch exists"),
            (
                "Upstream",
                "say whether it is meant for upstream, e.g. `Upstream: yes, <PR url>` or `Upstream: no, kiln-only`",
            ),
        ):
            if not re.search(rf"^\s*{key}:\s*\S", text, re.MULTILINE):
                problems.append(f"{self.display}: header has no `{key}:` line before the first `---` ({why})")
        return problems


@dataclass
class Series:
    """A series file and its patches, in order."""

    file: str  # display path of the series file ("" for an empty, absent series)
    patches: list[Patch]
    source: str = "series"  # manifest source: "series" or "feature:<name>"


# -- parsing -----------------------------------------------------------------------------
_HUNK_RE = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$", re.DOTALL)


def _starts_section(lines: list[bytes], index: int) -> bool:
    line = lines[index]
    if line.startswith((b"diff --git ", b"diff -")):
        return True
    return line.startswith(b"--- ") and index + 1 < len(lines) and lines[index + 1].startswith(b"+++ ")


def _parse_hunk(lines: list[bytes], index: int, display: str) -> tuple[Hunk, int]:
    m = _HUNK_RE.match(lines[index].rstrip(b"\r\n"))
    if not m:
        raise PatchFormatError([f"{display}:{index + 1}: malformed hunk header {_show(lines[index])!r}"])
    a, b, c, d, heading = m.groups()
    hunk = Hunk(int(a), 1 if b is None else int(b), int(c), 1 if d is None else int(d), heading, [])
    want_old, want_new = hunk.old_len, hunk.new_len
    index += 1
    while want_old > 0 or want_new > 0:
        if index >= len(lines):
            raise PatchFormatError([f"{display}:{index}: hunk {hunk.range_text()} ends early (file truncated?)"])
        line = lines[index]
        tag, text = line[:1], line[1:]
        if line in (b"\n", b"\r\n"):  # context blank line whose leading space an editor ate
            tag, text = b" ", line
        if tag == b"\\":
            _drop_newline(hunk, display, index)
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
            raise PatchFormatError(
                [
                    (
                        f"{display}:{index + 1}: line does not fit hunk {hunk.range_text()} "
                        f"(line counts in the @@ header are wrong?)"
                    )
                ]
            )
        index += 1
    if index < len(lines) and lines[index].startswith(b"\\"):
        _drop_newline(hunk, display, index)
        index += 1
    return hunk, index


def _drop_newline(hunk: Hunk, display: str, index: int) -> None:
    r"""`\ No newline at end of file` belongs to the line just before it."""
    if not hunk.lines or not hunk.lines[-1][1].endswith(b"\n"):
        raise PatchFormatError([f"{display}:{index + 1}: stray '\\ No newline at end of file'"])
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
            raise PatchFormatError(
                [
                    (
                        f"{display}:{start + 1}: file section without `---`/`+++` lines "
                        "(mode-only or rename diffs are not supported)"
                    )
                ]
            )
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
        files.append(FileDiff(old, new, hunks, data[offsets[start] : offsets[i]], preamble))
    # header + sections cover the file exactly: what refresh relies on for byte identity
    assert header + b"".join(f.raw for f in files) == data  # a self-check of the parser, not of input  # noqa: S101
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


# -- hunk bytes ---------------------------------------------------------------------------
def emit_line(tag: bytes, text: bytes) -> bytes:
    """One diff line; a last line without newline gets GNU diff's marker line."""
    line = tag + text
    return line if text.endswith(b"\n") else line + b"\n" + _NO_NEWLINE + b"\n"
