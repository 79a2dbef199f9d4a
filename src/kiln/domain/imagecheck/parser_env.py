"""The parser environment: the pinned engine's argument parser without its engine image.

A CUDA engine image takes half an hour and ~8 GB to build; its launch probe needs none of
what makes it big. So `kiln check` makes, once per engine pin, a parser environment and
runs the same probe in it, through the same container path and caches as an engine
image (launch_arg_check):

- a small image, `kiln/argcheck-<flavour>:<digest12>` (docker-images/argcheck/): the
  locked python3 and binutils on the engine's base, the in-image patch applier, the
  series, the stub maker;
- a folder of kiln's cache, `argcheck/env-<digest12>/`: the engine lock's wheels the
  parser imports, installed with the lock's own uv (each wheel checked by sha256 through
  the wheel cache), kiln-engine, the series applied by the in-image applier and the
  stand-ins for the CUDA libraries left out, both in one container run of the image.
  The probe's container mounts it read-only (a bind mount: the daemon runs on this
  machine).

`<digest12>` is the digest of the environment's inputs: the engine lock's bytes, the
series, kiln-engine, the Dockerfile folder and what is left out, so a new pin or patch
gives a new environment; the image's own id keys the probe's answers, as an engine
image's does.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from functools import cached_property
from pathlib import Path
from typing import NamedTuple, TypedDict

from kiln import inimage
from kiln.basics import log
from kiln.basics.documents import Shape
from kiln.basics.errors import KilnError, LockMissing
from kiln.basics.paths import cache_dir, local_ref, repo_root
from kiln.domain.images import wheelhouse
from kiln.domain.images.build_context import BuildContext
from kiln.domain.images.ca_bundle import add_to_context, resolve_ca
from kiln.domain.images.engine_image import LOCK_ARC, EngineImage
from kiln.domain.images.image_naming import LABEL_NS
from kiln.domain.locks import engine_lock
from kiln.domain.locks.lock_records import PYTHON
from kiln.infra import wheel_cache
from kiln.infra.docker import DockerDaemon, id_of

_REPOSITORY = "kiln/argcheck"
# What the parser never imports, left out of the lock's set: the NVIDIA runtime and
# compiler wheels (stood in for by stubs, docker-images/argcheck/stub-cuda-libs.py), and
# the GPU kernel packages, whose absence vLLM's own imports allow (vllm.triton_utils'
# placeholder, the optional kernels' guards). About 2.5 GB of the 4.1 GB of wheels.
_LEFT_OUT = re.compile(
    r"^(nvidia-.*|cuda-toolkit|cuda-tile|triton|tokenspeed-triton|tilelang|z3-solver|flashinfer-python"
    r"|humming-kernels|quack-kernels|nccl4py|nccl-extensions)$"
)
# the in-image patch applier, its engine and its parser, under the names it imports them by
_APPLIER = {
    "kiln_patching.py": "patch_applier",
    "kiln_patchtree.py": "patch_tree",
    "kiln_patchformat.py": "patch_format",
}
_SITE = f"/usr/local/lib/python{PYTHON}/dist-packages"  # Debian python3's site directory for local installs
_STUBS = "/opt/kiln/cuda-stubs"  # on the image's LD_LIBRARY_PATH
_DONE = ".kiln-complete"  # written last: a folder without it is made again
_MARKER = "KILN-ARGENV"
# the one container run that finishes the folder: the series, then the stubs
_PREPARE = f"""
import json, subprocess, sys
subprocess.run([sys.executable, "/opt/kiln/lib/kiln_patching.py", "apply", "--root", "{_SITE}",
                "--series", "/opt/kiln/patches/vllm/series", "--manifest", "{_STUBS}/patches.json"], check=True)
made = subprocess.run([sys.executable, "/opt/kiln/lib/stub-cuda-libs.py", "{_SITE}", "{_STUBS}"],
                      check=True, capture_output=True, text=True).stdout.splitlines()
print("{_MARKER} " + json.dumps({{"stubs": made}}), flush=True)
"""
_PREPARE_TIMEOUT_S = 900


class _Prepared(TypedDict):
    """What the finishing run printed: one line per stub library it wrote."""

    stubs: list[str]


class _Ready(NamedTuple):
    """A parser environment ready to run the probe: its image and the folders it mounts."""

    image_id: str
    tag: str
    mounts: dict[str, tuple[str, bool]]


class _ParserEnv:
    """The parser environment of one engine image's inputs (its lock, series, kiln-engine)."""

    def __init__(self, engine_image: EngineImage) -> None:
        self.engine_image = engine_image
        self.dir = repo_root() / "docker-images" / "argcheck"

    @property
    def _pin(self) -> str:
        e = self.engine_image.engine
        return f"{e.name} {e.version} ({e.flavour})"

    @cached_property
    def wanted(self) -> list[engine_lock.LockedFile]:
        """The locked wheels it installs (the uv wheel, which only installs, included)."""
        lock = self.engine_image.lock
        if lock is None:
            raise LockMissing(f"no engine lock for {self._pin}: a parser environment installs only locked wheels")
        return [f for f in engine_lock.all_wheels(lock, self.engine_image.platform) if not _LEFT_OUT.match(f.name)]

    @cached_property
    def context(self) -> BuildContext:
        image = self.engine_image
        ctx = BuildContext()
        ctx.add_tree("", self.dir)
        ctx.add_tree("_kiln/common", repo_root() / "docker-images" / "common")
        ctx.add_tree("_kiln/engine", repo_root() / "engine", exclude=("tests",))  # the folder's input
        if image.series_dir.is_dir():
            ctx.add_tree("_kiln/patches", image.series_dir)
        else:
            ctx.add_bytes("_kiln/patches/series", b"")
        for arc, module in _APPLIER.items():
            ctx.add_file(f"_kiln/{arc}", inimage.source(module))
        ctx.add_file(LOCK_ARC, image.lock_file)
        lock = image.lock
        files = engine_lock.context_files(lock, image.platform) if lock is not None else {}
        ctx.add_bytes("_kiln/lock/debian.txt", files.get("debian.txt", b""))
        ctx.add_bytes("_kiln/lock/parser.txt", "".join(f"{f.wheel.file}\n" for f in self.wanted).encode())
        ctx.add_param("left_out", _LEFT_OUT.pattern)
        ctx.add_param("base_image", image.base_ref)
        ctx.add_param("platform", image.platform)
        return ctx

    @cached_property
    def digest(self) -> str:
        return self.context.digest()

    @property
    def _key(self) -> str:
        return self.digest.removeprefix("sha256:")[:12]

    @property
    def tag(self) -> str:
        return local_ref(f"{_REPOSITORY}-{self.engine_image.engine.flavour}:{self._key}")

    @property
    def folder(self) -> Path:
        return cache_dir() / "argcheck" / f"env-{self._key}"

    def ensure(self, docker: DockerDaemon) -> _Ready:
        """The environment, made now where its image or folder is missing (the image
        built, the wheels installed, the series applied and the stubs written)."""
        image_id = self._image(docker)
        mounts = {str(self.folder / "site-packages"): (_SITE, False), str(self.folder / "cuda-stubs"): (_STUBS, False)}
        if not (self.folder / _DONE).is_file():
            self._make_folder(docker, image_id)
        return _Ready(image_id, self.tag, mounts)

    def _image(self, docker: DockerDaemon) -> str:
        img = docker.image(self.tag)
        if img is not None and (img.labels or {}).get(f"{LABEL_NS}.input-digest") == self.digest:
            return id_of(img)
        log.step(f"building the parser environment {self.tag} for {self._pin} (once per engine pin)")
        image = self.engine_image
        ctx = self.context  # its digest, the tag's, is taken: the CA joins it outside the digest
        add_to_context(ctx, resolve_ca(None))
        labels = {
            f"{LABEL_NS}.kind": "parser-environment",
            f"{LABEL_NS}.input-digest": self.digest,
            f"{LABEL_NS}.engine.name": image.engine.name,
            f"{LABEL_NS}.engine.version": image.engine.version,
            f"{LABEL_NS}.engine.flavour": image.engine.flavour,
        }
        buildargs = {"BASE_IMAGE": local_ref(image.base_ref)}
        label = f"parser environment {self._pin}"
        result = docker.build(ctx, label=label, buildargs=buildargs, labels=labels, quiet=True)
        docker.tag(result.image_id, self.tag)
        return result.image_id

    def _make_folder(self, docker: DockerDaemon, image_id: str) -> None:
        """Install, patch and stub into a fresh folder next to the final one, then move it
        in: an interrupted run leaves no folder that passes for a finished one."""
        image = self.engine_image
        self.folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=self.folder.parent, prefix=f".{self.folder.name}-"))
        try:
            site, stubs = tmp / "site-packages", tmp / "cuda-stubs"
            stubs.mkdir()
            wheels = wheelhouse.fetch_files(self.wanted, lock_file=image.lock_file, cafile=resolve_ca(None).path)
            names = {f.wheel.file: f.name for f in self.wanted}
            uv = [w for w in wheels if names.get(w.name) == "uv"]
            if not uv:
                raise LockMissing(f"the engine lock of {self._pin} names no uv for {image.platform}")
            installs = [w for w in wheels if names.get(w.name) != "uv"]
            plat = engine_lock.platform(image.platform).uv
            wheel_cache.install_unpacked(uv[0], installs, site, python=PYTHON, platform=plat)
            engine = repo_root() / "engine" / "kiln_engine"
            shutil.copytree(engine, site / "kiln_engine", ignore=shutil.ignore_patterns("__pycache__"))
            made = docker.run_script(
                image_id,
                _PREPARE,
                marker=_MARKER,
                answer=Shape(_Prepared),
                timeout_s=_PREPARE_TIMEOUT_S,
                what=f"applying the series and writing the CUDA stand-ins in {self.tag}",
                user=f"{os.getuid()}:{os.getgid()}",
                mounts={str(site): (_SITE, True), str(stubs): (_STUBS, True)},
            )
            log.debug(f"parser environment {self.tag}: {len(made['stubs'])} CUDA stand-ins")
            (tmp / _DONE).write_text(f"{self.digest}\n")
            if self.folder.exists():  # a leftover without its marker
                shutil.rmtree(self.folder, ignore_errors=True)
            os.replace(tmp, self.folder)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


def parser_env(engine_image: EngineImage) -> _ParserEnv | None:
    """The parser environment for an engine image kiln can stand in for: a CUDA engine
    with a lock, for this machine's platform (another's would run under qemu); else None."""
    if engine_image.engine.flavour != "cuda" or engine_image.platform != engine_lock.host_platform():
        return None
    try:
        if engine_image.lock is None:
            return None
    except KilnError:
        return None
    return _ParserEnv(engine_image)
