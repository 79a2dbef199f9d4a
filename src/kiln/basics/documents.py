"""Documents kiln reads back (records, probe answers, SBOM inventories, locks, caches),
checked against the TypedDict that writes them before anything trusts them.

A `Shape` wraps one TypedDict (or any type pydantic validates) in a pydantic
`TypeAdapter`, built once, on first use; `read_document(path, shape, error)` reads a file
through it and `Shape.parse` / `Shape.check` check text or an object already parsed (YAML,
an SDK's dict). Every problem is the caller's typed error, one line naming the source
and the field (`python_packages[0].wheels[linux/amd64].sha256: Input should be a valid
string`), from pydantic's first error; never a traceback, and never the offending value
(a credential's field may hold a secret).

Validation is strict (JSON's types as the TypedDict states them: `"1"` is no int, `1` no
bool) and keeps only the keys the TypedDict names, so a reader sees exactly the type it
declares. pydantic reads `typing.TypedDict` only from Python 3.12 on; kiln runs on 3.11
and its in-image modules may import the standard library only, so a Shape rebuilds each
TypedDict, nested ones too, as a `typing_extensions.TypedDict` with the same keys, types
and required keys (`_pydantic_type`).
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Generic, Literal, NotRequired, Required, TypeVar, Union

# pydantic's own dependency (it installs with it); its TypedDict is the one pydantic reads on 3.11
import typing_extensions
from pydantic import TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from kiln.basics.errors import KilnError, one_line

_T = TypeVar("_T")
_ErrorFactory = Callable[[str], KilnError]  # the caller's typed error, from its one-line message


class Shape(Generic[_T]):
    """One document type and its TypeAdapter (built on first use, then kept)."""

    def __init__(self, tp: type[_T]) -> None:
        self.type = tp
        self._adapter: TypeAdapter[_T] | None = None

    @property
    def adapter(self) -> TypeAdapter[_T]:
        """The pydantic adapter that validates and dumps this document's type, built on first use."""
        if self._adapter is None:
            self._adapter = TypeAdapter(_pydantic_type(self.type))
        return self._adapter

    def parse(self, data: str | bytes, *, source: str, error: _ErrorFactory) -> _T:
        """`data` (JSON text) as this shape; `error("<source>: <field>: <problem>")` if it is not."""
        try:
            return self.adapter.validate_json(data, strict=True)
        except ValidationError as exc:
            raise error(f"{source}: {problem(exc, _parsed(data))}") from None

    def check(self, value: object, *, source: str, error: _ErrorFactory) -> _T:
        """`value` (already parsed: YAML, an SDK's answer) as this shape, or the error."""
        try:
            return self.adapter.validate_python(value, strict=True)
        except ValidationError as exc:
            raise error(f"{source}: {problem(exc, value)}") from None


def read_document(path: Path, shape: Shape[_T], error: _ErrorFactory, *, source: str | None = None) -> _T:
    """The JSON file at `path` as `shape`; `error` (one line naming `source`, the path
    by default, and the field) when it cannot be read or is not that shape."""
    where = source or str(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise error(f"{where}: cannot read: {exc.strerror or type(exc).__name__}") from None
    return shape.parse(data, source=where, error=error)


# -- the message -----------------------------------------------------------------------
def _field_path(loc: tuple[int | str, ...]) -> str:
    """`python_packages[0].wheels[linux/amd64].sha256`: list indexes and keys that are no
    identifier in brackets, names after dots."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.isidentifier():
            out += f".{part}" if out else part
        else:
            out += f"[{part}]"
    return out


def problem(exc: ValidationError, document: object) -> str:
    """The first of pydantic's errors about `document`, as `field: what is wrong` (one line)."""
    first: ErrorDetails = exc.errors(include_url=False, include_input=False, include_context=False)[0]
    loc, kind = tuple(first["loc"]), first["type"]
    if kind == "json_invalid":
        return one_line(f"not JSON ({first['msg'].removeprefix('Invalid JSON: ')})")
    if kind == "missing" and loc:
        parent = _field_path(_in_document(document, loc[:-1]))
        return one_line(f"{parent + ': ' if parent else ''}missing field {str(loc[-1])!r}")
    where = _field_path(_in_document(document, loc))
    return one_line(f"{where}: {first['msg']}" if where else first["msg"])


def _in_document(document: object, loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """`loc` without the steps that are no place in `document`: pydantic names the member
    of a union it tried (`yanked.bool`, `u.G.a`), which no reader would find in the file."""
    out: list[int | str] = []
    node = document
    for part in loc:
        # two branches: mypy narrows the node's type in each apart
        if isinstance(node, dict) and part in node:  # noqa: SIM114
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            continue  # a union member's name
        out.append(part)
    return tuple(out)


def _parsed(data: str | bytes) -> object:
    try:
        return json.loads(data)
    except ValueError:
        return None


# -- typing.TypedDict -> typing_extensions.TypedDict (pydantic on Python 3.11) -------------
_CONVERTED: dict[object, Any] = {}


def _pydantic_type(tp: Any) -> Any:
    """`tp` with every typing.TypedDict in it rebuilt as a typing_extensions.TypedDict."""
    if typing_extensions.is_typeddict(tp):
        found = _CONVERTED.get(tp)
        if found is None:
            found = _CONVERTED[tp] = _typeddict(tp)
        return found
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is None or origin is Literal or not args:
        return tp
    inner = tuple(_pydantic_type(a) for a in args)
    if origin is Annotated:
        return Annotated[(inner[0], *tp.__metadata__)]
    if origin in (Required, NotRequired):
        return origin[inner[0]]
    if origin is types.UnionType:
        return Union[inner]  # noqa: UP007  (X | Y cannot be built from a tuple)
    return origin[inner]


def _typeddict(td: Any) -> Any:
    """`td` as a typing_extensions.TypedDict: the same keys and value types, each key
    required or not as in `td` (its own Required/NotRequired, else its class's total=,
    which `__required_keys__` reflects while the annotations are postponed strings)."""
    hints = typing.get_type_hints(td, include_extras=True)
    fields: dict[str, Any] = {}
    for key, hint in hints.items():
        wrapper = typing.get_origin(hint)
        if wrapper in (Required, NotRequired):
            fields[key] = _pydantic_type(hint)
        else:
            marker = Required if key in td.__required_keys__ else NotRequired
            fields[key] = marker[_pydantic_type(hint)]
    # the functional form, named at run time
    rebuilt: Any = typing_extensions.TypedDict(td.__name__, fields)  # type: ignore[misc]
    rebuilt.__module__ = td.__module__
    return rebuilt
