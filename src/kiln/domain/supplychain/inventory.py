"""What `kiln.inimage.sbom_reader` reports from inside an image (its JSON, read back by
`kiln.domain.supplychain.sbom._read_inventory`): the shape the SBOM writers rely on.

Keys the reader always writes are required; the reader's older or partial outputs (and
tests' hand-made inventories) may leave the rest out, so the writers read those with
`.get`."""

from __future__ import annotations

from typing import TypedDict


class DebianPackage(TypedDict, total=False):
    """One package of dpkg's database that is on disk."""

    name: str
    version: str
    architecture: str
    source: str
    source_version: str
    state: str
    maintainer: str
    homepage: str
    summary: str
    installed_size_kib: str
    database: str


class PythonDistribution(TypedDict, total=False):
    """One `.dist-info` / `.egg-info` of an environment directory."""

    name: str
    version: str
    summary: str
    license_expression: str
    license: str
    classifiers: list[str]
    home_page: str
    project_urls: list[str]
    author: str
    installer: str
    direct_url: object  # direct_url.json as found (PEP 610), or None
    owns_files: bool | None  # None when the distribution has no RECORD
    location: str
    metadata_dir: str


class _ManifestPatch(TypedDict, total=False):
    """A patch of kiln's patch series as /opt/kiln/patches.json records it."""

    name: str
    sha256: str
    source: str
    files: list[str]


class ManifestReplacement(TypedDict, total=False):
    """A whole-file override as /opt/kiln/patches.json records it."""

    feature: str
    target: str
    sha256: str
    upstream_sha256: str


class PatchManifest(TypedDict, total=False):
    """/opt/kiln/patches.json: what kiln changed in the engine at image build."""

    patches: list[_ManifestPatch]
    replacements: list[ManifestReplacement]


class ModelFile(TypedDict):
    """A regular file under a model root, with its sha256."""

    path: str
    root: str
    size: int
    sha256: str


class Inventory(TypedDict, total=False):
    """Everything the reader found in the image."""

    os_release: dict[str, str]
    debian_packages: list[DebianPackage]
    site_dirs: list[str]
    python_distributions: list[PythonDistribution]
    patch_manifest: PatchManifest | None
    model_roots: list[str]
    model_files: list[ModelFile]
    python: str
