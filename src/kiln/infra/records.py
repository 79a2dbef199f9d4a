"""Smoke and build records: what `kiln smoke` proved about one image id, and what
the build that made it did (its wall-clock times).

`kiln publish` refuses images without a passing record, so records are keyed by the
image id (content digest of the image config), not by tag: retagging or rebuilding to
a different image never inherits a pass. Each record is read back through the TypedDict
that writes it (kiln.basics.documents): a damaged or edited one is RecordInvalid, one
line naming the file and the field, never half-trusted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal, NotRequired

from pydantic import Field, with_config
from typing_extensions import TypedDict

from kiln.basics import log
from kiln.basics.documents import Shape, read_document
from kiln.basics.errors import RecordInvalid
from kiln.basics.files import write_atomic
from kiln.basics.json_types import DESCRIBED, Seconds, Sha256
from kiln.basics.paths import results_dir, shown_home

# served: the image served the recipe's checks; in-image: proved inside the image without serving
SmokeLevel = Literal["served", "in-image"]


class CheckEntry(TypedDict):
    """One smoke check and its verdict."""

    name: str
    ok: bool
    detail: str
    seconds: Seconds


@with_config(DESCRIBED)
class Timings(TypedDict):
    """How long the smoke test took."""

    startup_s: float | None
    """Seconds until the server answered /health; null when it never did, or was not served (in-image)."""
    total_s: Seconds


class SmokeRecord(TypedDict):
    """What `kiln smoke` proved about one image id (src/kiln/schemas/smoke.json, less
    its `record` key: the file is written before its own path is known). Its fields are
    described with Field(description=...), not docstrings: `kiln smoke --json`'s
    SmokeDocument inherits them, and pydantic reads a class's own docstrings only."""

    recipe: str
    image_id: Sha256
    tag: str
    input_digest: Sha256
    platform: Annotated[str, Field(description="The platform of the image smoke-tested (os/arch).")]
    emulation_factor: Annotated[
        int | None,
        Field(
            description=(
                "Another architecture under qemu: every time limit was this many times the recipe's; null when native."
            )
        ),
    ]
    level: NotRequired[
        Annotated[
            SmokeLevel,
            Field(
                description=(
                    "served: the image served the recipe's checks; in-image: a GPU recipe on a host without a GPU, "
                    "proved "
                    "inside the image without serving (kiln smoke --in-image); "
                    "absent in records older than the field: served."
                )
            ),
        ]
    ]
    passed: bool
    started_at: str
    checks: list[CheckEntry]
    timings: Timings


class BuildRecord(TypedDict):
    """One build of an image: its wall-clock times (never in the image itself) and the
    inputs that made it."""

    image_id: str
    built_id: str  # before normalisation
    tags: list[str]
    input_digest: str
    source_date: int
    revision: str  # the commit, "<commit>-dirty" or "unknown" (source_date.SourceDate)
    layers: list[str]
    started: str
    finished: str
    build_seconds: float
    normalise_seconds: float


_SMOKE_RECORD = Shape(SmokeRecord)
_BUILD_RECORD = Shape(BuildRecord)


def _dir() -> Path:
    d = results_dir() / "smoke"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _key(image_id: str) -> str:
    return image_id.split(":", 1)[-1]


def record_path(image_id: str) -> Path:
    """The path of an image's smoke record in kiln's results folder."""
    return _dir() / f"{_key(image_id)}.json"


def write_smoke_record(record: SmokeRecord) -> Path:
    """Write a smoke record atomically; its path."""
    path = record_path(record["image_id"])
    write_atomic(path, json.dumps(record, indent=2, sort_keys=True) + "\n")
    return path


def _smoke_record(image_id: str) -> SmokeRecord | None:
    """The smoke record of `image_id`, None when there is none; RecordInvalid when there
    is one that is not a SmokeRecord (a publish must not go on past it)."""
    path = record_path(image_id)
    if not path.is_file():
        return None
    return read_document(path, _SMOKE_RECORD, RecordInvalid, source=shown_home(path))


def passing_smoke_record(image_id: str) -> SmokeRecord | None:
    """The image's smoke record when it passed for exactly this image id; None otherwise."""
    rec = _smoke_record(image_id)
    if rec and rec.get("passed") is True and rec.get("image_id") == image_id:
        return rec
    return None


def _build_record_path(image_id: str) -> Path:
    d = results_dir() / "builds"
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{_key(image_id)}.jsonl"


def write_build_record(record: BuildRecord) -> Path:
    """What one build did, one JSON line per build, in a file per (normalised) image id:
    the wall-clock start and end live here, never in the image, whose dates are the
    inputs' source date (so every rebuild of the same inputs adds a line to one file)."""
    path = _build_record_path(record["image_id"])
    with path.open("a") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
    return path


def build_records(image_id: str) -> list[BuildRecord]:
    """Every build that made `image_id`, oldest first. A line that is not JSON was cut
    short by a crash (appends are not atomic): skipped with a warning, the others still
    count; a JSON line that is not a BuildRecord is RecordInvalid."""
    path = _build_record_path(image_id)
    if not path.is_file():
        return []
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise RecordInvalid(f"{shown_home(path)}: cannot read: {exc.strerror}") from None
    out: list[BuildRecord] = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{shown_home(path)}: line {n}"
        try:
            doc = json.loads(line)
        except ValueError:
            log.warn(f"{where}: not JSON (a build record cut short by a crash?): skipped")
            continue
        out.append(_BUILD_RECORD.check(doc, source=where, error=RecordInvalid))
    return out
