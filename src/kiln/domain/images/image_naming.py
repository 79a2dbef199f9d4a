"""How kiln names and labels the images it builds: a tag from the digest of the build
inputs, the platform suffix of alias tags, and the labels (OCI's, from the inputs rather
than the clock or HEAD, and kiln's own `ai.kiln.*`)."""

from __future__ import annotations

import hashlib
import tomllib
from abc import ABC, abstractmethod
from functools import cached_property
from pathlib import Path

from kiln.basics.paths import local_ref, repo_root
from kiln.domain.images.build_context import BuildContext
from kiln.domain.recipes.recipe_sections import DEFAULT_PLATFORM
from kiln.domain.reproducible import source_date as sourcedate

LABEL_NS = "ai.kiln"


def _source_url() -> str:
    """Where the source lives, as committed (pyproject.toml's [project.urls] Source), or
    empty. Not the checkout's git remote: a clone's remote is a fact about the machine (a
    local path, a mirror, a fork), and as a label it would give each clone another image id."""
    try:
        meta = tomllib.loads((repo_root() / "pyproject.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return ""
    urls = meta.get("project", {}).get("urls", {})
    return str(urls.get("Source", "")) if isinstance(urls, dict) else ""


def platform_suffix(platform: str) -> str:
    """What a platform adds to alias tags: nothing for linux/amd64 (tags as they always
    were), `-arm64` for linux/arm64."""
    return "" if platform == DEFAULT_PLATFORM else "-" + platform.split("/", 1)[1].replace("/", "-")


def _platform_labels(platform: str) -> dict[str, str]:
    """The labels naming what an image runs on (also in the image config: Architecture)."""
    _os_name, arch = platform.split("/", 1)
    return {f"{LABEL_NS}.platform": platform, f"{LABEL_NS}.architecture": arch}


class _NamedByInputs(ABC):
    """An image tagged by the digest of its build inputs: `<repository>:<12 hex>`."""

    @property
    @abstractmethod
    def repository(self) -> str: ...

    @property
    @abstractmethod
    def context(self) -> BuildContext: ...

    @cached_property
    def digest(self) -> str:
        return self.context.digest()

    @property
    def short(self) -> str:
        return self.digest.split(":")[1][:12]

    @property
    def canonical_tag(self) -> str:
        """`kiln/NAME:<digest12>`: the name labels carry, whatever the local namespace."""
        return f"{self.repository}:{self.short}"

    @property
    def tag(self) -> str:
        """The local tag (`paths.local_ref`: $KILN_IMAGE_NAMESPACE moves it)."""
        return local_ref(self.canonical_tag)

    def input_sources(self) -> dict[Path, tuple[str, ...]]:
        return self.context.sources

    @cached_property
    def source_date(self) -> sourcedate.SourceDate:
        """Committer time and commit of the newest change to this image's inputs."""
        return sourcedate.of(self.input_sources())


def series_entries(series: Path) -> list[tuple[str, str]]:
    """(patch name, sha256) in series order; missing series means no patches."""
    if not series.is_file():
        return []
    out = []
    for raw in series.read_text().splitlines():
        name = raw.split("#", 1)[0].strip()
        if name:
            out.append((name, "sha256:" + hashlib.sha256((series.parent / name).read_bytes()).hexdigest()))
    return out


def _oci_labels(title: str, version: str, date: sourcedate.SourceDate) -> dict[str, str]:
    """The OCI labels: `created` and `revision` from the inputs (source_date), never the
    clock or HEAD, so that the same inputs give the same image id."""
    url = _source_url()
    return {
        "org.opencontainers.image.title": title,
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.revision": date.revision,
        "org.opencontainers.image.created": sourcedate.rfc3339(date.epoch),
        **({"org.opencontainers.image.source": url} if url else {}),
    }
