"""Host-only diff and merge: unified diffs for refresh / to-patch, and the 3-way merge of
`kiln override rebase` through `git merge-file --diff3`. Never copied into an image."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass

from kiln.basics.errors import UsageError
from kiln.infra import git
from kiln.inimage.patch_format import emit_line, split_lines


def _range(start: int, length: int) -> str:
    # GNU diff: a one-line range has no count; an empty one names the line before it.
    if length == 1:
        return str(start + 1)
    return f"{start if length == 0 else start + 1},{length}"


def _diff_hunks(old: list[bytes], new: list[bytes], context: int = 3) -> bytes:
    """Unified-diff hunks (no file header) turning `old` into `new`."""
    out = []
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for group in matcher.get_grouped_opcodes(context):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        out.append(f"@@ -{_range(i1, i2 - i1)} +{_range(j1, j2 - j1)} @@\n".encode())
        for op, a1, a2, b1, b2 in group:
            if op == "equal":
                out.extend(emit_line(b" ", t) for t in old[a1:a2])
                continue
            out.extend(emit_line(b"-", t) for t in old[a1:a2])
            out.extend(emit_line(b"+", t) for t in new[b1:b2])
    return b"".join(out)


def file_diff(target: str, old: bytes | None, new: bytes | None, preamble: Sequence[bytes] = ()) -> bytes:
    """One file's section: `--- a/T` / `+++ b/T` (or /dev/null) plus hunks; b"" if equal."""
    if old == new:
        return b""
    body = _diff_hunks(split_lines(old or b""), split_lines(new or b""))
    a = b"/dev/null" if old is None else b"a/" + target.encode()
    b = b"/dev/null" if new is None else b"b/" + target.encode()
    # git's `index <blob>..<blob>` line would be stale after an edit; keep the rest.
    keep = b"".join(line for line in preamble if not line.startswith(b"index "))
    return keep + b"--- " + a + b"\n+++ " + b + b"\n" + body


@dataclass
class _MergeResult:
    data: bytes
    conflicts: list[tuple[int, int]]  # (first, last) 1-based lines of each conflict block


def merge3(base: bytes, ours: bytes, theirs: bytes, labels: tuple[str, str, str]) -> _MergeResult:
    """`git merge-file --diff3`: one-sided changes are taken, changes on both sides become
    conflict blocks that show the base. labels = (ours, base, theirs)."""
    status, merged, stderr = git.merge_file(ours, base, theirs, labels)
    # exit status: the number of conflicts (capped at 127), negative on error
    if status < 0 or status > 127:
        raise UsageError(f"git merge-file failed: {stderr}")
    return _MergeResult(merged, _conflict_blocks(merged, labels))


def _conflict_blocks(data: bytes, labels: tuple[str, str, str]) -> list[tuple[int, int]]:
    start_marker, end_marker = f"<<<<<<< {labels[0]}\n".encode(), f">>>>>>> {labels[2]}\n".encode()
    blocks, start = [], None
    for number, line in enumerate(split_lines(data), 1):
        if line == start_marker:
            start = number
        elif line == end_marker and start is not None:
            blocks.append((start, number))
            start = None
    return blocks
