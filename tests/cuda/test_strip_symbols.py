"""docker-images/engine-cuda/strip-symbols.py keeps a stripped library only if the loader
maps the same bytes from it, for binutils' strip and for its own cut of the symbol tables
(the patchelf'd torch libraries); a changed mapped byte is caught (CI: needs gcc)."""

from __future__ import annotations

import ctypes
import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "docker-images" / "engine-cuda" / "strip-symbols.py"
pytestmark = pytest.mark.skipif(
    shutil.which("gcc") is None or shutil.which("strip") is None, reason="needs gcc and binutils"
)


def _module():
    spec = importlib.util.spec_from_file_location("strip_symbols", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def lib(tmp_path: Path) -> Path:
    """A shared library with a large static symbol table (3000 local functions)."""
    src = tmp_path / "big.c"
    body = [f"static int local_{i}(int x) {{ return x + {i}; }}" for i in range(3000)]
    calls = " + ".join(f"local_{i}(x)" for i in range(3000))
    src.write_text("\n".join(body) + f"\nint kiln_sum(int x) {{ return {calls}; }}\n")
    out = tmp_path / "libbig.so"
    subprocess.run(["gcc", "-O0", "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
    return out


def _call(path: Path) -> int:
    return ctypes.CDLL(str(path)).kiln_sum(1)


def test_strip_keeps_what_the_loader_maps_and_the_library_still_works(lib: Path, tmp_path: Path):
    ss = _module()
    expected = _call(lib)
    image = ss.loaded_image(str(lib))
    copy = tmp_path / "copy" / "libbig.so"
    copy.parent.mkdir()
    shutil.copy2(lib, copy)
    saved = ss.strip_one(str(copy))
    assert saved > 50_000 and copy.stat().st_size == lib.stat().st_size - saved
    assert ".symtab" not in ss.read_elf(str(copy))[1]
    assert ss.loaded_image(str(copy)) == image
    assert _call(copy) == expected
    assert ss.strip_one(str(copy)) == 0  # nothing left to strip


def test_the_cut_removes_the_symbol_tables_and_keeps_the_mapped_bytes(lib: Path, tmp_path: Path):
    ss = _module()
    out = tmp_path / "cut" / "libbig.so"
    out.parent.mkdir()
    assert ss.cut_symbol_tables(str(lib), str(out)) is None
    assert out.stat().st_size < lib.stat().st_size - 4096
    assert ss.loaded_image(str(out)) == ss.loaded_image(str(lib))
    assert ss.readable(str(out))
    assert _call(out) == _call(lib)


def test_a_changed_mapped_byte_is_caught(lib: Path, tmp_path: Path):
    ss = _module()
    changed = tmp_path / "changed.so"
    data = bytearray(lib.read_bytes())
    data[0x1000 + 16] ^= 0xFF  # inside the first segment's mapped bytes, past the headers
    changed.write_bytes(bytes(data))
    assert ss.loaded_image(str(changed)) != ss.loaded_image(str(lib))


def _with_machine(lib: Path, dest: Path, machine: int) -> Path:
    data = bytearray(lib.read_bytes())
    data[0x12:0x14] = machine.to_bytes(2, "little")
    dest.write_bytes(bytes(data))
    return dest


def test_each_file_gets_its_own_machines_strip_and_other_machines_are_left_alone(lib: Path, tmp_path: Path):
    """A cross-placed arm64 venv is stripped on x86-64: each file by its ELF machine's
    strip (aarch64-linux-gnu-strip for AArch64), never by the host's `strip`, which would
    refuse it; a machine with no strip named is not touched."""
    ss = _module()
    assert ss.strip_tool(str(lib)) == "x86_64-linux-gnu-strip"
    assert ss.strip_tool(str(_with_machine(lib, tmp_path / "a64.so", 183))) == "aarch64-linux-gnu-strip"
    arm32 = _with_machine(lib, tmp_path / "arm32.so", 40)
    before = arm32.read_bytes()
    assert ss.read_elf(str(arm32)) is None and ss.strip_one(str(arm32)) == 0
    assert arm32.read_bytes() == before
