#!/usr/bin/env python3
"""Prove the run-time compilers the image keeps can do the compiles GPU code does.

Runs inside the built image on CPU, as the image's own user. Three compiles, each the
real code path with only the GPU taken out:
  triton_cuda_utils: Triton's NVIDIA driver compiles backends/nvidia/driver.c into the
    `cuda_utils` extension (C, Python.h, Triton's cuda.h, linked to libcuda.so.1) the
    first time a kernel is loaded. Here through Triton's own compile_so_from_file with
    the driver module's own include dirs and libraries; libcuda.so.1, which the NVIDIA
    runtime mounts on a GPU host, is a stub built here and pointed to by
    TRITON_LIBCUDA_PATH (Triton's documented override). The result must be a shared
    library exporting PyInit_cuda_utils.
  torch_cpp_extension: torch.utils.cpp_extension.load_inline (g++, torch's headers,
    ninja), as vLLM's NCCL allocator does, CPU-only, then called.
  nvcc: the nvcc of the nvidia-cuda-nvcc wheel compiles a CUDA kernel for sm_90 with g++
    as its host compiler (TileLang and FlashInfer compile this way at run time).

usage: compilers.py [--json]
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import tempfile
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from elf_needed import read_dynamic


def triton_cuda_utils(work: str) -> str:
    stub_dir = os.path.join(work, "driver")
    os.makedirs(stub_dir)
    stub_c = os.path.join(work, "stub.c")
    with open(stub_c, "w") as f:
        f.write("int kiln_stub_libcuda;\n")
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", os.path.join(stub_dir, "libcuda.so.1"), stub_c],
        check=True,
    )
    os.environ["TRITON_LIBCUDA_PATH"] = stub_dir
    os.environ["TRITON_CACHE_DIR"] = os.path.join(work, "triton-cache")
    import triton.backends.nvidia.driver as drv
    from triton.runtime.build import compile_so_from_file

    so = compile_so_from_file(
        os.path.join(drv.dirname, "driver.c"),
        "cuda_utils",
        library_dirs=drv.library_dirs(),
        include_dirs=drv.include_dirs,
        libraries=drv.libraries,
    )
    info = read_dynamic(so)
    assert info is not None, f"{so} is not a shared library"
    assert b"PyInit_cuda_utils" in open(so, "rb").read(), f"{so} exports no PyInit_cuda_utils"
    return f"{os.path.basename(so)} ({os.path.getsize(so)} bytes) needs {', '.join(info.needed)}"


def torch_cpp_extension(work: str) -> str:
    from torch.utils.cpp_extension import load_inline

    mod = load_inline(
        name="kiln_probe",
        cpp_sources="int kiln_add(int a, int b) { return a + b; }",
        functions=["kiln_add"],
        build_directory=work,
        verbose=False,
    )
    assert mod.kiln_add(2, 3) == 5
    return "load_inline built and called kiln_add(2, 3) = 5"


def nvcc(work: str) -> str:
    import nvidia

    found = sorted(glob.glob(os.path.join(os.path.dirname(nvidia.__path__[0]), "nvidia", "*", "bin", "nvcc")))
    assert found, "no nvcc in the nvidia-* wheels"
    src = os.path.join(work, "k.cu")
    with open(src, "w") as f:
        f.write("__global__ void kiln_k(float *x) { x[threadIdx.x] *= 2.0f; }\n")
    out = os.path.join(work, "k.o")
    proc = subprocess.run(
        [found[0], "-c", "-arch=sm_90", "-Xcompiler", "-fPIC", src, "-o", out],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, f"nvcc failed: {(proc.stderr or proc.stdout).strip()[-400:]}"
    return f"{os.path.relpath(found[0], os.path.dirname(nvidia.__path__[0]))} -arch=sm_90: {os.path.getsize(out)} bytes"


def main() -> int:
    result = {"ok": {}, "failed": {}}
    for check in (triton_cuda_utils, torch_cpp_extension, nvcc):
        with tempfile.TemporaryDirectory() as work:
            try:
                result["ok"][check.__name__] = check(work)
            except BaseException as exc:
                result["failed"][check.__name__] = "".join(traceback.format_exception_only(type(exc), exc)).strip()[
                    -600:
                ]
    if "--json" in sys.argv:
        print("KILN-PROOF " + json.dumps(result))
    else:
        print(json.dumps(result, indent=1))
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
