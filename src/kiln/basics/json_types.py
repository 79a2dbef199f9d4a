"""The field types of the `--json` documents that say more than their Python type: a
sha256 digest's spelling, a count or a duration that is never negative, a list that is
never empty.

To mypy each is its plain type; pydantic reads the rest when it writes the
documents' JSON Schemas (src/kiln/schemas/, by `kiln.commands.json_schemas`).

The documents are `typing_extensions.TypedDict`s, not `typing.TypedDict`s: pydantic reads
only those on Python 3.11. A document whose fields carry docstrings (bare strings after a
field: the field's description in its schema) is decorated with `with_config(DESCRIBED)`,
one that allows no other keys with `with_config(CLOSED)` (`additionalProperties: false`).
pydantic reads the docstrings of a class's own fields only: a field a subclass inherits
is described by `Annotated[T, Field(description=...)]` instead.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field, StringConstraints

_SHA256 = r"^sha256:[0-9a-f]{64}$"

# "sha256:" and 64 lower-case hex digits: an image id, an input or manifest digest, a key fingerprint
Sha256 = Annotated[str, StringConstraints(pattern=_SHA256)]
# a number of things (bytes, build steps, patches)
Count = Annotated[int, Field(ge=0)]
# a duration in seconds
Seconds = Annotated[float, Field(ge=0)]
# a list of strings with one at least
Strings1 = Annotated[list[str], Field(min_length=1)]

DESCRIBED = ConfigDict(use_attribute_docstrings=True)
CLOSED = ConfigDict(use_attribute_docstrings=True, extra="forbid")
