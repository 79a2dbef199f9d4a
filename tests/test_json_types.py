"""Each command's `--json` document type agrees with its schema in src/kiln/schemas/: the
same property names, and the TypedDict's required keys are the schema's `required`, so
the types, the schemas and docs/cli-json.md cannot drift apart."""

from __future__ import annotations

import json
from typing import Any, NotRequired, Required, get_origin, get_type_hints

import pytest
from clijson import SCHEMAS

from kiln.commands.doctor import DoctorDocument
from kiln.commands.images.build import BuildDocument
from kiln.commands.recipes.check import CheckDocument, RecipeCheck
from kiln.commands.serving.smoke import SmokeDocument, SmokeSkipped
from kiln.domain.patching.outdated import EnginePin, OutdatedDocument, OutdatedRow
from kiln.domain.publishing import (
    PlatformEntry,
    PromoteDocument,
    PublishDocument,
    SignatureEvidence,
)
from kiln.domain.signing.signverify import AttestationCheckJson, VerificationJson
from kiln.domain.views.catalogue import EngineNames, ImageEntry, RecipeRow, ShowDocument
from kiln.domain.views.catalogue import PlatformEntry as ShowPlatform
from kiln.infra.records import CheckEntry, Timings

# (TypedDict, schema file, path to its object in the schema)
DOCUMENTS: list[tuple[Any, str, tuple[str | int, ...]]] = [
    (BuildDocument, "build", ()),
    (CheckDocument, "check", ()),
    (RecipeCheck, "check", ("properties", "recipes", "items")),
    (DoctorDocument, "doctor", ()),
    (SmokeDocument, "smoke", ("oneOf", 0)),
    (CheckEntry, "smoke", ("oneOf", 0, "properties", "checks", "items")),
    (Timings, "smoke", ("oneOf", 0, "properties", "timings")),
    (SmokeSkipped, "smoke", ("oneOf", 1)),
    (PublishDocument, "publish", ()),
    (PlatformEntry, "publish", ("properties", "platforms", "additionalProperties")),
    (SignatureEvidence, "publish", ("properties", "signature")),
    (PromoteDocument, "promote", ()),
    (SignatureEvidence, "promote", ("properties", "signature")),
    (RecipeRow, "list", ("properties", "recipes", "items")),
    (EngineNames, "list", ("properties", "recipes", "items", "properties", "engine")),
    (ShowDocument, "show", ()),
    (ImageEntry, "show", ("properties", "engine_image")),
    (ShowPlatform, "show", ("properties", "platforms", "additionalProperties")),
    (OutdatedDocument, "outdated", ()),
    (OutdatedRow, "outdated", ("properties", "recipes", "items")),
    (EnginePin, "outdated", ("properties", "recipes", "items", "properties", "engine")),
    (VerificationJson, "verify", ()),
    (AttestationCheckJson, "verify", ("properties", "attestations", "items")),
]


def _required(doc_type: Any) -> set[str]:
    """The keys not marked NotRequired (read from the hints: with postponed annotations the
    runtime's __required_keys__ cannot see NotRequired)."""
    hints = get_type_hints(doc_type, include_extras=True)
    total = doc_type.__total__  # total=False: only keys marked Required are required
    return {key for key, hint in hints.items()
            if get_origin(hint) is Required or (total and get_origin(hint) is not NotRequired)}


def _schema_object(kind: str, path: tuple[str | int, ...]) -> dict[str, Any]:
    node: Any = json.loads((SCHEMAS / f"{kind}.json").read_text())
    for step in path:
        node = node[step]
    return node


@pytest.mark.parametrize(("doc_type", "kind", "path"), DOCUMENTS,
                         ids=[f"{t.__name__}-{k}" for t, k, _ in DOCUMENTS])
def test_document_type_and_schema_agree(doc_type: Any, kind: str, path: tuple[str | int, ...]) -> None:
    schema = _schema_object(kind, path)
    where = f"src/kiln/schemas/{kind}.json {'/'.join(map(str, path)) or '(top)'}"
    assert set(doc_type.__annotations__) == set(schema["properties"]), (
        f"{doc_type.__name__} and {where} name different properties: "
        f"only the type {sorted(set(doc_type.__annotations__) - set(schema['properties']))}, "
        f"only the schema {sorted(set(schema['properties']) - set(doc_type.__annotations__))}")
    assert _required(doc_type) == set(schema.get("required", ())), (
        f"{doc_type.__name__}'s required keys are not {where}'s `required`")


def test_every_schema_has_a_document_type() -> None:
    """A new schema gets its TypedDict here (error.json is cli.py's one-line error document)."""
    typed = {kind for _, kind, _ in DOCUMENTS} | {"error"}
    assert {p.stem for p in SCHEMAS.glob("*.json")} <= typed
