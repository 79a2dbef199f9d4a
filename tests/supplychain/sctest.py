"""Validators the supply-chain tests share: each document checked by its own project's
tooling (CycloneDX's JSON schema through cyclonedx-python-lib, SPDX's spdx-tools, in-toto's
in-toto-attestation models). Importable as `sctest` (pytest puts this folder on sys.path)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import google.protobuf.json_format as pb_json
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.statement import Statement


@functools.cache
def _validator() -> JsonStrictValidator:
    return JsonStrictValidator(SchemaVersion.V1_6)


def validate_cyclonedx(doc: dict) -> list[str]:
    errors = _validator().validate_str(json.dumps(doc), all_errors=True)
    return [] if errors is None else [str(e).splitlines()[0] for e in errors]


def validate_spdx(doc: dict, tmp_path: Path) -> list[str]:
    from spdx_tools.spdx.parser.parse_anything import parse_file  # late: slow to import, dev-only
    from spdx_tools.spdx.validation.document_validator import (
        validate_full_spdx_document,  # late: same
    )

    path = tmp_path / "doc.spdx.json"
    path.write_text(json.dumps(doc))
    return [m.validation_message for m in validate_full_spdx_document(parse_file(str(path)))]


def validate_statement(statement: dict) -> None:
    """Raises unless `statement` parses as in-toto's Statement and SLSA's Provenance
    messages (unknown fields, wrong types and bad timestamps all raise)."""
    pb = statement_pb2.Statement()
    pb_json.ParseDict(statement, pb)
    Statement.copy_from_pb(pb).validate()
    pb_json.ParseDict(statement["predicate"], provenance_pb2.Provenance())
