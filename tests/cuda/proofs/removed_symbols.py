#!/usr/bin/env python3
"""Which ELF files would call into a library that is reached by symbol, not by DT_NEEDED.

cuDNN 9's libcudnn.so.9 is a shim: it exports every cuDNN entry point and dlopens the
sub-library that implements one the first time that one is called. A removed sub-library
is therefore safe only if nothing calls the entry points it implements; the ELF walk
(elf_needed.py) cannot see that, since nothing lists it in DT_NEEDED. Runs inside an image
(stdlib only), in two steps that the test joins:

  exports LIB...   in the plain image: the dynamic symbols each library defines
                   (LIB relative to site-packages); the removed library must exist there;
  users NAME...    in kiln's image: every x86-64 ELF file under / whose dynamic symbol
                   table imports (undefined) one of NAMEs, and whether LIBs are present.

usage: removed_symbols.py [--json] exports LIB... | users [--absent LIB]... NAME...
"""

from __future__ import annotations

import json
import os
import struct
import sys
import sysconfig

# the proofs travel into the image as one folder, run with it on sys.path
from elf_needed import native_elf_header, regular_files

SHT_DYNSYM = 11


def dynamic_symbols(path: str) -> tuple[set[str], set[str]] | None:
    """(defined, undefined) names of an ELF64 file's .dynsym (this machine's); None if not one."""
    try:
        with open(path, "rb") as f:
            head = native_elf_header(f)
            if head is None:
                return None
            (shoff,) = struct.unpack_from("<Q", head, 0x28)
            shentsize, shnum = struct.unpack_from("<HH", head, 0x3A)
            if not shoff or not shnum:
                return None
            f.seek(shoff)
            raw = f.read(shentsize * shnum)
            shdrs = [struct.unpack_from("<IIQQQQIIQQ", raw, i * shentsize) for i in range(shnum)]
            dynsym = next((s for s in shdrs if s[1] == SHT_DYNSYM), None)
            if dynsym is None:
                return set(), set()
            strtab = shdrs[dynsym[6]]
            f.seek(strtab[4])
            names = f.read(strtab[5])
            f.seek(dynsym[4])
            table = f.read(dynsym[5])
    except (OSError, struct.error, IndexError):
        return None
    defined, undefined = set(), set()
    for off in range(24, len(table) - 23, 24):  # entry 0 is the null symbol
        st_name, _, _, st_shndx = struct.unpack_from("<IBBH", table, off)
        name = names[st_name : names.find(b"\0", st_name)].decode(errors="replace")
        if name:
            (undefined if st_shndx == 0 else defined).add(name)
    return defined, undefined


def exports(site: str, libs: list[str]) -> dict:
    out: dict = {"exports": {}, "missing": []}
    for lib in libs:
        found = dynamic_symbols(os.path.join(site, lib))
        if found is None:
            out["missing"].append(lib)
        else:
            out["exports"][lib] = sorted(found[0])
    return out


def users(root: str, names: set[str]) -> dict[str, list[str]]:
    """{file: the NAMEs it imports} over every regular file under ROOT."""
    out: dict[str, list[str]] = {}
    for _, path in regular_files(root, ["/"]):
        found = dynamic_symbols(path)
        if found and found[1] & names:
            out[path] = sorted(found[1] & names)
    return out


def main(argv: list[str]) -> int:
    as_json = "--json" in argv
    argv = [a for a in argv if a != "--json"]
    site = sysconfig.get_paths()["purelib"]
    if argv[:1] == ["exports"]:
        result = exports(site, argv[1:])
        bad = bool(result["missing"])
    elif argv[:1] == ["users"]:
        rest, absent = argv[1:], []
        while rest[:1] == ["--absent"]:
            absent.append(rest[1])
            rest = rest[2:]
        result = {
            "users": users("/", set(rest)),
            "names": len(set(rest)),
            "present": [lib for lib in absent if os.path.exists(os.path.join(site, lib))],
        }
        bad = bool(result["users"] or result["present"])
    else:
        print(__doc__)
        return 2
    print("KILN-PROOF " + json.dumps(result) if as_json else json.dumps(result, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
