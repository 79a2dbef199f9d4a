"""kiln.basics.documents' Shape itself: strict types, only the named keys kept, hostile keys
that cannot split the line, field paths, one adapter per type."""

from __future__ import annotations

from typing import NotRequired, TypedDict

import pytest

from kiln.basics import documents
from kiln.basics.documents import Shape, _field_path, read_document
from kiln.basics.errors import (
    KilnError,
    RecordInvalid,
)
from kiln.domain.locks import engine_lock as L


# -- the helper itself ---------------------------------------------------------------------------
class _Inner(TypedDict):
    n: int
    note: NotRequired[str]


class _Outer(TypedDict, total=False):
    inner: _Inner
    flags: dict[str, bool]


OUTER = Shape(_Outer)


def _problem(data: str | bytes) -> str:
    with pytest.raises(KilnError) as err:
        OUTER.parse(data, source="x.json", error=KilnError)
    return err.value.message


def test_types_are_strict_and_only_the_named_keys_are_kept():
    assert OUTER.parse('{"inner": {"n": 1, "extra": 2}, "other": 3}', source="x", error=KilnError) == {
        "inner": {"n": 1}
    }
    assert _problem('{"inner": {"n": "1"}}') == "x.json: inner.n: Input should be a valid integer"
    assert _problem('{"flags": {"a": 1}}') == "x.json: flags.a: Input should be a valid boolean"
    assert _problem('{"inner": {"note": "x"}}') == "x.json: inner: missing field 'n'"  # NotRequired kept its meaning
    assert _problem("[]") == "x.json: Input should be an object"
    assert _problem(b"\xff").startswith("x.json: not JSON (")


def test_a_hostile_key_cannot_split_the_line_and_no_value_is_quoted():
    message = _problem('{"flags": {"a\\nkiln: error: forged\\u001b[31m": "s3cret-token"}}')
    assert "\n" not in message and "\x1b" not in message
    assert "s3cret" not in message  # a value may be a credential: never in the message
    assert message == "x.json: flags[a\\nkiln: error: forged\\x1b[31m]: Input should be a valid boolean"


def test_read_document_names_a_file_it_cannot_read(tmp_path):
    with pytest.raises(RecordInvalid, match=r"^.*/nowhere\.json: cannot read: No such file or directory$"):
        read_document(tmp_path / "nowhere.json", OUTER, RecordInvalid)


def test_field_paths_read_like_kilns_own():
    assert (
        _field_path(("python_packages", 0, "wheels", "linux/amd64", "sha256"))
        == "python_packages[0].wheels[linux/amd64].sha256"
    )
    assert _field_path((0, "Layers")) == "[0].Layers"
    assert _field_path(()) == ""


def test_each_adapter_is_built_once():
    # (no timing here: a loaded CI host makes any bound flaky. Measured on the ~200 kB
    # engine-cuda lock: ~8 ms a load through the adapter, ~7 ms with the hand-written reader
    # before it, ~35 ms once to build the adapter)
    shape = Shape(_Outer)
    assert shape.adapter is shape.adapter
    assert documents._pydantic_type(_Outer) is documents._pydantic_type(_Outer)
    assert L._LOCK.adapter is L._LOCK.adapter
