"""What a supply-chain document is about and who made it: the image (`ImageSubject`, read
from the daemon's record of it) and kiln's own version, named in every document's tools."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version

import kiln
from kiln.basics import image_ref
from kiln.infra.docker import Image, id_of


def kiln_version() -> str:
    """kiln's own version: the installed distribution's, else the source tree's."""
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
        """The architecture part of the platform: `amd64` of `linux/amd64`."""
        return self.platform.split("/", 1)[-1]


def subject_of(image: Image, *, manifest_digest: str | None = None, repository: str | None = None) -> ImageSubject:
    """The subject for a local image: its name, id, platform, labels and tags, and the pushed manifest digest when
    known."""
    attrs = image.attrs or {}
    labels = dict(image.labels or {})
    if manifest_digest is not None and not re.fullmatch(r"sha256:[0-9a-f]{64}", manifest_digest):
        raise ValueError(f"manifest digest {manifest_digest!r} is not sha256:<64 hex>")
    image_id = id_of(image)
    name = labels.get("org.opencontainers.image.title") or (
        image_ref.parse(image.tags[0]).name if image.tags else image_id
    )
    return ImageSubject(
        name=name,
        image_id=image_id,
        platform=f"{attrs.get('Os', 'linux')}/{attrs.get('Architecture', 'amd64')}",
        labels=labels,
        created=str(attrs.get("Created") or ""),
        tags=tuple(sorted(image.tags or ())),
        manifest_digest=manifest_digest,
        repository=repository,
    )
