"""OCI manifests and image indexes as documents: the exact bytes a registry holds
under a digest, and the multi-platform index kiln writes over single-image manifests.
(`kiln.infra.registry` moves them; nothing here talks to a registry.)"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import NotRequired, TypedDict

from kiln.basics.documents import Shape
from kiln.basics.errors import ManifestMismatch

MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
_INDEX_TYPES = MANIFEST_TYPES[2:]


class _Platform(TypedDict):
    architecture: str
    os: str


class _IndexEntry(TypedDict):
    """One image manifest of an index, with the platform a pull picks it for."""

    mediaType: str
    digest: str
    size: int
    platform: _Platform


class _ImageIndex(TypedDict):
    """An OCI image index, as kiln writes one."""

    schemaVersion: int
    mediaType: str
    manifests: list[_IndexEntry]


# -- what kiln reads of a manifest or index a registry returns (its bytes are kept as they are)
class _PlatformRef(TypedDict, total=False):
    os: str
    architecture: str


class _EntryRef(TypedDict):
    digest: str
    platform: NotRequired[_PlatformRef]  # absent in some indexes (e.g. attestation manifests)


class _ConfigRef(TypedDict):
    digest: str  # the image id


class _ManifestHead(TypedDict, total=False):
    """The keys kiln reads of an image manifest (`config`) or an image index (`manifests`),
    whoever wrote it; ImageIndex is the one kiln writes."""

    mediaType: str
    config: _ConfigRef
    manifests: list[_EntryRef]


_MANIFEST_HEAD = Shape(_ManifestHead)


def manifest_head(body: bytes, source: str) -> _ManifestHead:
    """`body` checked as a manifest or index; ManifestMismatch (naming `source` and the
    field) when the registry's bytes are not one."""
    return _MANIFEST_HEAD.parse(body, source=source, error=ManifestMismatch)


@dataclass(frozen=True)
class Manifest:
    """A registry manifest or index: its digest, media type and exact bytes."""

    digest: str
    media_type: str
    body: bytes  # the exact bytes: re-PUT them and the digest stays the same

    @property
    def is_index(self) -> bool:
        """Whether this is an index (a manifest list) rather than one image's manifest."""
        return self.media_type in _INDEX_TYPES

    @property
    def config_digest(self) -> str | None:
        """For a single-image manifest, the image id docker shows for it."""
        if self.is_index:
            return None
        config = manifest_head(self.body, f"manifest {self.digest}").get("config")
        return config["digest"] if config is not None else None


def sha256_digest(data: bytes) -> str:
    """The `sha256:<hex>` digest of some bytes."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


_OCI_INDEX = "application/vnd.oci.image.index.v1+json"


def image_index(children: list[tuple[str, Manifest]]) -> Manifest:
    """An OCI image index (one tag for several architectures) of single-image manifests
    already in the repository, each with its platform (`linux/arm64`): a pull resolves
    it to the manifest of the puller's platform. Deterministic bytes: the same children
    give the same digest, so a rerun finds the index already there."""
    manifests: list[_IndexEntry] = []
    for plat, child in children:
        if child.is_index:
            raise ValueError(f"{child.digest} is itself an index; an index holds image manifests")
        os_name, _, arch = plat.partition("/")
        manifests.append(
            {
                "mediaType": child.media_type,
                "digest": child.digest,
                "size": len(child.body),
                "platform": {"architecture": arch, "os": os_name},
            }
        )
    index: _ImageIndex = {"schemaVersion": 2, "mediaType": _OCI_INDEX, "manifests": manifests}
    body = json.dumps(index, separators=(",", ":"), sort_keys=True).encode()
    return Manifest(sha256_digest(body), _OCI_INDEX, body)


def index_children(index: Manifest) -> list[tuple[str, str]]:
    """(platform, manifest digest) of each entry of an index, in its order."""
    out = []
    for entry in manifest_head(index.body, f"image index {index.digest}").get("manifests", []):
        plat = entry.get("platform", {})
        out.append((f"{plat.get('os', '?')}/{plat.get('architecture', '?')}", entry["digest"]))
    return out
