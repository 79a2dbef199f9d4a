"""Validate `--json` output against the schemas shipped in src/kiln/schemas/."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

SCHEMAS = Path(__file__).resolve().parents[1] / "src" / "kiln" / "schemas"


def validated(kind: str, stdout: str) -> dict:
    """stdout parsed as exactly one JSON document, valid against schemas/<kind>.json."""
    doc = json.loads(stdout)
    schema = json.loads((SCHEMAS / f"{kind}.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)
    return doc
