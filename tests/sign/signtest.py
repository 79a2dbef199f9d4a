"""What the signing tests share: the real-cosign fixtures (tests/fixtures/cosign, see its
README for every source) and a small in-memory stand-in for one repository of a registry
(unit tests only; the registry tests use Debian's docker-registry)."""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from kilntest import FIXTURES

COSIGN = FIXTURES / "cosign"
PASSWORD = b"hello"  # sigstore/cosign pkg/cosign/keys_test.go TestReadingPrivatePemTypes: LoadPrivateKey(..., "hello")


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class ContainersImageSignature:
    r"""containers/image keeps a cosign signature as `\0sigstore-json\n` + JSON
    {mimeType, payload (base64 of the exact layer blob), annotations (the layer's)}."""

    media_type: str
    payload: bytes
    annotations: dict[str, str]


def containers_image_signature(name: str) -> ContainersImageSignature:
    raw = (COSIGN / "containers-image" / name).read_bytes()
    doc = json.loads(raw[raw.index(b"{") :])
    return ContainersImageSignature(doc["mimeType"], base64.b64decode(doc["payload"]), doc["annotations"])


def fixture(*parts: str) -> Path:
    return COSIGN.joinpath(*parts)


class FakeRepository:
    """Manifests by tag and digest and blobs by digest, with RegistryClient's method names;
    for unit tests of the signing logic only."""

    def __init__(self, host: str = "registry.example.com", path: str = "kiln/demo"):
        from kiln.infra.registry import Target

        self.target = Target(host, path)
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[str, tuple[str, bytes]] = {}  # reference -> (media type, body)

    def add_blob(self, data: bytes) -> str:
        self.blobs[sha256(data)] = data
        return sha256(data)

    def put(self, tag: str, body: bytes, media_type: str = "application/vnd.oci.image.manifest.v1+json") -> str:
        self.manifests[tag] = self.manifests[sha256(body)] = (media_type, body)
        return sha256(body)

    # -- the RegistryClient surface signing.py uses --
    def manifest(self, reference: str):
        from kiln.infra.manifests import Manifest

        if reference not in self.manifests:
            return None
        media_type, body = self.manifests[reference]
        return Manifest(sha256(body), media_type, body)

    def blob(self, digest: str, max_bytes: int) -> bytes | None:
        from kiln.infra.registry import BlobTooLarge

        data = self.blobs.get(digest)
        if data is not None and len(data) > max_bytes:
            raise BlobTooLarge(digest, max_bytes)
        return data

    def has_blob(self, digest: str) -> bool:
        return digest in self.blobs

    def upload_blob(self, data: bytes) -> str:
        return self.add_blob(data)

    def put_raw_manifest(self, tag: str, body: bytes, media_type: str):
        self.put(tag, body, media_type)
        return self.manifest(tag)
