#!/usr/bin/env python3
"""dlopen every CUDA library torch can load, on a host without a GPU or driver.

Runs inside the built image (stdlib + the image's torch). After `import torch` (which
loads libtorch_cuda.so and preloads the nvidia-* wheels' libraries it needs), every shared
library under torch/lib and the nvidia/ packages is dlopen'ed with RTLD_NOW, so a missing
dependency or an undefined symbol fails here, not on the GPU host. Libraries whose only
failure is the driver (libcuda.so.1, mounted by the NVIDIA container runtime) are counted
apart and listed, as are elf_needed.OPTIONAL_PLUGINS missing the host stack they serve.
Then cuDNN and NCCL are asked for their versions, which loads them for real without a GPU.

usage: dlopen_cuda.py [--json]
"""

from __future__ import annotations

import ctypes
import fnmatch
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from elf_needed import OPTIONAL_PLUGINS

DRIVER = re.compile(r"libcuda\.so|libnvidia-ml\.so")


def libraries(site: str) -> list[str]:
    roots = [os.path.join(site, "torch", "lib"), os.path.join(site, "nvidia")]
    out = []
    for root in roots:
        for dirpath, _, files in os.walk(root):
            for name in files:
                if re.search(r"\.so(\.\d+)*$", name) and not os.path.islink(os.path.join(dirpath, name)):
                    out.append(os.path.join(dirpath, name))
    return sorted(out)


def load_all(paths: list[str], site: str) -> dict:
    """dlopen each path (RTLD_NOW: undefined symbols fail now); sort the failures into
    those that only lack the driver and the rest."""
    out = {"loaded": [], "driver_only": {}, "optional_plugin": {}, "failed": {}}
    for path in paths:
        rel = os.path.relpath(path, site)
        try:
            ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
            out["loaded"].append(rel)
        except OSError as exc:
            message = str(exc).replace(path, rel)
            if DRIVER.search(message):
                out["driver_only"][rel] = message
            elif _optional_plugin(path, message):
                out["optional_plugin"][rel] = message
            else:
                out["failed"][rel] = message
    return out


def _optional_plugin(path: str, message: str) -> bool:
    missing = message.split(":", 1)[0].strip()
    return any(missing in names and fnmatch.fnmatchcase(path, pattern) for pattern, names, _ in OPTIONAL_PLUGINS)


def main() -> int:
    import torch

    site = os.path.dirname(os.path.dirname(torch.__file__))
    result = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu_visible": torch.cuda.is_available(),
        **load_all(libraries(site), site),
    }
    calls = {
        "cudnn_version": lambda: torch.backends.cudnn.version(),  # looked up when called  # noqa: PLW0108
        "nccl_version": lambda: ".".join(map(str, torch.cuda.nccl.version())),
        # looked up when called: a build may lack it
        "cuda_compiled": lambda: torch._C._cuda_getCompiledVersion(),  # noqa: PLW0108
    }
    result["calls"] = {}
    for name, call in calls.items():
        try:
            result["calls"][name] = str(call())
        except Exception as exc:
            result["failed"][name] = f"{type(exc).__name__}: {exc}"
    if torch.version.cuda is None:
        result["failed"]["torch"] = "this torch is not a CUDA build"
    if "--json" in sys.argv:
        print("KILN-PROOF " + json.dumps(result))
    else:
        print(json.dumps(result, indent=1))
    return 1 if result["failed"] or not result["loaded"] else 0


if __name__ == "__main__":
    sys.exit(main())
