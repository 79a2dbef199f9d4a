#!/usr/bin/env python3
"""Prove every ELF file's DT_NEEDED entries resolve inside a filesystem tree.

Runs inside the built image (stdlib only: the image has no binutils). For each ELF file
of the image's own machine (x86-64 or AArch64) with a dynamic section, every DT_NEEDED
name must be found:
  - by the dynamic loader's own search: DT_RPATH (when there is no DT_RUNPATH),
    DT_RUNPATH, then the ld.so.conf directories and the default ones ($ORIGIN expanded);
  - else by soname anywhere in the tree ("preloaded"): Python extensions such as vLLM's
    _C.abi3.so carry no run path for libtorch.so and rely on `import torch` having loaded
    it, and the loader matches an already-loaded library by its DT_SONAME;
  - else the name must be on the driver allow-list (libraries the NVIDIA container
    runtime mounts from the host driver, never shipped in an image);
  - else the file must be an optional plugin that upstream loads only when the host
    stack it serves is installed (OPTIONAL_PLUGINS: file pattern, the names, why). The
    plain `pip install vllm` image has the same gaps (build_cuda checks that).
Anything else is unresolved: the file, the name, and a non-zero exit.

usage: elf_needed.py [--root ROOT] [--json] DIR...   (DIRs inside ROOT, default /)
"""

from __future__ import annotations

import argparse
import fnmatch
import glob
import json
import os
import platform
import struct
import sys

# Provided at run time by the NVIDIA container runtime from the host's driver
# (libnvidia-container mounts them into every `--gpus` container), version-locked to the
# kernel module: an image that shipped them would break on every other driver version.
DRIVER_LIBS = {
    "libcuda.so.1": "CUDA driver API (cuInit, cuLaunchKernel): part of the host driver",
    "libcuda.so": "unversioned name of the same driver library (some JIT helpers link it)",
    "libnvidia-ml.so.1": "NVML (nvidia-smi's library): part of the host driver",
    "libnvidia-ptxjitcompiler.so.1": "the driver's PTX JIT: part of the host driver",
    "libnvidia-nvvm.so.4": "the driver's NVVM used for LTO JIT: part of the host driver",
}

# (file pattern, needed names, why): plugins pip's wheels ship for host stacks that no
# `pip install` provides; their loaders dlopen them only when that stack is configured.
OPTIONAL_PLUGINS = [
    (
        "*/numba/np/ufunc/tbbpool*.so",
        {"libtbb.so.12"},
        "numba's TBB threading layer: used only if the tbb package is installed, else OpenMP or workqueue",
    ),
    (
        "*/nvidia/*/lib/libcufile_rdma.so*",
        {"libmlx5.so.1", "librdmacm.so.1", "libibverbs.so.1"},
        "cuFile's RDMA plugin (GPUDirect Storage over InfiniBand): loaded only with rdma-core configured",
    ),
    (
        "*/nvidia/nvshmem/lib/nvshmem_bootstrap_*.so*",
        {"libmpi.so.40", "libpmix.so.2", "liboshmem.so.40"},
        "NVSHMEM bootstraps for MPI, PMIx and OpenSHMEM launchers: dlopened only when NVSHMEM_BOOTSTRAP names them",
    ),
    (
        "*/nvidia/nvshmem/lib/nvshmem_transport_*.so*",
        {"libmlx5.so.1", "libfabric.so.1", "libucs.so.0", "libucp.so.0"},
        "NVSHMEM's InfiniBand, libfabric and UCX transports: dlopened only for inter-node NVSHMEM over those stacks",
    ),
]

# the image's own machine (it runs under qemu for another architecture): its ELF files are
# the ones the loader maps; files for other machines are data to it
MACHINES = {"x86_64": (62, "x86_64-linux-gnu"), "aarch64": (183, "aarch64-linux-gnu")}
NATIVE_EM, TRIPLET = MACHINES[platform.machine()]
PT_LOAD, PT_DYNAMIC = 1, 2
DT_NULL, DT_NEEDED, DT_STRTAB, DT_SONAME, DT_RPATH, DT_RUNPATH = 0, 1, 5, 14, 15, 29
DEFAULT_DIRS = ["/lib", "/usr/lib", "/lib64", "/usr/lib64", f"/lib/{TRIPLET}", f"/usr/lib/{TRIPLET}"]


class ElfInfo:
    def __init__(self, needed, soname, rpath, runpath):
        self.needed: list[str] = needed
        self.soname: str | None = soname
        self.rpath: list[str] = rpath
        self.runpath: list[str] = runpath


def native_elf_header(f) -> bytes | None:
    """The 64-byte header of the 64-bit little-endian ELF file for this machine open at
    offset 0 in F, or None for anything else."""
    head = f.read(64)
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        return None
    if struct.unpack_from("<H", head, 18)[0] != NATIVE_EM:
        return None
    return head


def read_dynamic(path: str) -> ElfInfo | None:
    """DT_NEEDED/SONAME/RPATH/RUNPATH of a 64-bit little-endian ELF file of this machine; None for
    anything else (not ELF, device code such as cubins, objects without a dynamic section)."""
    try:
        with open(path, "rb") as f:
            head = native_elf_header(f)
            if head is None:
                return None
            (e_phoff,) = struct.unpack_from("<Q", head, 32)
            e_phentsize, e_phnum = struct.unpack_from("<HH", head, 54)
            f.seek(e_phoff)
            ph = f.read(e_phentsize * e_phnum)
            loads, dyn = [], None
            for i in range(e_phnum):
                p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from("<IIQQQQQQ", ph, i * e_phentsize)
                if p_type == PT_LOAD:
                    loads.append((p_vaddr, p_offset, p_filesz))
                elif p_type == PT_DYNAMIC:
                    dyn = (p_offset, p_filesz)
            if dyn is None:
                return None
            f.seek(dyn[0])
            raw = f.read(dyn[1])
            entries = []
            for off in range(0, len(raw) - 15, 16):
                tag, val = struct.unpack_from("<qQ", raw, off)
                if tag == DT_NULL:
                    break
                entries.append((tag, val))
            strtab = next((v for t, v in entries if t == DT_STRTAB), None)
            if strtab is None:
                return None
            base = _vaddr_to_offset(strtab, loads)

            def string(off: int) -> str:
                f.seek(base + off)
                out = b""
                while not out.endswith(b"\0"):
                    chunk = f.read(256)
                    if not chunk:
                        break
                    out += chunk
                    if b"\0" in chunk:
                        break
                return out.split(b"\0", 1)[0].decode(errors="replace")

            needed = [string(v) for t, v in entries if t == DT_NEEDED]
            soname = next((string(v) for t, v in entries if t == DT_SONAME), None)
            rpath = [p for t, v in entries if t == DT_RPATH for p in string(v).split(":") if p]
            runpath = [p for t, v in entries if t == DT_RUNPATH for p in string(v).split(":") if p]
            return ElfInfo(needed, soname, rpath, runpath)
    except (OSError, struct.error):
        return None


def _vaddr_to_offset(vaddr: int, loads) -> int:
    for p_vaddr, p_offset, p_filesz in loads:
        if p_vaddr <= vaddr < p_vaddr + p_filesz:
            return vaddr - p_vaddr + p_offset
    return vaddr  # prelinked at 0: address is the offset


def ld_conf_dirs(root: str) -> list[str]:
    """Directories of /etc/ld.so.conf (with its `include` globs), as ldconfig reads them."""
    out: list[str] = []

    def read(conf: str) -> None:
        try:
            lines = open(_in(root, conf)).read().splitlines()
        except OSError:
            return
        for line in lines:
            line = line.split("#", 1)[0].strip()  # noqa: PLW2901
            if not line:
                continue
            if line.startswith("include "):
                for pattern in line.split()[1:]:
                    for match in sorted(glob.glob(_in(root, pattern))):
                        read("/" + os.path.relpath(match, root))
            else:
                out.append(line)

    read("/etc/ld.so.conf")
    return out


def _in(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def regular_files(root: str, dirs: list[str]):
    """(path inside the tree, path on disk) of every regular file (not a link) under dirs,
    leaving out the kernel's pseudo file systems."""
    skip = {"/proc", "/sys", "/dev"}
    for top in dirs:
        for dirpath, dirnames, filenames in os.walk(_in(root, top)):
            inner = "/" + os.path.relpath(dirpath, root).lstrip(".").lstrip("/")
            dirnames[:] = [d for d in dirnames if os.path.join(inner, d) not in skip]
            for name in filenames:
                full = os.path.join(dirpath, name)
                if not os.path.islink(full) and os.path.isfile(full):
                    yield os.path.join(inner, name), full


def walk_elves(root: str, dirs: list[str]):
    """(path inside the tree, ElfInfo) for every dynamic ELF file of this machine under dirs."""
    for inner, full in regular_files(root, dirs):
        info = read_dynamic(full)
        if info is not None:
            yield inner, info


def prove(root: str, dirs: list[str]) -> dict:
    elves = dict(walk_elves(root, dirs))
    sonames = {}
    for path, info in elves.items():
        sonames.setdefault(os.path.basename(path), path)
        if info.soname:
            sonames.setdefault(info.soname, path)
    system_dirs = ld_conf_dirs(root) + DEFAULT_DIRS
    counts = {
        "elf_files": len(elves),
        "needed_entries": 0,
        "by_search_path": 0,
        "by_soname_preloaded": 0,
        "driver": 0,
        "optional_plugin": 0,
        "unresolved": 0,
    }
    unresolved, driver_users, preloaded, optional = [], {}, {}, []
    for path, info in sorted(elves.items()):
        origin = os.path.dirname(path)
        search = ([] if info.runpath else info.rpath) + info.runpath + system_dirs
        search = [d.replace("$ORIGIN", origin).replace("${ORIGIN}", origin) for d in search]
        for name in info.needed:
            counts["needed_entries"] += 1
            if _found(root, name, origin, search):
                counts["by_search_path"] += 1
            elif name in sonames:
                counts["by_soname_preloaded"] += 1
                preloaded.setdefault(name, sonames[name])
            elif name in DRIVER_LIBS:
                counts["driver"] += 1
                driver_users.setdefault(name, []).append(path)
            elif _optional_plugin(path, name):
                counts["optional_plugin"] += 1
                optional.append(f"{path}: {name}")
            else:
                counts["unresolved"] += 1
                unresolved.append(f"{path}: {name}")
    return {
        "counts": counts,
        "unresolved": unresolved,
        "preloaded": dict(sorted(preloaded.items())),
        "optional_plugins": optional,
        "driver": {
            k: {"why": DRIVER_LIBS[k], "files": len(v), "example": v[0]} for k, v in sorted(driver_users.items())
        },
    }


def _optional_plugin(path: str, name: str) -> str | None:
    for pattern, names, why in OPTIONAL_PLUGINS:
        if name in names and fnmatch.fnmatchcase(path, pattern):
            return why
    return None


def _found(root: str, name: str, origin: str, search: list[str]) -> bool:
    if "/" in name:
        return os.path.exists(_in(root, os.path.join(origin, name)))
    return any(os.path.exists(_in(root, os.path.join(d, name))) for d in search)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="/")
    ap.add_argument("--json", action="store_true", help="one KILN-PROOF line of JSON")
    ap.add_argument("dirs", nargs="*", default=["/"])
    args = ap.parse_args(argv)
    result = prove(args.root, args.dirs)
    if args.json:
        print("KILN-PROOF " + json.dumps(result))
    else:
        for line in result["unresolved"]:
            print("unresolved:", line)
        print(json.dumps(result["counts"]))
    return 1 if result["unresolved"] or not result["counts"]["elf_files"] else 0


if __name__ == "__main__":
    sys.exit(main())
