"""What tests read back of a provenance statement kiln made."""

from __future__ import annotations

from typing import Any

from kiln.domain.signing.cosign import InTotoStatement


def resolved_by_role(statement: InTotoStatement, role: str) -> list[Any]:
    """The statement's resolved dependencies annotated with `kiln_role` == role."""
    predicate: Any = statement["predicate"]  # build_provenance's own statement
    return [
        d
        for d in predicate["buildDefinition"]["resolvedDependencies"]
        if (d.get("annotations") or {}).get("kiln_role") == role
    ]
