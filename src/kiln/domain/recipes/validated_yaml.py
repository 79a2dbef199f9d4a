"""YAML files validated against a strict pydantic model: `recipe.yaml`, `override.yaml`.

One loader for both: read with line numbers (kiln.basics.sourced_yaml), refuse what is not a
mapping, validate, and turn every problem into a `file:line: field.path: message` line
(RecipeInvalid, all problems at once). Strict on purpose: unknown keys are rejected (a
typo would otherwise be ignored and the image built wrong) and values are not coerced
(`port: "8000"` is an error, not a string that happens to work)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import ErrorDetails

from kiln.basics.errors import RecipeInvalid
from kiln.basics.sourced_yaml import SourcedYaml, YamlProblem, load_yaml


class Strict(BaseModel):
    """Base of every model read from a file: no unknown keys, no coercion, immutable."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


_ModelT = TypeVar("_ModelT", bound=BaseModel)


@dataclass(frozen=True)
class _Validated(Generic[_ModelT]):
    """A validated document and where each of its fields sits in the file."""

    value: _ModelT
    source: SourcedYaml


def load_validated(file: Path, model: type[_ModelT], *, missing_hint: str | None = None) -> _Validated[_ModelT]:
    """`file` read and validated as `model`; RecipeInvalid with one line per problem
    (a missing file says so, with `missing_hint` when given)."""
    shown = display_path(file)
    missing = RecipeInvalid([f"{shown}:1: (file): not found"], hint=missing_hint)
    if not file.is_file():  # a folder of that name too: the file is not there
        raise missing
    try:
        src = load_yaml(file)
    except FileNotFoundError:  # removed since the look
        raise missing from None
    except YamlProblem as exc:
        raise RecipeInvalid([f"{shown}:{exc.line}: (yaml): {exc.message}"]) from None
    if not isinstance(src.data, dict):
        raise RecipeInvalid([f"{shown}:1: (top level): must be a mapping of fields"])
    try:
        value = model.model_validate(src.data)
    except ValidationError as exc:
        raise RecipeInvalid(_problems_from_validation(src, exc)) from None
    return _Validated(value, src)


def display_path(path: Path) -> str:
    """A path as messages show it: relative to the working directory when under it, else as given."""
    # lexical first: a symlink must be shown as itself, not as what it points to
    try:
        return str(path.absolute().relative_to(Path.cwd()))
    except ValueError:
        pass
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError, RuntimeError):
        return str(path)


_SHOULD = re.compile(r"^Input should be ")


def _message(err: ErrorDetails) -> str:
    kind = err["type"]
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        return "unknown key"
    msg = err["msg"]
    msg = msg.removeprefix("Value error, ")
    msg = _SHOULD.sub("must be ", msg)
    if kind == "string_pattern_mismatch":
        msg = f"must match {err['ctx']['pattern']}"
    return msg


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _field_path(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            # pydantic puts union member / validator names into loc; they are not fields
            if any(ch in item for ch in "[](),") or item.startswith("function-"):
                continue
            if _PLAIN_KEY.fullmatch(item):
                parts.append(("." if parts else "") + item)
            else:  # repr: a key holding ": ", newlines or escapes must not break the line
                parts.append(f"[{item!r}]")
    return "".join(parts) or "(top level)"


def _clean_loc(loc: tuple[int | str, ...], data: Any) -> tuple[int | str, ...]:
    """Keep only loc entries that index into the YAML data (drops union branch tags)."""
    out: list[int | str] = []
    node = data
    for item in loc:
        # two branches: mypy narrows the node's type in each apart
        if isinstance(node, dict) and item in node:  # noqa: SIM114
            out.append(item)
            node = node[item]
        elif isinstance(node, list) and isinstance(item, int) and 0 <= item < len(node):
            out.append(item)
            node = node[item]
        elif isinstance(node, dict) and isinstance(item, str) and not any(c in item for c in "[](),"):
            out.append(item)  # a missing key: report it under its parent's line
            node = None
    return tuple(out)


def _problems_from_validation(src: SourcedYaml, exc: ValidationError) -> list[str]:
    """One `file:line: field.path: message` line per problem pydantic found, each once."""
    where = display_path(src.path)
    seen: set[str] = set()
    lines: list[str] = []
    for err in exc.errors():
        loc = _clean_loc(err["loc"], src.data)
        line = src.line_of(loc)
        text = f"{where}:{line}: {_field_path(loc)}: {_message(err)}"
        if text not in seen:
            seen.add(text)
            lines.append(text)
    return lines
