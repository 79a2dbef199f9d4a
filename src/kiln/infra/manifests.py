"""OCI manifests and image indexes as documents: the exact bytes a registry holds
under a digest, and the multi-platform index kiln writes over single-image manifests.
(`kiln.infra.registry` moves them; nothing here talks to a registry.)"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TypedDict

MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
INDEX_TYPES = MANIFEST_TYPES[2:]


class Platform(TypedDict):
    architecture: str
    os: str


class IndexEntry(TypedDict):
    """One image manifest of an index, with the platform a pull picks it for."""

    mediaType: str
    digest: str
    size: int
    platform: Platform


class ImageIndex(TypedDict):
    """An OCI image index, as kiln writes one."""

    schemaVersion: int
    mediaType: str
    manifests: list[IndexEntry]


@dataclass(frozen=True)
class Manifest:
    digest: str
    media_type: str
    body: bytes  # the exact bytes: re-PUT them and the digest stays the same

    @property
    def is_index(self) -> bool:
        return self.media_type in INDEX_TYPES

    @property
    def config_digest(self) -> str | None:
        """For a single-image manifest, the image id docker shows for it."""
        if self.is_index:
            return None
        digest = (json.loads(self.body).get("config") or {}).get("digest")
        return str(digest) if digest is not None else None


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


OCI_INDEX = "application/vnd.oci.image.index.v1+json"


def image_index(children: list[tuple[str, Manifest]]) -> Manifest:
    """An OCI image index (one tag for several architectures) of single-image manifests
    already in the repository, each with its platform (`linux/arm64`): a pull resolves
    it to the manifest of the puller's platform. Deterministic bytes: the same children
    give the same digest, so a rerun finds the index already there."""
    manifests: list[IndexEntry] = []
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
    index: ImageIndex = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests}
    body = json.dumps(index, separators=(",", ":"), sort_keys=True).encode()
    return Manifest(sha256_digest(body), OCI_INDEX, body)


def index_children(index: Manifest) -> list[tuple[str, str]]:
    """(platform, manifest digest) of each entry of an index, in its order."""
    doc = json.loads(index.body)
    out = []
    for entry in doc.get("manifests") or []:
        plat = entry.get("platform") or {}
        out.append(
            (f"{plat.get('os', '?')}/{plat.get('architecture', '?')}", str(entry.get("digest")))
        )
    return out
