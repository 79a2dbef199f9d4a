"""YAML loading that remembers where every value came from.

Recipe errors must name ``file:line: field.path``; PyYAML's constructed objects forget
their lines, so we build plain Python values from the node tree ourselves and keep a
map from field path (a tuple of keys/indices) to line number. Duplicate keys are an
error (PyYAML silently keeps the last one, which hides typos in long recipes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


@dataclass
class SourcedYaml:
    path: Path
    data: Any
    lines: dict[tuple, int] = field(default_factory=dict)

    def line_of(self, loc: tuple) -> int:
        """Line of the deepest known prefix of ``loc`` (1-based)."""
        for cut in range(len(loc), -1, -1):
            line = self.lines.get(tuple(loc[:cut]))
            if line is not None:
                return line
        return 1


class YamlProblem(Exception):
    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line = line
        self.message = message


def _scalar(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
    return loader.construct_object(node, deep=True)


def _build(loader: yaml.SafeLoader, node: yaml.Node, loc: tuple, lines: dict) -> Any:
    lines[loc] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise YamlProblem(key_node.start_mark.line + 1, "YAML merge keys (<<) are not supported")
            key = _scalar(loader, key_node)
            if key in out:
                raise YamlProblem(
                    key_node.start_mark.line + 1,
                    f"duplicate key {key!r} (first at line {lines[(*loc, key)]})",
                )
            lines[(*loc, key)] = key_node.start_mark.line + 1
            out[key] = _build(loader, value_node, (*loc, key), lines)
            # keep the key's line (more useful than the value's for nested blocks)
            lines[(*loc, key)] = key_node.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_build(loader, item, (*loc, i), lines) for i, item in enumerate(node.value)]
    return _scalar(loader, node)


def load_yaml(path: Path, text: str | None = None) -> SourcedYaml:
    """Parse ``path`` into plain values plus a field-path -> line map."""
    if text is None:
        text = path.read_text(encoding="utf-8")
    loader = yaml.SafeLoader(text)
    try:
        try:
            root = loader.get_single_node()
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = mark.line + 1 if mark else 1
            raise YamlProblem(line, f"invalid YAML: {exc.problem or exc}") from None
        except yaml.YAMLError as exc:
            raise YamlProblem(1, f"invalid YAML: {exc}") from None
        lines: dict[tuple, int] = {}
        data = None if root is None else _build(loader, root, (), lines)
        return SourcedYaml(path=path, data=data, lines=lines)
    finally:
        loader.dispose()
