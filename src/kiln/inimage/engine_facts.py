"""What a GPU image proves about itself on a host without a GPU (`kiln smoke --in-image`).

Sent to a network-less throwaway container of the image (under qemu for another
architecture) with one line appended, `report([modules])`, which prints one line
`KILN-ENGINEPROOF <json>`. Standard library only. The facts:
the machine it runs on, torch's version and the CUDA it was built for, vLLM's version,
each module of argv[1:] imported or the error it raised, vLLM's general plugins as vLLM
loads them, and whether kiln-engine registered draft-trunc with the GPU runner. Every
step is caught and reported: the host judges the facts, this script only gathers them.
"""

import importlib
import importlib.metadata as md
import json
import platform
import sys
from typing import NotRequired, TypedDict

_DRAFT_TRUNC = "vllm.v1.worker.gpu.spec_decode.draft_trunc"  # where kiln-engine registers it


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


class EngineFacts(TypedDict):
    """What `report` prints (kiln.domain.imagecheck.in_image_smoke reads it back as this type)."""

    machine: str
    torch: str | None
    cuda: str | None
    torch_error: NotRequired[str]
    vllm: str | None
    imports: dict[str, str]  # module -> "ok" or the error its import raised
    plugins: list[str]
    draft_trunc: str | None
    plugins_error: NotRequired[str]


def _gather(modules: list[str]) -> EngineFacts:
    imports: dict[str, str] = {}
    out: EngineFacts = {
        "machine": platform.machine(),
        "torch": None,
        "cuda": None,
        "vllm": None,
        "imports": imports,
        "plugins": [],
        "draft_trunc": None,
    }
    try:
        import torch  # late: in-image only

        out["torch"], out["cuda"] = torch.__version__, torch.version.cuda
    except Exception as exc:  # a broken torch is a fact to report, not a crash  # noqa: BLE001
        out["torch_error"] = _error(exc)
    try:
        out["vllm"] = md.version("vllm")
    except md.PackageNotFoundError:
        out["vllm"] = None
    for name in modules:
        try:
            importlib.import_module(name)
            imports[name] = "ok"
        except BaseException as exc:  # SystemExit from a module is a failed import too  # noqa: BLE001
            imports[name] = _error(exc)
    out["plugins"] = sorted(e.value for e in md.entry_points(group="vllm.general_plugins"))
    try:
        from vllm.plugins import load_general_plugins  # late: in-image only

        load_general_plugins()
        module = sys.modules.get(_DRAFT_TRUNC)
        out["draft_trunc"] = None if module is None else getattr(module, "__name__", _DRAFT_TRUNC)
    except Exception as exc:  # a plugin's failure is a fact to report  # noqa: BLE001
        out["plugins_error"] = _error(exc)
    return out


def report(modules: list[str]) -> None:
    """Print the image's engine facts as one marked JSON line, for the host to read."""
    print("KILN-ENGINEPROOF " + json.dumps(_gather(modules), sort_keys=True), flush=True)
