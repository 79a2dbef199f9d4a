"""Strip the static symbol tables (.symtab/.strtab) and debug sections of the x86-64 ELF
files under a tree, keeping a stripped file only if the dynamic loader would map exactly
the same bytes from it.

Usage: python strip-symbols.py TREE   (runs in engine-cuda's builder stage; stdlib only)

Only debuggers, profilers and crash symbolizers read .symtab, .strtab and .debug_*; the
loader, dlopen/dlsym and the CUDA runtime read the program headers, the segments they map
and the dynamic symbol table (.dynsym, inside a mapped segment). So a stripped copy is
kept only when its program headers are the same and every segment's file bytes are the
same, the ELF header compared without its section-header fields. That also covers files
that patchelf rewrote (torch's libraries: a PT_LOAD segment after the section headers),
where a binutils rewrite could have moved mapped bytes: such a copy is refused, not kept.
Binaries for other machines (cross-compilation stubs) are left alone.
"""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys
import tempfile
from typing import BinaryIO

# each ELF machine's own strip (Debian's binutils-<arch>-linux-gnu): a cross-placed venv
# (aarch64 files on an x86-64 builder) is stripped by the cross strip, a native one by the
# same binary `strip` names; files of any other machine are left alone
STRIP_BY_MACHINE = {62: "x86_64-linux-gnu-strip", 183: "aarch64-linux-gnu-strip"}
STRIPPABLE = (".symtab", ".strtab")
# e_shoff (0x28, 8 bytes), e_shentsize, e_shnum, e_shstrndx (0x3A, 3 x 2 bytes): the only
# header fields strip changes; the loader never reads them.
SECTION_FIELDS = ((0x28, 8), (0x3A, 6))


def read_elf(path: str) -> tuple[list[tuple[int, ...]], list[str]] | None:
    """(program headers, section names) of a little-endian ELF64 file of a machine in
    STRIP_BY_MACHINE, or None."""
    with open(path, "rb") as f:
        head = f.read(64)
        if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            return None
        if elf_machine(head) not in STRIP_BY_MACHINE:
            return None
        phoff, shoff = struct.unpack_from("<QQ", head, 0x20)
        phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from("<HHHHH", head, 0x36)
        f.seek(phoff)
        raw = f.read(phentsize * phnum)
        phdrs = [struct.unpack_from("<IIQQQQQQ", raw, i * phentsize) for i in range(phnum)]
        names: list[str] = []
        if shoff and shnum and shstrndx < shnum:
            f.seek(shoff)
            raw = f.read(shentsize * shnum)
            shdrs = [struct.unpack_from("<IIQQQQIIQQ", raw, i * shentsize) for i in range(shnum)]
            f.seek(shdrs[shstrndx][4])
            table = f.read(shdrs[shstrndx][5])
            names = [table[s[0] : table.index(b"\0", s[0])].decode(errors="replace") for s in shdrs]
        return phdrs, names


def elf_machine(head: bytes) -> int:
    """e_machine of an ELF header (62: x86-64, 183: AArch64)."""
    machine: int = struct.unpack_from("<H", head, 0x12)[0]
    return machine


def strip_tool(path: str) -> str:
    with open(path, "rb") as f:
        return STRIP_BY_MACHINE[elf_machine(f.read(64))]


def loaded_image(path: str) -> tuple[object, ...]:
    """What the loader sees: the ELF header less its section fields, every program header
    (type, flags, address, sizes, alignment) and a hash of every segment's file bytes."""
    info = read_elf(path)
    if info is None:
        raise ValueError(f"{path}: not an x86-64 ELF64 file")
    phdrs, _ = info
    with open(path, "rb") as f:
        head = f.read(64)
        phoff, shoff = struct.unpack_from("<QQ", head, 0x20)
        phentsize, _, shentsize, shnum = struct.unpack_from("<HHHH", head, 0x36)
        segments = []
        for p_type, p_flags, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_align in phdrs:
            f.seek(p_offset)
            data = bytearray(f.read(p_filesz))
            # patchelf's page rounding can map part of the section header table; nothing
            # reads it from memory, and rewriting it is the point
            lo, hi = max(shoff, p_offset), min(shoff + shentsize * shnum, p_offset + p_filesz)
            if lo < hi:
                data[lo - p_offset : hi - p_offset] = bytes(hi - lo)
            if p_offset == 0:
                # The first segment maps the ELF header and the program headers: mask the
                # fields a rewrite may change and the loader does not use once mapped.
                for offset, size in SECTION_FIELDS:
                    data[offset : offset + size] = bytes(size)
                for i in range(len(phdrs)):
                    at = phoff + i * phentsize + 8  # p_offset: a file position, not mapped memory
                    data[at : at + 8] = bytes(8)
            segments.append(
                (p_type, p_flags, p_vaddr, p_paddr, p_filesz, p_memsz, p_align, hashlib.sha256(data).hexdigest())
            )
    return tuple(segments)


def cut_symbol_tables(path: str, out: str) -> str | None:
    """Write PATH less the bytes of .symtab and .strtab to OUT; None if done, else why not.

    For files binutils cannot rewrite without moving mapped bytes (patchelf's layout):
    the two tables are cut out by a multiple of the largest alignment of what follows, so
    every later segment keeps its offset modulo its alignment; offsets past the cut shift
    down, and the two sections become SHT_NULL entries."""
    with open(path, "rb") as f:
        head = bytearray(f.read(64))
        phoff, shoff = struct.unpack_from("<QQ", head, 0x20)
        phentsize, phnum, shentsize, shnum, _shstrndx = struct.unpack_from("<HHHHH", head, 0x36)
        f.seek(phoff)
        ph = bytearray(f.read(phentsize * phnum))
        f.seek(shoff)
        sh = bytearray(f.read(shentsize * shnum))
    size = os.path.getsize(path)
    shdrs = [list(struct.unpack_from("<IIQQQQIIQQ", sh, i * shentsize)) for i in range(shnum)]
    phdrs = [list(struct.unpack_from("<IIQQQQQQ", ph, i * phentsize)) for i in range(phnum)]
    names = read_elf(path)[1]  # type: ignore[index]  # strip_one read this file as ELF first
    cut_ix = [i for i, n in enumerate(names) if n in STRIPPABLE]
    if sorted(names[i] for i in cut_ix) != sorted(STRIPPABLE):
        return "no single .symtab/.strtab pair"
    for i in cut_ix:
        if shdrs[i][2] & 0x2 or shdrs[i][1] == 8:  # SHF_ALLOC or NOBITS: part of the image
            return f"{names[i]} is allocated"
    for i, s in enumerate(shdrs):
        if i not in cut_ix and (s[6] in cut_ix or (s[1] in (4, 9) and s[7] in cut_ix)):
            return f"{names[i]} refers to a symbol table being removed"
    a = min(shdrs[i][4] for i in cut_ix)
    b = max(shdrs[i][4] + shdrs[i][5] for i in cut_ix)
    for i, s in enumerate(shdrs):
        if i not in cut_ix and s[1] != 8 and s[5] and s[4] < b and s[4] + s[5] > a:
            return f"{names[i]} lies between the symbol tables"
    if (shoff < b and shoff + shentsize * shnum > a) or (phoff < b and phoff + phentsize * phnum > a):
        return "a header table lies between the symbol tables"
    for p in phdrs:
        if p[5] and p[2] < b and p[2] + p[5] > a:
            return "a segment maps the symbol tables"
    align = max([p[7] for p in phdrs if p[2] >= b] + [s[8] for s in shdrs if s[4] >= b] + [shentsize], default=1)
    cut = (b - a) // align * align
    if cut == 0:
        return "too small to cut"
    end = a + cut

    def moved(offset: int) -> int:
        return offset - cut if offset >= end else offset

    for p in phdrs:
        p[2] = moved(p[2])
    for i, s in enumerate(shdrs):
        if i in cut_ix:
            shdrs[i] = [s[0], 0, 0, 0, 0, 0, 0, 0, 0, 0]
        else:
            s[4] = moved(s[4])
    struct.pack_into("<QQ", head, 0x20, moved(phoff), moved(shoff))
    for i, p in enumerate(phdrs):
        struct.pack_into("<IIQQQQQQ", ph, i * phentsize, *p)
    for i, s in enumerate(shdrs):
        struct.pack_into("<IIQQQQIIQQ", sh, i * shentsize, *s)
    with open(path, "rb") as src, open(out, "wb") as dst:
        _copy(src, dst, 0, a)
        _copy(src, dst, end, size)
        for offset, table in ((0, head), (moved(phoff), ph), (moved(shoff), sh)):
            dst.seek(offset)
            dst.write(table)
    return None


def _copy(src: BinaryIO, dst: BinaryIO, start: int, stop: int) -> None:
    src.seek(start)
    left = stop - start
    while left > 0:
        chunk = src.read(min(left, 1 << 24))
        dst.write(chunk)
        left -= len(chunk)


def readable(path: str) -> bool:
    """readelf parses headers, segments, sections and dynamic symbols without a complaint."""
    done = subprocess.run(
        ["readelf", "-W", "-h", "-l", "-S", "-d", "--dyn-syms", path], capture_output=True, text=True, check=False
    )
    return done.returncode == 0 and not done.stderr.strip()


def strip_one(path: str) -> int:
    """Bytes saved (0 if the file was left as it was)."""
    info = read_elf(path)
    if info is None:
        return 0
    _, names = info
    if not any(n in STRIPPABLE or n.startswith(".debug") for n in names):
        return 0
    before = os.path.getsize(path)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".strip-")
    os.close(fd)
    try:
        done = subprocess.run(
            [strip_tool(path), "--strip-unneeded", "-o", tmp, path], capture_output=True, text=True, check=False
        )
        same = done.returncode == 0 and loaded_image(tmp) == loaded_image(path) and readable(tmp)
        if not same:
            why = cut_symbol_tables(path, tmp)
            if why is None and not (loaded_image(tmp) == loaded_image(path) and readable(tmp)):
                why = "the cut would change what the loader maps"
            if why:
                print(f"strip-symbols: kept {path}: strip would change what the loader maps; {why}")
                return 0
        os.chmod(tmp, os.stat(path).st_mode & 0o7777)
        os.replace(tmp, path)
        return before - os.path.getsize(path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def main(tree: str) -> int:
    saved = files = 0
    for root, _, names in os.walk(tree):
        for name in names:
            path = os.path.join(root, name)
            if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) < 1024:
                continue
            n = strip_one(path)
            if n:
                saved += n
                files += 1
    print(f"strip-symbols: {files} files stripped, {saved / 1e6:.0f} MB saved; mapped bytes unchanged in each")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
