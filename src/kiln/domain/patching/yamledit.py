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
    """Set one scalar at `path` (keys and list indices), keeping its quoting style."""
    def change(doc: CommentedMap) -> None:
        node: Any  # ruamel's round-trip nodes: maps, sequences, scalars
        node = doc
        for key in path[:-1]:
            node = node[key]
        old = node[path[-1]]
        # a quoted "13.0" stays quoted: same scalar class, new text
        node[path[-1]] = type(old)(value) if isinstance(old, str) and type(old) is not str else value

    return edit_yaml(file, change)
