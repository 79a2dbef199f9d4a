"""Stamp an engine image with the torch / CUDA / NCCL versions it really carries.

The Dockerfile cannot know them: torch comes from whatever vLLM pins, its CUDA build
from the index, NCCL from the nvidia-nccl wheel torch pins. So after the engine image is
built, a short container imports torch inside it (no GPU needed) and prints what it
finds; a derived image (`FROM <id>` plus labels, no new filesystem layer) carries the
answers as `ai.kiln.engine.torch` / `.cuda` / `.nccl`, and that image is what gets
tagged (`kiln.usecases.build` heals an image built before probing existed). `declared_engine`
compares these labels with the recipe's declared engine.
"""

from __future__ import annotations

import json
import time
from typing import TypedDict

from kiln.basics import log
from kiln.basics.documents import Shape
from kiln.domain.images.build_context import BuildContext
from kiln.domain.images.image_naming import LABEL_NS
from kiln.infra.docker import DockerDaemon, Image, id_of

_TORCH = f"{LABEL_NS}.engine.torch"
_CUDA = f"{LABEL_NS}.engine.cuda"
_NCCL = f"{LABEL_NS}.engine.nccl"
_PROBED = f"{LABEL_NS}.engine.probe"  # the raw answer; marks the image as probed
_PROBE_TIMEOUT_S = 180

# Runs inside the image with its own python. NCCL: the library torch actually loads
# (ncclGetVersion needs no GPU); the wheel's metadata only if torch cannot say.
_PROBE = r"""
import importlib.metadata as md, json, sys
try:
    import torch
except ModuleNotFoundError as exc:  # no torch at all (a stand-in engine): nothing to stamp
    if exc.name != "torch":
        raise
    print("KILN-PROBE " + json.dumps({"torch": None, "cuda": None, "nccl": None}))
    sys.exit(0)
out = {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": None}
try:
    v = torch.cuda.nccl.version()
    out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
except Exception:
    for dist in ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11"):
        try:
            out["nccl"] = md.version(dist)
            break
        except md.PackageNotFoundError:
            pass
if out["cuda"] is None:
    out["nccl"] = None  # a CPU torch: an installed NCCL wheel would be dead weight, not a fact
print("KILN-PROBE " + json.dumps(out))
"""


class _EngineProbe(TypedDict):
    """What PROBE prints: the versions found inside the image (None when absent)."""

    torch: str | None
    cuda: str | None
    nccl: str | None


class _ImportCheck(TypedDict):
    """What import_check's script prints once every module imported."""

    machine: str
    modules: int


_ENGINE_PROBE = Shape(_EngineProbe)
_IMPORT_CHECK = Shape(_ImportCheck)


def _probe(docker: DockerDaemon, image_id: str) -> _EngineProbe:
    """{"torch", "cuda", "nccl"} as found inside the image (None when absent)."""
    return docker.run_script(
        image_id,
        _PROBE,
        marker="KILN-PROBE",
        answer=_ENGINE_PROBE,
        what=f"engine probe in {image_id[:19]}",
        timeout_s=_PROBE_TIMEOUT_S,
        cause=" (torch not importable?)",
    )


_IMPORT_TIMEOUT_S = 1800  # under qemu: vllm and its GPU model runner import in minutes, not seconds


def import_check(docker: DockerDaemon, image_id: str, modules: list[str]) -> None:
    """Import every module of `modules` in the built image, on its own machine (under qemu
    for a foreign architecture): the check a cross-placed build could not run in its
    builder stage, where the venv's native code is another machine's. BuildFailed naming
    the image when one does not import; nothing is tagged then (build.py checks first)."""
    script = (
        "import importlib, json, platform\n"
        f"for name in {modules!r}:\n    importlib.import_module(name)\n"
        "print('KILN-IMPORTS ' + json.dumps({'machine': platform.machine(), 'modules': %d}))" % len(modules)
    )
    log.step(f"import check in {image_id[:19]}: {' '.join(modules)} (minutes under qemu)")
    t0 = time.monotonic()
    found = docker.run_script(
        image_id,
        script,
        marker="KILN-IMPORTS",
        answer=_IMPORT_CHECK,
        what=f"import check in {image_id[:19]}",
        timeout_s=_IMPORT_TIMEOUT_S,
        cause=f" (one of {' '.join(modules)} does not import)",
    )
    log.ok(f"import check: {len(modules)} modules import on {found['machine']} [{time.monotonic() - t0:.0f} s]")


def _labels_for(found: _EngineProbe) -> dict[str, str]:
    """Probe results as labels; CUDA as major.minor, the form recipes declare. What the
    engine lacks gets no label (a CPU torch has no CUDA)."""
    out = {_PROBED: json.dumps(found, sort_keys=True)}
    if torch := found.get("torch"):
        out[_TORCH] = torch
    if cuda := found.get("cuda"):
        out[_CUDA] = ".".join(cuda.split(".")[:2])
    if nccl := found.get("nccl"):
        out[_NCCL] = nccl
    return out


def is_stamped(image: Image) -> bool:
    """Whether the image carries the probe's stamp label."""
    return _PROBED in (image.labels or {})


def labelled(docker: DockerDaemon, image: Image) -> str:
    """Id of an image carrying the probed labels: `image` itself when already stamped,
    else a derived `FROM <id>` image with them. Raises if the probe fails; tags nothing."""
    image_id = id_of(image)
    if is_stamped(image):
        return image_id
    found = _probe(docker, image_id)
    ctx = BuildContext()
    ctx.add_bytes("Dockerfile", f"FROM {image_id}\n".encode())
    result = docker.build(ctx, label="engine-labels", labels=_labels_for(found), quiet=True)
    log.ok("engine probe: " + ", ".join(f"{k} {v or 'none'}" for k, v in found.items()))
    return result.image_id
