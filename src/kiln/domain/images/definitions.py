"""The images kiln builds, defined by their inputs: EngineImage (shared per flavour and
engine pin) and RecipeImage (one per recipe, FROM its engine image).

Each knows its build
context, input digest, tags and labels; `resolve` makes both from a recipe name and
`existing` finds the image the current inputs already built. `build.py` builds them."""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from kiln import inimage
from kiln.basics.errors import ImageNotBuilt
from kiln.basics.files import sha256_file
from kiln.basics.paths import local_ref, repo_root
from kiln.domain.images import wheelhouse
from kiln.domain.images.build_context import BuildContext
from kiln.domain.images.ca_bundle import CABundle, resolve_ca
from kiln.domain.locks import engine_lock, lock_records, recipe_lock
from kiln.domain.patching.overlay import excluded_paths, overlay_json
from kiln.domain.recipes.recipe import DOCKERFILE, LoadedRecipe, Recipe
from kiln.domain.recipes.recipe_sections import DEFAULT_PLATFORM, Engine
from kiln.domain.recipes.resolved import ResolvedRecipe, resolve_recipe
from kiln.domain.reproducible import source_date as sourcedate
from kiln.domain.serving.launch_command import LAUNCH_FILE, launch_json
from kiln.infra import git
from kiln.infra.docker import DockerDaemon, Image

LABEL_NS = "ai.kiln"
PATCHER_ARC = "_kiln/kiln_patching.py"
# the applier's parser, which it imports by this name (inimage/patch_applier.py)
_PATCHFORMAT_ARC = "_kiln/kiln_patchformat.py"
_HFCACHE_ARC = "_kiln/kiln_hfcache.py"  # the entrypoint's snapshot check (inimage/hf_cache.py)
LOCK_ARC = "_kiln/lock/engine.lock.json"


def _git(*args: str) -> str:
    return git.output(repo_root(), *args) or ""


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


def _patcher_sources() -> dict[str, Path]:
    # the in-image applier and its parser only: host-side patch tools are no engine-image input
    return {PATCHER_ARC: inimage.source("patch_applier"), _PATCHFORMAT_ARC: inimage.source("patch_format")}


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


class EngineImage(_NamedByInputs):
    """kiln/engine-<flavour>: vLLM + kiln-engine + the pinned patch series on a base image."""

    def __init__(self, engine: Engine, ca: _LazyCA | None, platform: str | None = None) -> None:
        self.engine = engine
        # None: the default CA, resolved only if wheels are fetched (`kiln engine lock` wants base_ref)
        self.ca = ca if ca is not None else _LazyCA(None)
        self.dir = engine_lock.engine_image_dir(engine.flavour)
        # the OCI platform built for: the host's unless asked (the daemon builds its own)
        self._platform = platform

    @property
    def repository(self) -> str:
        return f"kiln/engine-{self.engine.flavour}"

    @property
    def base_ref(self) -> str:
        """The base image for this platform: kiln's own air-gapped base has one tag per
        platform (kiln/base:bookworm-arm64, `kiln base build --platform`); a registry base
        pinned by digest is the same reference (an index names every platform)."""
        base = self.engine.base_image
        if base.ref.startswith("kiln/") and not base.digest:
            return base.ref + platform_suffix(self.platform)
        return base.pinned

    @property
    def series_dir(self) -> Path:
        return repo_root() / "patches" / self.engine.name / self.engine.version

    def wheel_requirements(self) -> list[str]:
        return wheelhouse.requirements(self.dir, self.engine)

    @property
    def lock_file(self) -> Path:
        return engine_lock.lock_path(self.dir, self.engine.name, self.engine.version)

    @cached_property
    def lock(self) -> lock_records.EngineLock | None:
        """The lock this image installs from (None: an image dir without locks/)."""
        return engine_lock.for_image(self.dir, self.engine.name, self.engine.version)

    @property
    def platform(self) -> str:
        return self._platform or engine_lock.host_platform()

    @property
    def builder_platform(self) -> str:
        """The machine the wheels and builder stages run on. For an image of another
        architecture whose Dockerfile can place wheels for it (declares `ARG
        WHEEL_PLATFORM`: engine-cuda), the host's own: uv places the target's wheels
        and the host strips and byte-compiles them, and only the runtime OS's apt and
        kiln's import check run under qemu. Otherwise the image's platform (every RUN
        step under qemu)."""
        host = engine_lock.host_platform()
        base = self.engine.base_image
        kiln_base = base.ref.startswith("kiln/") and not base.digest  # one tag per platform, built here
        if (
            self.platform != host
            and kiln_base
            and self.lock is not None
            and _declares_arg(self.dir / "Dockerfile", _CROSS_ARG)
        ):
            return host
        return self.platform

    @property
    def cross_placed(self) -> bool:
        return self.builder_platform != self.platform

    @property
    def host_base(self) -> str:
        """The host's own base image, whose files a cross-placed build's builder stages run on."""
        return self.engine.base_image.ref + platform_suffix(self.builder_platform)

    @property
    def modules(self) -> list[str]:
        """The modules the image's venv must import (`engine_modules`)."""
        return engine_modules(self.engine.flavour)

    @property
    def builder_image(self) -> str:
        """The base the builder stages start FROM: the host's base, re-marked as the
        target platform for a cross-placed build (`kiln/base:bookworm-builder-for-arm64`,
        made by the build command), else the image's own base."""
        if not self.cross_placed:
            return self.base_ref
        return _builder_base_tag(self.engine.base_image.ref, self.platform)

    @cached_property
    def context(self) -> BuildContext:
        ctx = BuildContext()
        ctx.add_tree("", self.dir)
        ctx.add_tree("_kiln/common", repo_root() / "docker-images" / "common")
        ctx.add_tree("_kiln/engine", repo_root() / "engine", exclude=("tests",))
        if self.series_dir.is_dir():
            ctx.add_tree("_kiln/patches", self.series_dir)
        else:
            ctx.add_bytes("_kiln/patches/series", b"")
        for arc, path in _patcher_sources().items():
            ctx.add_file(arc, path)
        ctx.add_file(_HFCACHE_ARC, inimage.source("hf_cache"))
        ctx.add_param("engine", f"{self.engine.name}=={self.engine.version}")
        ctx.add_param("flavour", self.engine.flavour)
        ctx.add_param("base_image", self.base_ref)
        if self.platform != DEFAULT_PLATFORM:  # linux/amd64's digest stays what it always was
            ctx.add_param("platform", self.platform)
        if self.cross_placed:  # another way to the same files: its own identity
            ctx.add_param("builder_platform", self.builder_platform)
            ctx.add_param("builder_image", self.host_base)
        lock = self.lock
        if lock is None:
            ctx.add_param("wheelhouse", "\n".join(self.wheel_requirements()))
        else:
            # the lock's bytes are the input; the files derived from it follow from them
            ctx.add_file(LOCK_ARC, self.lock_file)
            for name, data in self._lock_files(lock).items():
                ctx.add_bytes(f"_kiln/lock/{name}", data)
        return ctx

    def _lock_files(self, lock: lock_records.EngineLock) -> dict[str, bytes]:
        """The lock's files for the target platform; a cross-placed build's builder
        stages also need the host's Debian pins (kiln-apt-install takes the lines of
        the machine it runs on) and the host's uv."""
        files = engine_lock.context_files(lock, self.platform)
        if self.cross_placed:
            host = engine_lock.context_files(lock, self.builder_platform)
            lines = set(files["debian.txt"].decode().splitlines()) | set(host["debian.txt"].decode().splitlines())
            files["debian.txt"] = "".join(line + "\n" for line in sorted(lines)).encode()
            files["uv.txt"] = host["uv.txt"]
        return files

    def add_wheels(self, *, plain: bool | None = None) -> list[Path]:
        """Fetch the wheelhouse (once, into the cache) and put it into the context.
        Wheels are identified by their pins (the lock's hashes) in the digest, not by
        their bytes. `plain`: also the wheels only the plain size anchor installs."""
        if plain is None:  # engine-cuda's wheels stage is shared with the plain anchor
            plain = bool(self.lock is not None and self.lock.plain_extra_packages)
        if self.lock is not None:
            wheels = wheelhouse.fetch_locked(
                self.lock, self.platform, lock_file=self.lock_file, cafile=self.ca.get().path, plain=plain
            )
        else:
            wheels = wheelhouse.fetch(self.wheel_requirements(), self.engine.flavour)
        if self.lock is not None and self.cross_placed:
            wheels += wheelhouse.fetch_tools(
                self.lock, self.builder_platform, lock_file=self.lock_file, cafile=self.ca.get().path
            )
        for whl in wheels:
            self.context.add_file(f"_kiln/wheels/{whl.name}", whl, in_digest=False)
        if not wheels:
            self.context.add_bytes("_kiln/wheels/.keep", b"", in_digest=False)
        return wheels

    @property
    def alias_tag(self) -> str:
        return local_ref(f"{self.repository}:{self.engine.name}-{self.engine.version}{platform_suffix(self.platform)}")

    def input_sources(self) -> dict[Path, tuple[str, ...]]:
        sources = self.context.sources
        if self.engine.base_image.ref.startswith("kiln/"):  # built here by `kiln base build`
            sources[repo_root() / "docker-images" / "base"] = ()
        return sources

    def buildargs(self) -> dict[str, str]:
        args = {
            "BASE_IMAGE": local_ref(self.base_ref),
            "ENGINE_VERSION": self.engine.version,
        }
        if self.cross_placed:
            args["BUILDER_IMAGE"] = local_ref(self.builder_image)
            args[_CROSS_ARG] = engine_lock.platform(self.platform).uv
        return args

    def patch_entries(self) -> list[tuple[str, str]]:
        return series_entries(self.series_dir / "series")

    def labels(self) -> dict[str, str]:
        e = self.engine
        return {
            **_oci_labels(self.repository, f"{e.name}-{e.version}", self.source_date),
            f"{LABEL_NS}.kind": "engine",
            f"{LABEL_NS}.input-digest": self.digest,
            f"{LABEL_NS}.engine.name": e.name,
            f"{LABEL_NS}.engine.version": e.version,
            f"{LABEL_NS}.engine.flavour": e.flavour,
            f"{LABEL_NS}.base-image": self.base_ref,
            **_platform_labels(self.platform),
            f"{LABEL_NS}.patches": json.dumps(dict(self.patch_entries()), sort_keys=True),
            **(
                {f"{LABEL_NS}.lock": f"{engine_lock.shown(self.lock_file)}@sha256:{sha256_file(self.lock_file)}"}
                if self.lock is not None
                else {}
            ),
        }


_IMPORTS_FILE = "imports.txt"  # the modules an engine venv must import (engine-cuda)
_CROSS_ARG = "WHEEL_PLATFORM"  # the build arg of an engine Dockerfile that can place wheels for another machine


def engine_modules(flavour: str) -> list[str]:
    """The modules the engine image's venv must import (its imports.txt; none listed: vllm)."""
    listed = engine_lock.engine_image_dir(flavour) / _IMPORTS_FILE
    return listed.read_text().split() if listed.is_file() else ["vllm"]


def _declares_arg(dockerfile: Path, name: str) -> bool:
    return dockerfile.is_file() and re.search(rf"^ARG {name}\b", dockerfile.read_text(), re.MULTILINE) is not None


def _builder_base_tag(base_ref: str, platform: str) -> str:
    """kiln/base:bookworm-builder-for-arm64: the host's base, marked as `platform`."""
    return f"{base_ref}-builder-for{platform_suffix(platform)}"


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
        return self.loaded.recipe

    @property
    def platform(self) -> str:
        return self.engine_image.platform

    @property
    def repository(self) -> str:
        return f"kiln/{self.recipe.name}"

    @cached_property
    def context(self) -> BuildContext:
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
        return local_ref(f"{self.repository}:latest{platform_suffix(self.platform)}")

    def buildargs(self) -> dict[str, str]:
        return {"KILN_ENGINE_IMAGE": self.engine_image.tag}

    def input_sources(self) -> dict[Path, tuple[str, ...]]:
        # the engine image is in this image: its inputs are this image's inputs too
        return {**self.engine_image.input_sources(), **self.context.sources}

    def overlay_patch_entries(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for feature in self.resolved.features:
            if feature.series_file is not None:
                for name, sha in series_entries(feature.series_file):
                    out[f"{feature.name}/{name}"] = sha
        return out

    def labels(self) -> dict[str, str]:
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


class _LazyCA:
    """Resolving the CA may ask pip for its config (a subprocess): only do it when a
    build really runs, so no-op rebuilds stay fast."""

    def __init__(self, flag: str | None) -> None:
        self.flag = flag
        self._value: CABundle | None = None

    def get(self) -> CABundle:
        if self._value is None:
            self._value = resolve_ca(self.flag)
        return self._value


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
    engine_image = EngineImage(resolved.engine, _LazyCA(ca_flag), platform)
    return RecipeImages(resolved.loaded, engine_image, RecipeImage(resolved, engine_image))


def existing(docker: DockerDaemon, tag: str, digest: str) -> Image | None:
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
    img = existing(docker, recipe_image.tag, recipe_image.digest)
    if img is None:
        what = f"{name}" if recipe_image.platform == DEFAULT_PLATFORM else f"{name}, {recipe_image.platform}"
        raise ImageNotBuilt(f"{recipe_image.tag} (from the current inputs of {what}) is not built")
    return BuiltRecipe(resolved.loaded, recipe_image, img)
