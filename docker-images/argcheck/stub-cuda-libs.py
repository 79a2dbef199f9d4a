"""Stand-ins for the CUDA libraries the parser environment leaves out.

The parser environment holds the engine's locked Python packages without the NVIDIA
runtime wheels (cuBLAS, cuDNN, NCCL, ...: about 2 GB of wheels that no argument parser
calls). torch's CUDA build still names them as DT_NEEDED, and Python loads extension
modules with RTLD_NOW, so `import torch` would fail on the first missing file. For each
library some ELF file of the venv needs and nothing on the machine provides, this writes
one shared object with that SONAME that defines, as empty functions (or zeroed data),
every symbol the venv takes from it: the symbols versioned with its name, and the
unversioned ones that nothing else defines. Each function returns "no driver" (35), as
the real runtime does on a machine without a GPU; the parser's code calls none of them
(vLLM's argument parsing and config checks run on CPU).

    usage: stub-cuda-libs.py SITE_PACKAGES OUT_DIR
Needs readelf, as and ld (binutils). Prints one line per stub.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

_SYSTEM_DIRS = ("/lib", "/usr/lib", "/lib64", "/usr/lib64", "/usr/local/lib")
# the driver's own libraries: mounted at run time by the NVIDIA container runtime, absent
# from the engine image on a machine without a GPU too, so not stood in for here either
_DRIVER = ("libcuda.so.1", "libnvidia-ml.so.1")
# what every stand-in function returns: cudaErrorInsufficientDriver, the answer the real
# CUDA runtime gives on a machine without a driver (any non-zero status is a failure to
# cuBLAS, cuDNN and NCCL's callers too). The fat-binary registrations that torch's
# static initialisers call at load return a null handle instead.
_NO_DRIVER = 35
_SYM = re.compile(r"^\s*\d+:\s+\S+\s+\d+\s+(\w+)\s+(\w+)\s+\w+\s+(\w+)\s+(\S+)")


def _elf_files(roots: list[str], skip: str = "") -> list[Path]:
    out = []
    for root in roots:
        for dirpath, _dirs, files in os.walk(root):
            if skip and dirpath.startswith(skip):
                continue
            for name in files:
                if ".so" in name or name.endswith(".abi3.so"):
                    path = Path(dirpath) / name
                    if path.is_file() and not path.is_symlink():
                        with path.open("rb") as fh:
                            if fh.read(4) == b"\x7fELF":
                                out.append(path)
    return out


def _readelf(args: list[str], path: Path) -> str:
    return subprocess.run(["readelf", "-W", *args, str(path)], capture_output=True, text=True, check=False).stdout


def _needed(path: Path) -> list[str]:
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", _readelf(["-d"], path))


def _version_files(path: Path) -> dict[str, str]:
    """Version name -> the library file that must define it (the "Version needs" section)."""
    out, current = {}, ""
    for line in _readelf(["-V"], path).splitlines():
        if m := re.search(r"File: (\S+)", line):
            current = m.group(1)
        elif (m := re.search(r"Name: (\S+)", line)) and current:
            out[m.group(1)] = current
    return out


def _symbols(path: Path) -> list[tuple[str, str, str, str]]:
    """(type, bind, section, name[@version]) of each dynamic symbol."""
    return [m.groups() for line in _readelf(["--dyn-syms"], path).splitlines() if (m := _SYM.match(line))]


def _plan(site: str) -> dict[str, dict[str, tuple[str, str]]]:
    """Missing SONAME -> {symbol: (FUNC or OBJECT, version node or "")} it must define."""
    venv_files = _elf_files([site])
    system = [d for d in _SYSTEM_DIRS if os.path.isdir(d)]
    system_files = _elf_files(system, skip=site)
    present = {p.name for p in [*venv_files, *system_files]}
    present |= {p.name for d in system for p in Path(d).rglob("*.so*")}
    defined: set[str] = set()
    wants: list[tuple[list[str], dict[str, str], list[tuple[str, str, str, str]]]] = []
    for path in [*venv_files, *system_files]:
        syms = _symbols(path)
        defined |= {name.split("@")[0] for _t, bind, sec, name in syms if sec != "UND" and bind != "LOCAL"}
        if path in venv_files:
            missing = [n for n in _needed(path) if n not in present and n not in _DRIVER]
            if missing:
                wants.append((missing, _version_files(path), syms))
    plan: dict[str, dict[str, tuple[str, str]]] = defaultdict(dict)
    for missing, versions, syms in wants:
        for kind, bind, sec, name in syms:
            if sec != "UND" or bind == "LOCAL" or not name:
                continue
            base, _, version = name.partition("@")
            version = version.split(" ")[0].lstrip("@")
            shape = "OBJECT" if kind == "OBJECT" else "FUNC"
            if versions.get(version) in missing:
                plan[versions[version]][base] = (shape, version)
            elif not version and base not in defined and bind != "WEAK":
                for soname in missing:
                    plan[soname].setdefault(base, (shape, ""))
        for soname in missing:
            plan.setdefault(soname, {})
    return plan


def _version_script(soname: str, symbols: dict[str, tuple[str, str]]) -> str:
    """One version node per version the venv asks of `soname` (its own name when none),
    each exporting the symbols asked under it; unversioned ones go in the first."""
    nodes: dict[str, list[str]] = defaultdict(list)
    for name, (_shape, version) in sorted(symbols.items()):
        nodes[version].append(name)
    unversioned = nodes.pop("", [])
    names = sorted(nodes) or [soname]
    nodes.setdefault(names[0], []).extend(unversioned)
    text = ""
    for i, node in enumerate(names):
        exported = "".join(f"  {name};\n" for name in nodes.get(node, []))
        text += (
            f"{node} {{\n" + (f" global:\n{exported}" if exported else "") + (" local: *;\n" if i == 0 else "") + "};\n"
        )
    return text


def _write_stub(soname: str, symbols: dict[str, tuple[str, str]], out: Path, work: Path) -> None:
    asm = [".text"]
    for name, (shape, _v) in sorted(symbols.items()):
        if shape == "FUNC":
            ret = 0 if name.startswith("__cuda") else _NO_DRIVER  # registration: a null handle
            asm += [f".globl {name}", f".type {name},@function", f"{name}:", f"  mov ${ret}, %eax", "  ret"]
    asm.append(".data")
    for name, (shape, _v) in sorted(symbols.items()):
        if shape == "OBJECT":
            asm += [f".globl {name}", f".type {name},@object", f".size {name},64", f"{name}:", "  .zero 64"]
    src, obj, vers = work / f"{soname}.s", work / f"{soname}.o", work / f"{soname}.map"
    src.write_text("\n".join(asm) + "\n")
    vers.write_text(_version_script(soname, symbols))
    subprocess.run(["as", str(src), "-o", str(obj)], check=True)
    subprocess.run(
        ["ld", "-shared", "-soname", soname, "--version-script", str(vers), "-o", str(out / soname), str(obj)],
        check=True,
    )


def main() -> None:
    site, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    work = out / ".work"
    work.mkdir(exist_ok=True)
    for soname, symbols in sorted(_plan(site).items()):
        _write_stub(soname, symbols, out, work)
        print(f"stub {soname}: {len(symbols)} symbols")
    for f in work.iterdir():
        f.unlink()
    work.rmdir()


if __name__ == "__main__":
    main()
