"""The images kiln builds for a recipe, defined by their inputs: RecipeImage (one per
recipe, FROM its engine image: kiln.domain.images.engine_image) and the recipe's Dockerfile
with the kiln tail; `resolve` makes both images from a recipe name, `local_image_for` finds the
image the current inputs already built and `require_built` insists on it. `build.py`
builds them. How images are named and labelled: kiln.domain.images.image_naming."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from kiln.basics.errors import ImageNotBuilt
from kiln.basics.files import sha256_file
from kiln.basics.paths import local_ref
from kiln.domain.images import wheelhouse
from kiln.domain.images.build_context import BuildContext
from kiln.domain.images.engine_image import PATCHER_ARC, EngineImage, engine_modules, for_engine
from kiln.domain.images.image_naming import (
    LABEL_NS,
    _NamedByInputs,
    _oci_labels,
    _platform_labels,
    platform_suffix,
    series_entries,
)
from kiln.domain.locks import engine_lock, lock_records, recipe_lock
from kiln.domain.patching.overlay import excluded_paths, overlay_json
from kiln.domain.recipes.recipe import DOCKERFILE, LoadedRecipe, Recipe
from kiln.domain.recipes.recipe_sections import DEFAULT_PLATFORM
from kiln.domain.recipes.resolved import ResolvedRecipe, resolve_recipe
from kiln.domain.serving.launch_command import LAUNCH_FILE, launch_json
from kiln.infra.docker import DockerDaemon, Image

_TAIL = """
# ---- kiln tail: appended by the harness (overlays, launch config, non-root user) ----
USER root
COPY _kiln/overlays/ /opt/kiln/overlays/
RUN ["/opt/kiln/venv/bin/python", "/opt/kiln/lib/kiln_patching.py", "apply-overlays", "--root", "/opt/kiln/site-packages", "--overlays", "/opt/kiln/overlays", "--manifest-append", "/opt/kiln/patches.json"]
COPY _kiln/launch.json /opt/kiln/launch.json
USER kiln
"""  # the RUN line is Dockerfile text hashed into the input digest: not re-wrapped  # noqa: E501


class RecipeImage(_NamedByInputs):
    """kiln/<recipe>: the recipe's thin Dockerfile FROM its engine image, plus the kiln tail."""

    def __init__(self, resolved: ResolvedRecipe, engine_image: EngineImage) -> None:
        self.resolved = resolved
        self.loaded = resolved.loaded
        self.engine_image = engine_image

    @property
    def recipe(self) -> Recipe:
        """The recipe the image is built from."""
        return self.loaded.recipe

    @property
    def platform(self) -> str:
        """The image's platform: its engine image's."""
        return self.engine_image.platform

    @property
    def repository(self) -> str:
        """The image's local repository: `kiln/<recipe>`."""
        return f"kiln/{self.recipe.name}"

    @cached_property
    def context(self) -> BuildContext:
        """The recipe image's build context: its Dockerfile with kiln's tail, its folder, shared files, overlays,
        launch document and lock files."""
        ctx = BuildContext()
        dockerfile = (self.loaded.dir / DOCKERFILE).read_text()
        ctx.add_bytes(DOCKERFILE, (dockerfile.rstrip("\n") + "\n" + _TAIL).encode())
        ctx.add_source(self.loaded.dir / DOCKERFILE)  # its bytes are in the entry above
        ctx.add_tree("", self.loaded.dir, exclude=(DOCKERFILE, "experimental", "README.md"))
        for name in self.recipe.build.shared:  # recipes/_shared/ files the recipe names
            ctx.add_file(name, self.loaded.shared_file(name))
        version = self.recipe.engine.version
        for feature in self.resolved.features:
            ov = feature.override
            ctx.add_tree(f"_kiln/overlays/{feature.name}", ov.dir, exclude=excluded_paths(ov, version))
            ctx.add_bytes(f"_kiln/overlays/{feature.name}/overlay.json", overlay_json(ov, version))
        if not self.recipe.experimental:
            ctx.add_bytes("_kiln/overlays/.none", b"")
        ctx.add_bytes(LAUNCH_FILE, launch_json(self.resolved))
        lock = self.lock
        if lock is not None:  # the lock's own bytes came with the recipe folder's tree
            for name, data in recipe_lock.context_files(lock, self.platform).items():
                ctx.add_bytes(f"_kiln/lock/{name}", data)
        ctx.add_param("engine-image-digest", self.engine_image.digest)
        if self.platform != DEFAULT_PLATFORM:
            ctx.add_param("platform", self.platform)
        return ctx

    @property
    def lock_file(self) -> Path:
        """The path of the recipe's lock file."""
        return recipe_lock.lock_path(self.loaded.dir)

    @cached_property
    def lock(self) -> lock_records.EngineLock | None:
        """The lock of the recipe's own packages (build.python_packages); None: it names none."""
        return recipe_lock.for_recipe(self.loaded)

    def add_wheels(self) -> list[Path]:
        """The recipe's locked wheels (and the uv that installs them), fetched once into the
        cache, each checked against the lock's sha256, into the context's _kiln/wheels/:
        identified by the lock's hashes in the digest, not by their bytes."""
        if self.lock is None:
            return []
        wheels = wheelhouse.fetch_locked(
            self.lock, self.platform, lock_file=self.lock_file, cafile=self.engine_image.ca.get().path
        )
        for whl in wheels:
            self.context.add_file(f"_kiln/wheels/{whl.name}", whl, in_digest=False)
        return wheels

    @property
    def latest_tag(self) -> str:
        """The image's `latest` tag for its platform."""
        return local_ref(f"{self.repository}:latest{platform_suffix(self.platform)}")

    def buildargs(self) -> dict[str, str]:
        """The build arguments: the engine image it builds on."""
        return {"KILN_ENGINE_IMAGE": self.engine_image.tag}

    def input_sources(self) -> dict[Path, tuple[str, ...]]:
        """Every input the image's digest covers: its engine image's and its own context's."""
        # the engine image is in this image: its inputs are this image's inputs too
        return {**self.engine_image.input_sources(), **self.context.sources}

    def overlay_patch_entries(self) -> dict[str, str]:
        """The sha256 of each overlay patch the recipe's features apply, keyed by `feature/patch`."""
        out: dict[str, str] = {}
        for feature in self.resolved.features:
            if feature.series_file is not None:
                for name, sha in series_entries(feature.series_file):
                    out[f"{feature.name}/{name}"] = sha
        return out

    def labels(self) -> dict[str, str]:
        """The image's labels: OCI ones, the recipe, its engine, digests, patches and features."""
        r = self.recipe
        patches = dict(self.engine_image.patch_entries())
        patches.update(self.overlay_patch_entries())
        return {
            **_oci_labels(self.repository, f"{r.engine.name}-{r.engine.version}-{self.short}", self.source_date),
            "org.opencontainers.image.description": re.sub(r"\s+", " ", r.description)[:500],
            f"{LABEL_NS}.kind": "recipe",
            f"{LABEL_NS}.recipe": r.name,
            f"{LABEL_NS}.input-digest": self.digest,
            f"{LABEL_NS}.engine.name": r.engine.name,
            f"{LABEL_NS}.engine.version": r.engine.version,
            f"{LABEL_NS}.engine.flavour": r.engine.flavour,
            f"{LABEL_NS}.engine.image": self.engine_image.canonical_tag,
            f"{LABEL_NS}.engine.input-digest": self.engine_image.digest,
            f"{LABEL_NS}.patches": json.dumps(patches, sort_keys=True),
            f"{LABEL_NS}.experimental": ",".join(r.features),
            f"{LABEL_NS}.served-model-name": r.launch.served_model_name,
            f"{LABEL_NS}.port": str(r.launch.port),
            **_platform_labels(self.platform),
            **(
                {f"{LABEL_NS}.recipe-lock": f"{engine_lock.shown(self.lock_file)}@sha256:{sha256_file(self.lock_file)}"}
                if self.lock is not None
                else {}
            ),
        }


@dataclass(frozen=True)
class RecipeImages:
    """A recipe with the engine image and recipe image its current inputs make (neither
    need be built; `recipe_image.resolved` is the recipe resolved)."""

    loaded: LoadedRecipe
    engine_image: EngineImage
    recipe_image: RecipeImage


@dataclass(frozen=True)
class BuiltRecipe:
    """A recipe, its recipe image, and the local image built from its current inputs."""

    loaded: LoadedRecipe
    recipe_image: RecipeImage
    image: Image


def resolve(recipe: str | ResolvedRecipe, ca_flag: str | None = None, platform: str | None = None) -> RecipeImages:
    """A recipe (by name, or resolved already), with the engine image and recipe image its
    current inputs make for `platform` (default: the host's)."""
    resolved = resolve_recipe(recipe) if isinstance(recipe, str) else recipe
    return images_on(resolved, for_engine(resolved.engine, ca_flag, platform))


def images_on(resolved: ResolvedRecipe, engine_image: EngineImage) -> RecipeImages:
    """The recipe's images on `engine_image`, the engine image its inputs make."""
    return RecipeImages(resolved.loaded, engine_image, RecipeImage(resolved, engine_image))


def local_image_for(docker: DockerDaemon, tag: str, digest: str) -> Image | None:
    """The local image for this input digest, or None (a tag alone is not trusted, nor an
    image an older kiln built from the same inputs without normalising it)."""
    img = docker.image(tag)
    if img is None:
        return None
    if (img.labels or {}).get(f"{LABEL_NS}.input-digest") != digest:
        return None
    if not _is_normalised(img):
        return None
    return img


def _is_normalised(img: Image) -> bool:
    """A normalised image's config `created` is its source date, which is also its
    `org.opencontainers.image.created` label; a builder's own image has the wall clock
    (to the nanosecond) there instead."""
    return img.attrs.get("Created") == (img.labels or {}).get("org.opencontainers.image.created")


def require_built(docker: DockerDaemon, recipe: str | ResolvedRecipe, platform: str | None = None) -> BuiltRecipe:
    """The image built from the current inputs (for `platform`), or ImageNotBuilt."""
    resolved = resolve(recipe, platform=platform)
    recipe_image, name = resolved.recipe_image, resolved.loaded.name
    img = local_image_for(docker, recipe_image.tag, recipe_image.digest)
    if img is None:
        what = f"{name}" if recipe_image.platform == DEFAULT_PLATFORM else f"{name}, {recipe_image.platform}"
        raise ImageNotBuilt(f"{recipe_image.tag} (from the current inputs of {what}) is not built")
    return BuiltRecipe(resolved.loaded, recipe_image, img)


# what kiln.usecases.build imports from here (the rest: from their modules)
__all__ = [
    "PATCHER_ARC",
    "BuiltRecipe",
    "EngineImage",
    "RecipeImage",
    "engine_modules",
    "local_image_for",
    "platform_suffix",
    "require_built",
    "resolve",
]
