"""The engine image kiln builds, defined by its inputs: EngineImage (kiln/engine-<flavour>,
shared per flavour and engine pin), with what goes into its build context: the engine
series, the in-image patch applier and HF cache check, the engine lock and the wheels."""

from __future__ import annotations

import json
import re
from functools import cached_property
from pathlib import Path

from kiln import inimage
from kiln.basics.files import sha256_file
from kiln.basics.paths import local_ref, repo_root
from kiln.domain.images import wheelhouse
from kiln.domain.images.build_context import BuildContext
from kiln.domain.images.ca_bundle import CABundle, resolve_ca
from kiln.domain.images.image_naming import (
    LABEL_NS,
    _NamedByInputs,
    _oci_labels,
    _platform_labels,
    platform_suffix,
    series_entries,
)
from kiln.domain.locks import engine_lock, lock_records
from kiln.domain.recipes.recipe_sections import DEFAULT_PLATFORM, Engine

PATCHER_ARC = "_kiln/kiln_patching.py"
# the applier's engine and parser, which it imports by these names (inimage/patch_applier.py)
_PATCHTREE_ARC = "_kiln/kiln_patchtree.py"
_PATCHFORMAT_ARC = "_kiln/kiln_patchformat.py"
_HFCACHE_ARC = "_kiln/kiln_hfcache.py"  # the entrypoint's snapshot check (inimage/hf_cache.py)
LOCK_ARC = "_kiln/lock/engine.lock.json"


def _patcher_sources() -> dict[str, Path]:
    # the in-image applier, its engine and its parser only: host-side patch tools are no
    # engine-image input
    return {
        PATCHER_ARC: inimage.source("patch_applier"),
        _PATCHTREE_ARC: inimage.source("patch_tree"),
        _PATCHFORMAT_ARC: inimage.source("patch_format"),
    }


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
        """The engine image's local repository: `kiln/engine-<flavour>`."""
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
        """The folder of the engine's patch series: patches/<engine>/<version>."""
        return repo_root() / "patches" / self.engine.name / self.engine.version

    def wheel_requirements(self) -> list[str]:
        """The wheelhouse requirements the engine image installs."""
        return wheelhouse.requirements(self.dir, self.engine)

    @property
    def lock_file(self) -> Path:
        """The path of the engine lock file."""
        return engine_lock.lock_path(self.dir, self.engine.name, self.engine.version)

    @cached_property
    def lock(self) -> lock_records.EngineLock | None:
        """The lock this image installs from (None: an image dir without locks/)."""
        return engine_lock.for_image(self.dir, self.engine.name, self.engine.version)

    @property
    def platform(self) -> str:
        """The platform the image is built for; the host's unless one was named."""
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
        """Whether the image is built on another platform than its own."""
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
        """The engine image's build context: its folder, kiln's common files, kiln_engine, the patch series and the
        lock."""
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
        """The tag that names the engine and version: `kiln/engine-<flavour>:<name>-<version>`."""
        return local_ref(f"{self.repository}:{self.engine.name}-{self.engine.version}{platform_suffix(self.platform)}")

    def input_sources(self) -> dict[Path, tuple[str, ...]]:
        """Every input the image's digest covers, the base image's folder too when kiln builds it."""
        sources = self.context.sources
        if self.engine.base_image.ref.startswith("kiln/"):  # built here by `kiln base build`
            sources[repo_root() / "docker-images" / "base"] = ()
        return sources

    def buildargs(self) -> dict[str, str]:
        """The build arguments: base image, engine version and, when cross-placed, the builder image and target."""
        args = {
            "BASE_IMAGE": local_ref(self.base_ref),
            "ENGINE_VERSION": self.engine.version,
        }
        if self.cross_placed:
            args["BUILDER_IMAGE"] = local_ref(self.builder_image)
            args[_CROSS_ARG] = engine_lock.platform(self.platform).uv
        return args

    def patch_entries(self) -> list[tuple[str, str]]:
        """The patch series' entries: each patch's name and sha256."""
        return series_entries(self.series_dir / "series")

    def labels(self) -> dict[str, str]:
        """The image's labels: OCI ones, its engine, digests, patches and the engine lock's."""
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


def for_engine(engine: Engine, ca_flag: str | None = None, platform: str | None = None) -> EngineImage:
    """The engine image `engine`'s inputs make for `platform` (None: the host's), its CA
    bundle (`--ca` or the environment's) resolved when first needed."""
    return EngineImage(engine, _LazyCA(ca_flag), platform)
