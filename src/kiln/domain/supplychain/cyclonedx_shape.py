"""The shape of the CycloneDX 1.6 document kiln writes (the parts of the specification it
fills), as TypedDicts: read by the SPDX conversion and `kiln sbom` as well."""

from __future__ import annotations

from typing import TypedDict


class _Property(TypedDict):
    name: str
    value: str


class _Hash(TypedDict):
    alg: str
    content: str


class _ExternalReferenceBase(TypedDict):
    type: str
    url: str


class _ExternalReference(_ExternalReferenceBase, total=False):
    hashes: list[_Hash]


class _LicenceText(TypedDict):
    contentType: str
    content: str


class _Licence(TypedDict, total=False):
    """An SPDX id or a free-text name, with the licence's text when the metadata gave it."""

    id: str
    name: str
    acknowledgement: str
    text: _LicenceText


class _LicenceChoice(TypedDict, total=False):
    """Either one SPDX expression or one licence."""

    expression: str
    acknowledgement: str
    license: _Licence


class _PedigreeAncestor(TypedDict):
    type: str
    name: str
    version: str
    purl: str


class _PedigreeDiff(TypedDict):
    url: str


class _PedigreePatch(TypedDict, total=False):
    type: str
    diff: _PedigreeDiff


class _Pedigree(TypedDict):
    ancestors: list[_PedigreeAncestor]
    patches: list[_PedigreePatch]
    notes: str


# `bom-ref` is no identifier, hence the functional form; everything but the type, ref and
# name is there only when the image says it.
Component = TypedDict(
    "Component",
    {
        "type": str,
        "bom-ref": str,
        "name": str,
        "version": str,
        "purl": str,
        "publisher": str,
        "author": str,
        "description": str,
        "licenses": list[_LicenceChoice],
        "hashes": list[_Hash],
        "externalReferences": list[_ExternalReference],
        "properties": list[_Property],
        "components": list["Component"],
        "pedigree": _Pedigree,
    },
    total=False,
)


class _ToolComponent(TypedDict):
    type: str
    name: str
    version: str


class _Tools(TypedDict):
    components: list[_ToolComponent]


class _Metadata(TypedDict):
    timestamp: str
    tools: _Tools
    component: Component
    properties: list[_Property]


class _DependencyBase(TypedDict):
    ref: str


class _Dependency(_DependencyBase, total=False):
    dependsOn: list[str]


CycloneDxDocument = TypedDict(
    "CycloneDxDocument",
    {
        "$schema": str,
        "bomFormat": str,
        "specVersion": str,
        "serialNumber": str,
        "version": int,
        "metadata": _Metadata,
        "components": list[Component],
        "dependencies": list[_Dependency],
    },
)
