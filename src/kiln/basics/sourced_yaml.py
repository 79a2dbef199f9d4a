"""YAML loading that remembers where every value came from.

Recipe errors must name ``file:line: field.path``; PyYAML's constructed objects forget
their lines, so we build plain Python values from the node tree ourselves and keep a
map from field path (a tuple of keys/indices) to line number. Duplicate keys are an
error (PyYAML silently keeps the last one, which hides typos in long recipes).

Recipes come from pull requests and run in CI that holds registry credentials, so the
loader also refuses what a recipe never needs and an attacker would use: aliases (a
"billion laughs" bomb expands nine aliases nine levels deep into 9^9 values), deep
nesting (the composer recurses), files over a few dozen KiB, non-UTF-8 bytes, control
characters, custom tags and keys that are not plain strings.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# The shipped recipes are 1-4 KiB and ~100 values; these limits are far above that and
# keep the pure-Python parser under ~0.5 s on the worst input that fits.
_MAX_BYTES = 64 * 1024
_MAX_DEPTH = 32
_MAX_NODES = 5000

# where a value sits in a document: the keys and list indices that lead to it
_Loc = tuple[str | int, ...]
_TAG = "tag:yaml.org,2002:"
_PLAIN_TAGS = {f"{_TAG}{t}" for t in ("str", "int", "float", "bool", "null", "timestamp")}
_COLLECTION_TAGS = {f"{_TAG}map", f"{_TAG}seq"}
# C0 controls but tab, LF, CR; DEL. PyYAML would reject most too, but without a line.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# what a double-quoted escape ("\0", "\e", "\ud800") can still put into a value: NUL
# truncates it in docker and execve, ESC drives terminals, a lone surrogate is no text
_BAD_IN_VALUE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")


@dataclass
class SourcedYaml:
    """A YAML document as loaded, with the line each key path starts on."""

    path: Path
    data: Any
    lines: dict[_Loc, int] = field(default_factory=dict)

    def line_of(self, loc: _Loc) -> int:
        """Line of the deepest known prefix of ``loc`` (1-based)."""
        for cut in range(len(loc), -1, -1):
            line = self.lines.get(tuple(loc[:cut]))
            if line is not None:
                return line
        return 1


class YamlProblem(Exception):
    """A YAML file that does not parse: the line and the parser's message."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


def _line(node_or_event: yaml.Node | yaml.Event) -> int:
    mark = node_or_event.start_mark  # set on everything the parser made from text
    return int(mark.line) + 1 if mark is not None else 1


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses aliases and bounds nesting depth and value count while
    composing, before anything is expanded."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        # (the stubs leave peek_event unannotated: typed here, at its one use)
        peek_event: Callable[[], yaml.Event] = self.peek_event
        event = peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise YamlProblem(_line(event), f"YAML alias *{event.anchor} is not supported: write the value out")
        self._nodes += 1
        if self._nodes > _MAX_NODES:
            raise YamlProblem(_line(event), f"more than {_MAX_NODES} values: too large for a recipe")
        if self._depth >= _MAX_DEPTH:
            raise YamlProblem(_line(event), f"nested more than {_MAX_DEPTH} levels deep")
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _scalar(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    if node.tag not in _PLAIN_TAGS:
        raise YamlProblem(
            _line(node), f"YAML tag {_short_tag(node.tag)} is not supported (quote the value if it is text)"
        )
    try:
        value = loader.construct_object(node, deep=True)
    except yaml.YAMLError as exc:
        raise YamlProblem(_line(node), f"invalid value: {getattr(exc, 'problem', None) or exc}") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits, a bad !!float
        reason = str(exc).split(":")[0]
        raise YamlProblem(_line(node), f"invalid {_short_tag(node.tag)} value: {reason}") from None
    bad = _BAD_IN_VALUE.search(value) if isinstance(value, str) else None
    if bad:
        kind = "lone surrogate" if "\ud800" <= bad.group() <= "\udfff" else "control character"
        raise YamlProblem(_line(node), f"{kind} U+{ord(bad.group()):04X} is not allowed")
    return value


def _short_tag(tag: str) -> str:
    return "!!" + tag.removeprefix(_TAG) if tag.startswith(_TAG) else tag


def _key(loader: yaml.SafeLoader, key_node: yaml.Node) -> str:
    if key_node.tag == f"{_TAG}merge":
        raise YamlProblem(_line(key_node), "YAML merge keys (<<) are not supported")
    if not isinstance(key_node, yaml.ScalarNode):
        raise YamlProblem(_line(key_node), "a key must be plain text, not a list or mapping")
    key = _scalar(loader, key_node)
    if not isinstance(key, str):
        raise YamlProblem(
            _line(key_node), f"key {key_node.value!r} is read as {type(key).__name__}, not text: quote it"
        )
    return key


def _build(loader: yaml.SafeLoader, node: yaml.Node, loc: _Loc, lines: dict[_Loc, int]) -> Any:
    lines[loc] = _line(node)
    if isinstance(node, yaml.ScalarNode):
        return _scalar(loader, node)
    if node.tag not in _COLLECTION_TAGS:
        raise YamlProblem(_line(node), f"YAML tag {_short_tag(node.tag)} is not supported")
    if isinstance(node, yaml.SequenceNode):
        return [_build(loader, item, (*loc, i), lines) for i, item in enumerate(node.value)]
    out: dict[str, Any] = {}
    for key_node, value_node in node.value:
        key = _key(loader, key_node)
        if key in out:
            raise YamlProblem(
                _line(key_node),
                f"duplicate key {key!r} (first at line {lines[(*loc, key)]})",
            )
        out[key] = _build(loader, value_node, (*loc, key), lines)
        # keep the key's line (more useful than the value's for nested blocks)
        lines[(*loc, key)] = _line(key_node)
    return out


def _read_limited(path: Path, limit: int = _MAX_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes. Raises FileNotFoundError
    when it is missing, YamlProblem for anything else that is wrong with it."""
    try:
        # O_NONBLOCK: opening a FIFO planted as recipe.yaml must not hang the CI job
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise YamlProblem(1, f"cannot read it: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise YamlProblem(1, "not a regular file")
        try:
            data = fh.read(limit + 1)
        except OSError as exc:
            raise YamlProblem(1, f"cannot read it: {exc.strerror}") from None
    if len(data) > limit:
        raise YamlProblem(1, f"larger than {limit // 1024} KiB: too large for a recipe")
    return data


def _decode(data: bytes) -> str:
    """UTF-8 text (a leading BOM dropped) without control characters."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise YamlProblem(line, f"not UTF-8: byte 0x{data[exc.start]:02x} cannot be decoded") from None
    text = text.removeprefix("\ufeff")  # some Windows editors write one; harmless
    bad = _CONTROL.search(text)
    if bad:
        line = text.count("\n", 0, bad.start()) + 1
        raise YamlProblem(line, f"control character U+{ord(bad.group()):04X} is not allowed")
    return text


def _syntax_problem(exc: yaml.YAMLError, text: str) -> YamlProblem:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        problem = exc.problem or str(exc)
        if "'\\t'" in problem:
            problem += " (YAML indents with spaces, not tabs)"
        return YamlProblem(line, f"invalid YAML: {problem}")
    if isinstance(exc, yaml.reader.ReaderError):
        char = exc.character if isinstance(exc.character, int) else ord(exc.character[:1] or "\0")
        line = text.count("\n", 0, exc.position) + 1
        return YamlProblem(line, f"character U+{char:04X} is not allowed")
    return YamlProblem(1, f"invalid YAML: {' '.join(str(exc).split())}")


def load_yaml(path: Path, text: str | None = None) -> SourcedYaml:
    """Parse ``path`` into plain values plus a field-path -> line map."""
    if text is None:
        text = _decode(_read_limited(path))
    elif len(text.encode("utf-8", "surrogatepass")) > _MAX_BYTES:
        raise YamlProblem(1, f"larger than {_MAX_BYTES // 1024} KiB: too large for a recipe")
    try:
        loader = _Loader(text)  # the reader already rejects unprintable characters here
    except yaml.YAMLError as exc:
        raise _syntax_problem(exc, text) from None
    try:
        try:
            root = loader.get_single_node()
        except yaml.YAMLError as exc:
            raise _syntax_problem(exc, text) from None
        lines: dict[_Loc, int] = {}
        data = None if root is None else _build(loader, root, (), lines)
        return SourcedYaml(path=path, data=data, lines=lines)
    finally:
        loader.dispose()
