"""Edits of recipe and override YAML through ruamel.yaml's round trip: values change,
comments, key order, quoting and layout stay as written."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap


def _yaml() -> YAML:
    y = YAML(typ="rt")
    y.preserve_quotes = True
    y.width = 4096  # never re-wrap a long line
    y.indent(mapping=2, sequence=4, offset=2)
    return y


def edit_yaml(file: Path, change: Callable[[CommentedMap], None]) -> bool:
    """Load `file`, let `change` edit the document in place, write it back if it
    changed; returns whether it did."""
    y = _yaml()
    text = file.read_text(encoding="utf-8")
    doc = y.load(text)
    change(doc)
    out = io.StringIO()
    y.dump(doc, out)
    new = out.getvalue()
    if new == text:
        return False
    file.write_text(new, encoding="utf-8")
    return True


def set_value(file: Path, path: tuple[str | int, ...], value: object) -> bool:
    """Set one scalar at `path` (keys and list indices), keeping its quoting style. A
    scalar on one line is replaced in the text itself, so nothing else in the file moves
    (ruamel's dump re-flows a flow sequence written over several lines onto one)."""
    text = file.read_text(encoding="utf-8")
    new = _replace_in_text(text, path, value)
    if new is not None:
        if new == text:
            return False
        file.write_text(new, encoding="utf-8")
        return True

    def change(doc: CommentedMap) -> None:
        node: Any  # ruamel's round-trip nodes: maps, sequences, scalars
        node = doc
        for key in path[:-1]:
            node = node[key]
        old = node[path[-1]]
        # a quoted "13.0" stays quoted: same scalar class, new text
        node[path[-1]] = type(old)(value) if isinstance(old, str) and type(old) is not str else value

    return edit_yaml(file, change)


def _replace_in_text(text: str, path: tuple[str | int, ...], value: object) -> str | None:
    """`text` with the scalar at `path` rewritten where it stands, or None when it is not
    a one-line scalar (the caller then edits through the round trip)."""
    doc = _yaml().load(text)
    node: Any = doc
    for key in path[:-1]:
        node = node[key]
    key = path[-1]
    row, col = node.lc.value(key) if isinstance(node, CommentedMap) else node.lc.item(key)
    lines = text.splitlines(keepends=True)
    line = lines[row]
    rest = line[col:]
    if rest[:1] in ("'", '"'):
        end = rest.find(rest[0], 1)
        if end < 0:
            return None
        written = rest[0] + str(value) + rest[0]
        span = end + 1
    else:
        # a plain scalar stands as its own text (in a flow mapping `{version: 0.32.0}` too)
        written_before = str(node[key])
        if not rest.startswith(written_before):
            return None
        written, span = str(value), len(written_before)
    lines[row] = line[:col] + written + line[col + span :]
    out = "".join(lines)
    try:
        check: Any = _yaml().load(out)
        for k in path:
            check = check[k]
    except Exception:  # ruamel's parser errors have no common base worth naming here  # noqa: BLE001
        return None
    # the text edit must mean what the round trip would have set (else: let ruamel do it)
    return out if str(check) == str(value) else None
