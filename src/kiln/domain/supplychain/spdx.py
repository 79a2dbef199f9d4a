"""SPDX 2.3 JSON of an image, made from its CycloneDX document (same components: packages
with purls and checksums, the image DESCRIBED, CONTAINS for what it holds, PATCH_APPLIED
for kiln's patches)."""

from __future__ import annotations

import re
from typing import TypedDict

from kiln.domain.supplychain.cyclonedx_shape import Component, CycloneDxDocument
from kiln.domain.supplychain.licences import NAME_MAX


class _Checksum(TypedDict):
    algorithm: str
    checksumValue: str


class _ExternalRef(TypedDict):
    referenceCategory: str
    referenceType: str
    referenceLocator: str


class _PackageBase(TypedDict):
    SPDXID: str
    name: str
    downloadLocation: str
    filesAnalyzed: bool
    licenseConcluded: str
    licenseDeclared: str
    copyrightText: str
    primaryPackagePurpose: str


class _Package(_PackageBase, total=False):
    versionInfo: str
    summary: str
    supplier: str
    checksums: list[_Checksum]
    externalRefs: list[_ExternalRef]


class _Relationship(TypedDict):
    spdxElementId: str
    relationshipType: str
    relatedSpdxElement: str


class _ExtractedLicence(TypedDict):
    licenseId: str
    name: str
    extractedText: str


class _CreationInfo(TypedDict):
    created: str
    creators: list[str]


class _SpdxDocumentBase(TypedDict):
    spdxVersion: str
    dataLicense: str
    SPDXID: str
    name: str
    documentNamespace: str
    creationInfo: _CreationInfo
    documentDescribes: list[str]
    packages: list[_Package]
    relationships: list[_Relationship]


class SpdxDocument(_SpdxDocumentBase, total=False):
    """An SPDX 2.3 JSON document, its extracted licences optional."""

    hasExtractedLicensingInfos: list[_ExtractedLicence]


_SPDX_REF = re.compile(r"[^A-Za-z0-9.-]+")
_PURPOSE = {
    "container": "CONTAINER",
    "operating-system": "OPERATING-SYSTEM",
    "library": "LIBRARY",
    "file": "FILE",
    "machine-learning-model": "OTHER",
    "application": "APPLICATION",
}


def _spdx_license(comp: Component, extracted: dict[str, _ExtractedLicence]) -> str:
    """licenseDeclared: the SPDX expression, ids joined with AND, names as LicenseRef-s."""
    lic = comp.get("licenses") or []
    if not lic:
        return "NOASSERTION"
    if "expression" in lic[0]:
        return lic[0]["expression"]
    parts = []
    for entry in lic:
        item = entry["license"]
        if "id" in item:
            parts.append(item["id"])
        else:
            ref = "LicenseRef-" + _SPDX_REF.sub("-", item["name"]).strip("-")[:60]
            text = item.get("text")
            extracted.setdefault(
                ref,
                {
                    "licenseId": ref,
                    "name": item["name"][:NAME_MAX],
                    "extractedText": (text["content"] if text else "") or item["name"],
                },
            )
            parts.append(ref)
    return " AND ".join(dict.fromkeys(parts)) if len(parts) > 1 else parts[0]


def spdx_document(cdx: CycloneDxDocument) -> SpdxDocument:
    """SPDX 2.3 JSON of the same components: packages with purls and checksums, the
    image DESCRIBED, CONTAINS for what it holds, PATCH_APPLIED for kiln's patches."""
    meta = cdx["metadata"]
    image = meta["component"]
    ids: dict[str, str] = {}

    def spdx_id(ref: str) -> str:
        if ref not in ids:
            ids[ref] = f"SPDXRef-{len(ids) + 1}-" + _SPDX_REF.sub("-", ref).strip("-")[:80]
        return ids[ref]

    extracted: dict[str, _ExtractedLicence] = {}
    packages: list[_Package] = []
    relationships: list[_Relationship] = []

    def add(comp: Component, parent: str, relation: str) -> None:
        pkg: _Package = {
            "SPDXID": spdx_id(comp["bom-ref"]),
            "name": comp["name"],
            "downloadLocation": "NOASSERTION",
            "filesAnalyzed": False,
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": _spdx_license(comp, extracted),
            "copyrightText": "NOASSERTION",
            "primaryPackagePurpose": _PURPOSE.get(comp["type"], "OTHER"),
        }
        if comp.get("version"):
            pkg["versionInfo"] = comp["version"]
        if comp.get("description"):
            pkg["summary"] = comp["description"][: NAME_MAX * 4]
        if comp.get("publisher"):
            pkg["supplier"] = "Organization: " + comp["publisher"]
        hashes: list[_Checksum] = [
            {"algorithm": "SHA256", "checksumValue": h["content"]}
            for h in comp.get("hashes") or []
            if h.get("alg") == "SHA-256"
        ]
        if hashes:
            pkg["checksums"] = hashes
        dist = next((r["url"] for r in comp.get("externalReferences") or [] if r["type"] == "distribution"), None)
        if dist:
            pkg["downloadLocation"] = dist
        if comp.get("purl"):
            pkg["externalRefs"] = [
                {"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl", "referenceLocator": comp["purl"]}
            ]
        packages.append(pkg)
        if parent:
            relationships.append(
                {"spdxElementId": parent, "relationshipType": relation, "relatedSpdxElement": pkg["SPDXID"]}
                if relation != "PATCH_APPLIED"
                else {"spdxElementId": pkg["SPDXID"], "relationshipType": "PATCH_APPLIED", "relatedSpdxElement": parent}
            )
        for child in comp.get("components") or []:
            add(
                child,
                pkg["SPDXID"],
                "PATCH_APPLIED"
                if child["bom-ref"].startswith("kiln-patch:") or child["bom-ref"].startswith("kiln-override:")
                else "CONTAINS",
            )

    add(image, "", "")
    root_id = ids[image["bom-ref"]]
    for comp in cdx["components"]:
        add(comp, root_id, "CONTAINS")
    describes: _Relationship = {
        "spdxElementId": "SPDXRef-DOCUMENT",
        "relationshipType": "DESCRIBES",
        "relatedSpdxElement": root_id,
    }
    doc: SpdxDocument = {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"{image['name']} {image['bom-ref'].removeprefix('kiln-image:')}",
        "documentNamespace": f"https://spdx.org/spdxdocs/kiln/{cdx['serialNumber'].removeprefix('urn:uuid:')}",
        "creationInfo": {
            "created": meta["timestamp"],
            "creators": [f"Tool: kiln-{meta['tools']['components'][0]['version']}"],
        },
        "documentDescribes": [root_id],
        "packages": packages,
        "relationships": [describes, *relationships],
    }
    if extracted:
        doc["hasExtractedLicensingInfos"] = sorted(extracted.values(), key=lambda e: e["licenseId"])
    return doc
