#!/usr/bin/env python3
"""Private by default (docs/architecture.md, "Private names"): a module-level name
of src/kiln that no other module uses is `_private`, and a `_private` name is not used
from another package.

    python scripts/privatize.py            the report, exit 0
    python scripts/privatize.py --check    the report; exit 1 when there is anything to change (CI)
    python scripts/privatize.py --write    make the changes (to a fixed point), then report
    python scripts/privatize.py --stats    the counts of module-local public names (-v: the names)

A codemod, meant to be re-run on any checkout rather than merged: a second --write
changes nothing. Standard library only (ast, tokenize), its parts (scripts/privatize_*.py)
loaded with kiln_testkit's script loader; each edit is one identifier at a position the
syntax tree gives, checked against the file's bytes before it is made.

For every module-level name of a module under src/kiln (def, class, assignment,
annotated assignment; also inside a top-level `if`/`try`/`with`):

- rename `name` -> `_name` when no other module uses it. The users are the Python files of
  src/, engine/, testkit/, benchmarks/, scripts/ (this script and its parts left out), noxfile.py and
  the Python scripts of docker-images/; TEXT_FILES (entry points, `python3 -c 'from kiln...'`);
  and the code spans of docs/*.md and README.md (`name`, `module.name`, `name(...)`).
  tests/ is no user: a name only its module and its tests use is private too, and the
  tests follow the rename (`from m import name` and every use of that binding in its
  scope; `m.name`; `monkeypatch.setattr(m, "name", ...)`, `getattr(m, "name")`,
  `mock.patch.object(m, "name")`; `"kiln.a.b.name"`), as tests already reach other
  private names through their module (`layer_checks._fetcher`). In its module, the rename
  covers every use, scope by scope (a parameter or local of the same name is left
  alone), string annotations, the string a TypeVar/NewType is named by, `name` in
  backticks in the module's comments and in its module and function docstrings; in every
  file, comments and docstrings that name it as `module.name`.
- delete `name` when nothing uses it, not even its own module or a test: its whole
  statement, with its decorators and the comment lines right above it.
- publicise `_name` -> `name` when a module of another package imports it or reads it
  through its module (`from kiln.x.y import _name`, `y._name`); and a method `_attr` that
  a module of another package than its class's calls on an object (`box._dump_logs()`),
  renamed wherever `._attr` is read or defined. Inside one package a private name may be
  shared (`_daemon` of kiln.infra.docker.faults).

What may name a name where no reference shows it keeps it public (the rule errs toward
public): the name as a whole string, or `module.name` inside a string, in a file that
imports the module or imports modules by name (importlib) -- a dict key, a subscript or
a comparison is no such string; an attribute `.name` read on an unknown object in a file
that passes the module around as a value (cli.COMMANDS: `module.register`); for the
in-image modules, which are shipped as text and run beside other scripts, any word of
the strings of a file that imports kiln.inimage (`"...\nreport(...)"` appended to a
script) and any word of the docker-images/ scripts.

Never renamed: dunders, names in `__all__`, EXEMPT (privatize_files.py), what the module's
`if __name__ == "__main__":` block reads; classes whose name is data: exceptions
(`type(exc).__name__` is in every error line and `--json` error document), pydantic
models and enums (their names are the `$defs` of `kiln schema`), TypedDicts named in a
JSON Schema of src/kiln/schemas; a name whose rename would collide with a `_name`
already bound where it is renamed; a name a class body both binds and reads. -v lists
each name kept, and why.

After --write, `ruff check --fix --select I001,F401` runs on the files it changed (an
import list re-sorted after a rename; an import only a deleted name used), when ruff is
on PATH.
"""  # shows the `\n` a reader types  # noqa: D301

from __future__ import annotations

import argparse
import ast
import shutil
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from kiln_testkit.scripts import load_script

checkout = load_script("scripts/privatize_files.py")
module_names = load_script("scripts/privatize_modules.py")
cross_refs = load_script("scripts/privatize_references.py")
naming = load_script("scripts/privatize_analysis.py")


# -- the rule the unit tier checks -----------------------------------------------------------
def cross_package_private_imports(files: Iterable[Path], src: Path | None = None) -> list[str]:
    """Each `from kiln.a.b import _name`, or `b._name` through an imported module, in a file
    under `src` (default: src/) that is not in package kiln.a: `path:line: kiln.a.b._name`.
    A private name may be shared inside its package (kiln.infra.docker's `_daemon`), not
    beyond: a name another package needs is public (or lives in that package)."""
    src = src or checkout.SRC
    found = []
    for path in files:
        module = ".".join(path.relative_to(src).with_suffix("").parts).removesuffix(".__init__")
        own = _package(module, src)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        modules: dict[str, str] = {}  # a local name -> the kiln module it is
        taken: list[tuple[int, str, str]] = []  # (line, module, private name)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                base = cross_refs.resolve_relative(path, node.level, node.module, src) if node.level else node.module
                for alias in node.names:
                    if _is_module(f"{base}.{alias.name}", src):
                        modules[alias.asname or alias.name] = f"{base}.{alias.name}"
                    else:
                        taken.append((node.lineno, base or "", alias.name))
            elif isinstance(node, ast.Import):
                modules.update((a.asname, a.name) for a in node.names if a.asname)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
                taken.append((node.lineno, modules[node.value.id], node.attr))
        for line, base, name in sorted(taken):
            private = name.startswith("_") and not name.startswith("__")
            if private and base.split(".")[0] == "kiln" and _is_module(base, src) and _package(base, src) != own:
                found.append(f"{path.relative_to(src).as_posix()}:{line}: {base}.{name}")
    return found


def _is_module(module: str, src: Path) -> bool:
    path = src / module.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _package(module: str, src: Path) -> str:
    """The package a module belongs to (a package is its own)."""
    return module if (src / module.replace(".", "/") / "__init__.py").is_file() else module.rpartition(".")[0]


# -- counts --------------------------------------------------------------------------------
def stats(modules: dict[str, module_names.Module]) -> tuple[dict[str, int], list[str]]:
    """Public module-level names of src/kiln (and of src/kiln/domain) whose word appears in
    no other file (.py under src/ engine/ testkit/ tests/ benchmarks/ scripts/, noxfile.py,
    docs/*.md, README.md): "used only in their own module", counted by a
    word search (grep's way); and those also used nowhere in their own module ("dead")."""
    texts = {
        p: p.read_text(encoding="utf-8")
        for p in checkout.py_files(*checkout.USER_DIRS, *checkout.USER_FILES, *checkout.TEST_DIRS)
        + checkout.image_scripts()
    }
    texts.update({p: p.read_text(encoding="utf-8") for p in sorted((checkout.ROOT / "docs").rglob("*.md"))})
    words_by_file = {p: set(checkout.IDENT.findall(t)) for p, t in texts.items()}
    counts = {
        "public": 0,
        "public_local": 0,
        "domain_public": 0,
        "domain_public_local": 0,
        "dead": 0,
        "public_local_inimage": 0,
    }
    local = []
    for module in modules.values():
        domain = module.name.startswith("kiln.domain")
        for name in module.definitions:
            if name.startswith("_"):
                continue
            counts["public"] += 1
            counts["domain_public"] += domain
            if any(name in words for p, words in words_by_file.items() if p != module.path):
                continue
            counts["public_local"] += 1
            local.append(f"{module.name}:{name}")
            counts["domain_public_local"] += domain
            counts["public_local_inimage"] += module.name.startswith(checkout.INIMAGE)
            if naming.own_uses(module, name)[1] == 0:
                counts["dead"] += 1
    return counts, local


# -- main ----------------------------------------------------------------------------------
def _report(analysis: naming.Analysis, verbose: bool) -> list[str]:
    todo = [f for f in analysis.findings if f.action != "keep"]
    lines = []
    for f in sorted(todo, key=lambda f: (f.inimage, f.action, f.module, f.name)):
        lines.append(("[in-image] " if f.inimage else "") + f.line())
    if verbose:
        lines += [f.line() for f in analysis.findings if f.action == "keep"]
    lines += analysis.problems
    return lines


def write(analysis: naming.Analysis) -> list[Path]:
    edits: list[checkout.Edit] = []
    deletions: dict[Path, list[tuple[int, int]]] = defaultdict(list)
    for f in analysis.findings:
        if f.action in ("rename", "publicise"):
            edits += f.edits
        elif f.action == "delete" and f.deletion:
            deletions[f.deletion[0]].append(f.deletion[1:])
    changed = set(checkout.apply_edits(edits))
    for path, spans in deletions.items():
        lines = path.read_bytes().splitlines(keepends=True)
        for first, last in sorted(spans, reverse=True):
            del lines[first - 1 : last]
            # the blank lines around where it was: two at most (none at the end)
            start = end = first - 1
            while start > 0 and not lines[start - 1].strip():
                start -= 1
            while end < len(lines) and not lines[end].strip():
                end += 1
            lines[start:end] = [b"\n"] * (min(end - start, 2) if end < len(lines) else 0)
        path.write_bytes(b"".join(lines))
        changed.add(path)
    return sorted(changed)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 when a name is to rename, delete or publicise")
    mode.add_argument("--write", action="store_true", help="make the changes (to a fixed point), then report")
    mode.add_argument("--stats", action="store_true", help="print the counts of module-local public names")
    parser.add_argument("-v", "--verbose", action="store_true", help="also the names kept public, and why")
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(__file__).resolve().parent.parent,
        help="the checkout (default: this script's)",
    )
    args = parser.parse_args(argv)
    checkout.set_root(args.root)
    if args.stats:
        counts, local = stats(module_names.load_modules())
        for key, value in counts.items():
            print(f"{key}: {value}")
        if args.verbose:
            print("\n".join(f"  public, only its module names it: {name}" for name in local))
        return 0
    analysis = naming.analyse()
    if not args.write:
        lines = _report(analysis, args.verbose)
        print("\n".join(lines), end="\n" if lines else "")
        todo = sum(1 for f in analysis.findings if f.action != "keep") + len(analysis.problems)
        if args.check and todo:
            print(f"privatize: {todo} names to change: `python scripts/privatize.py --write`", file=sys.stderr)
            return 1
        return 0
    changed: set[Path] = set()
    for _ in range(5):  # a rename can make another (a deleted name's helper is dead next): to a fixed point
        if not any(f.action != "keep" for f in analysis.findings):
            break
        for line in _report(analysis, False):
            print(line)
        changed.update(write(analysis))
        analysis = naming.analyse()
    ruff = shutil.which("ruff")
    if changed and ruff:  # import lists re-sorted, imports only a deleted name used removed
        subprocess.run(
            [ruff, "check", "--quiet", "--fix", "--select", "I001,F401", *map(str, sorted(changed))],
            cwd=checkout.ROOT,
            check=False,
        )
    print(
        f"privatize: changed {len(changed)} files"
        + ("" if ruff or not changed else " (ruff is not on PATH: run `ruff check --fix --select I001,F401` on them)")
    )
    left = _report(analysis, False)
    for line in left:
        print(f"privatize: left: {line}")
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
