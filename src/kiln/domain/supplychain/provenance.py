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
from typing import TypedDict

from kiln.basics.errors import KilnError
from kiln.domain.images.definitions import RecipeImage
from kiln.domain.images.image_naming import LABEL_NS
from kiln.domain.locks import engine_lock
from kiln.domain.recipes.recipe import LoadedRecipe
from kiln.domain.signing.cosign import InTotoStatement, StatementSubject
from kiln.domain.supplychain.image_subject import kiln_version, subject_of
from kiln.domain.supplychain.resolved_dependencies import _repo_path, _ResourceDescriptor, resolved_dependencies
from kiln.infra import records
from kiln.infra.docker import DockerDaemon, Image

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
_BUILD_TYPE = "urn:kiln:buildtype:image:v1"  # docs/supply-chain.md, "The build type"
_DEFAULT_BUILDER_ID = "urn:kiln:builder:local"  # KILN_BUILDER_ID names a CI builder instead
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")


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

    deps = resolved_dependencies(recipe_image, engine.base_image, docker, lock, platform, source, revision)

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


__all__ = ["PREDICATE_TYPE", "STATEMENT_TYPE", "build_provenance", "input_digest_from"]
