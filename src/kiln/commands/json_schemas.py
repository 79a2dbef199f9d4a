"""The JSON Schemas of the `--json` documents (src/kiln/schemas/<name>.json), generated
from the TypedDicts the commands emit (the use-cases' and the domain's), as `kiln schema` makes the recipe's: pydantic
writes the schema, kiln adds `$schema`, `$id` and `title`.

    python -m kiln.commands.json_schemas           rewrite the stale files (or `nox -s schemas`)
    python -m kiln.commands.json_schemas --check   exit 1 naming each stale file

What a schema says beyond the Python types (a digest's pattern, a minimum, a field's
description, no other keys) the types carry: kiln.basics.json_types says how.
tests/test_jsonschemas.py fails while a file is stale.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter
from pydantic.json_schema import GenerateJsonSchema
from pydantic_core import CoreSchema

from kiln.basics.errors import ErrorDocument
from kiln.domain.catalogue.entries import ListDocument, ShowDocument
from kiln.domain.patching.outdated import OutdatedDocument
from kiln.domain.publishing.publish_records import PromoteDocument, PublishDocument
from kiln.domain.signing.signatures import VerificationJson
from kiln.usecases.build import BuildDocument
from kiln.usecases.check import CheckDocument
from kiln.usecases.doctor import DoctorDocument
from kiln.usecases.smoke import SmokeJson

_SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"
_DRAFT = "https://json-schema.org/draft/2020-12/schema"

# file name (without .json) -> (its title, the type of the document)
DOCUMENTS: dict[str, tuple[str, Any]] = {
    "build": ("kiln build --json", BuildDocument),
    "check": ("kiln check --json", CheckDocument),
    "doctor": ("kiln doctor --json", DoctorDocument),
    "error": ("kiln --json on failure", ErrorDocument),
    "list": ("kiln list --json", ListDocument),
    "outdated": ("kiln engine outdated --json", OutdatedDocument),
    "promote": ("kiln promote --json", PromoteDocument),
    "publish": ("kiln publish --json", PublishDocument),
    "show": ("kiln show --json", ShowDocument),
    "smoke": ("kiln smoke --json", SmokeJson),
    "verify": ("kiln verify --json", VerificationJson),
}


class _Generator(GenerateJsonSchema):
    """pydantic's schema generator, less the title it gives every field ("Image Id"):
    the key says it; a document type keeps its title (the class name)."""

    def field_title_should_be_set(self, schema: CoreSchema) -> bool:  # pydantic's hook signature  # noqa: ARG002
        return False


def _one_line_descriptions(node: Any) -> Any:
    """`node` with every description on one line (a class docstring's line breaks are its layout)."""
    if isinstance(node, list):
        return [_one_line_descriptions(item) for item in node]
    if not isinstance(node, dict):
        return node
    return {
        key: " ".join(value.split())
        if key == "description" and isinstance(value, str)
        else _one_line_descriptions(value)
        for key, value in node.items()
    }


def _json_schema(name: str, doc_type: Any = None) -> dict[str, Any]:
    """The JSON Schema of one document: `doc_type`'s, else the type DOCUMENTS names."""
    title, registered = DOCUMENTS[name]
    generated = _one_line_descriptions(
        TypeAdapter(doc_type or registered).json_schema(mode="serialization", schema_generator=_Generator)
    )
    schema: dict[str, Any] = {"$schema": _DRAFT, "$id": f"https://kiln.invalid/schemas/{name}.json", "title": title}
    schema.update((key, value) for key, value in generated.items() if key != "title")
    return schema


def _rendered(name: str, doc_type: Any = None) -> str:
    """The file's text: the schema, indented, with a final newline."""
    return json.dumps(_json_schema(name, doc_type), indent=2, ensure_ascii=False) + "\n"


def _stale(folder: Path = _SCHEMAS) -> list[str]:
    """The files in `folder` that differ from what the types generate, or are missing,
    and any schema file no document generates (by file name, sorted)."""
    out = [
        f"{name}.json"
        for name in DOCUMENTS
        if not (folder / f"{name}.json").is_file() or (folder / f"{name}.json").read_text() != _rendered(name)
    ]
    out += [p.name for p in folder.glob("*.json") if p.stem not in DOCUMENTS]
    return sorted(out)


def _write(folder: Path = _SCHEMAS) -> list[str]:
    """The stale files of `folder`, each rewritten (or removed: one no document generates)."""
    changed = _stale(folder)
    for file in changed:
        if Path(file).stem in DOCUMENTS:
            (folder / file).write_text(_rendered(Path(file).stem))
        else:
            (folder / file).unlink()
    return changed


def main(argv: list[str]) -> int:
    """The command line: the stale files rewritten, or with --check only named (exit 1)."""
    if "--check" in argv:
        out = _stale()
        for file in out:
            print(f"src/kiln/schemas/{file} is stale: run `python -m kiln.commands.json_schemas`", file=sys.stderr)
        return 1 if out else 0
    for file in _write():
        done = "wrote" if Path(file).stem in DOCUMENTS else "removed"
        print(f"{done} src/kiln/schemas/{file}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
