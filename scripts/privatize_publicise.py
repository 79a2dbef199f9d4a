"""privatize's reasons to keep a name public (a test binds it, a string or an unknown object
may name it) and its publicising of `_name`s that another package uses, attributes included."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

from kiln_testkit.scripts import load_script

checkout = load_script("scripts/privatize_files.py")
scoping = load_script("scripts/privatize_scopes.py")
module_names = load_script("scripts/privatize_modules.py")
cross_refs = load_script("scripts/privatize_references.py")
naming = load_script("scripts/privatize_analysis.py")


def main_block_names(tree: ast.Module) -> set[str]:
    """The names `if __name__ == "__main__":` reads (a script's entry point)."""
    for stmt in tree.body:
        if (
            isinstance(stmt, ast.If)
            and isinstance(stmt.test, ast.Compare)
            and isinstance(stmt.test.left, ast.Name)
            and stmt.test.left.id == "__name__"
        ):
            return {n.id for s in stmt.body for n in ast.walk(s) if isinstance(n, ast.Name)}
    return set()


def is_test_file(path: Path) -> bool:
    return any(path.is_relative_to(checkout.ROOT / d) for d in checkout.TEST_DIRS)


def binds_name(
    path: Path, name: str, modules: dict[str, module_names.Module], scans: list[cross_refs.FileScan]
) -> bool:
    for module in modules.values():
        if module.path == path:
            return name in module.identifiers
    for scan in scans:
        if scan.path == path and scan.source is not None:
            return name in module_names.identifiers_of(scan.source.tree)
    return False


def loose_reasons(
    module: module_names.Module,
    name: str,
    scans: list[cross_refs.FileScan],
    own_of: dict[Path, str],
    escaped: dict[str, set[Path]],
    docs: list[tuple[str, ...]],
    inimage: bool,
) -> list[str]:
    """Why `name` may be used where no reference shows it (see the docstring)."""
    why: list[str] = []
    dotted = module.name.split(".")
    for chain in docs:
        for i, part in enumerate(chain):
            prefix = list(chain[:i])
            if part == name and (not prefix or dotted[-len(prefix) :] == prefix):
                why.append(f"`{'.'.join(chain)}` in a Markdown document")
    for scan in scans:
        if own_of.get(scan.path) == module.name:
            continue
        if name in scan.strings and (module.name in scan.imported or scan.dynamic):
            why.append(f"{checkout.rel(scan.path)} (a string)")
        if (dotted[-1], name) in scan.dotted_strings or any(
            (alias, name) in scan.dotted_strings for alias, m in scan.aliases.items() if m == module.name
        ):
            why.append(f"{checkout.rel(scan.path)} (`.{name}` in a string)")
        if scan.path in escaped.get(module.name, ()) and name in scan.unknown_attrs:
            why.append(f"{checkout.rel(scan.path)} (.{name}: the module is passed around there)")
        if (
            inimage
            and name in scan.string_words
            and (scan.imported & {checkout.INIMAGE, module.name} or scan.path.is_relative_to(checkout.IMAGE_SCRIPTS))
            and not scan.is_test
        ):
            why.append(f"{checkout.rel(scan.path)} (a word in its strings; in-image module)")
    return why


def test_binding_edits(
    ref: cross_refs.Ref, scans: list[cross_refs.FileScan], name: str, new: str
) -> list[checkout.Edit]:
    """`from m import name` (no `as`) in a test: every use of the binding it makes, in the
    scope it makes it in (a module's, or a test function's)."""
    if ref.how != "from-import":
        return []
    scan = next(s for s in scans if s.path == ref.path)
    if scan.source is None:
        return []
    walker = scoping.ScopeWalker(scan.source.tree)
    edit = ref.edits[0]
    where = [
        scope
        for alias, scope in walker.imports
        if (alias.lineno, alias.col_offset) == (edit.line, edit.col) and alias.asname is None
    ]
    if not where:
        return []
    out = []
    for node, scope in walker.names:
        if node.id == name and walker.resolve(name, scope) is where[0]:
            out.append(checkout.Edit(scan.path, node.lineno, node.col_offset, name, new))
    for define, scope in walker.defs:
        if define.name == name and walker.resolve(name, scope) is where[0]:
            raise SystemExit(f"privatize: {checkout.rel(scan.path)} imports {name} and defines it too")
    return out


def publicise_edits(
    module: module_names.Module,
    name: str,
    found: list[cross_refs.Ref],
    modules: dict[str, module_names.Module],
    scans: list[cross_refs.FileScan],
    own_of: dict[Path, str],
) -> list[naming.Finding]:
    """A `_name` that a module of another package uses: made public."""
    outside = [
        r
        for r in found
        if not is_test_file(r.path) and (r.path not in own_of or modules[own_of[r.path]].package != module.package)
    ]
    if not outside:
        return []
    public = name.lstrip("_")
    users = sorted({checkout.rel(r.path) for r in outside})
    if public in module.definitions or any(binds_name(r.path, public, modules, scans) for r in found):
        return [
            naming.Finding(
                module.name, name, "keep", f"used from {', '.join(users)}, but {public} exists: move it by hand"
            )
        ]
    edits = [
        checkout.Edit(e.path, e.line, e.col, name, public)
        for e, _ in ((e, 0) for e in naming.own_uses(module, name)[0])
    ]
    for ref in found:
        edits += [checkout.Edit(e.path, e.line, e.col, e.old, public) for e in ref.edits]
        edits += test_binding_edits(ref, scans, name, public)
    return [
        naming.Finding(
            module.name, name, "publicise", f"private, but used from another package ({', '.join(users)})", edits=edits
        )
    ]


def private_attributes(
    modules: dict[str, module_names.Module], scans: list[cross_refs.FileScan], own_of: dict[Path, str]
) -> list[naming.Finding]:
    """`obj._attr` read in a module of another package than the class that defines `_attr`
    (a method, or `self._attr = ...`): made public everywhere it is read or defined."""
    defined: dict[str, set[str]] = defaultdict(set)  # attr -> packages of the classes defining it
    for module in modules.values():
        for node in ast.walk(module.source.tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if (
                        isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                        and item.name.startswith("_")
                        and not item.name.startswith("__")
                    ):
                        defined[item.name].add(module.package)
    findings = []
    for attr, packages in sorted(defined.items()):
        readers = sorted(
            {
                (modules[own_of[s.path]].package, checkout.rel(s.path))
                for s in scans
                if s.path in own_of
                for a, _ in s.private_attrs
                if a == attr
            }
        )
        foreign = [path for package, path in readers if package not in packages]
        if not foreign:
            continue
        public = attr.lstrip("_")
        edits: list[checkout.Edit] = []
        clash = []
        for scan in scans:
            if scan.source is None:
                continue
            if public in module_names.identifiers_of(scan.source.tree) and attr in module_names.identifiers_of(
                scan.source.tree
            ):
                clash.append(checkout.rel(scan.path))
            for node in ast.walk(scan.source.tree):
                if isinstance(node, ast.Attribute) and node.attr == attr:
                    col = (node.end_col_offset or 0) - len(attr.encode())
                    edits.append(checkout.Edit(scan.path, node.end_lineno or node.lineno, col, attr, public))
                elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == attr:
                    m = re.compile(rb"(?:async\s+)?def\s+(" + re.escape(attr.encode()) + rb")\b").match(
                        scan.source.lines[node.lineno - 1], node.col_offset
                    )
                    if m:
                        edits.append(checkout.Edit(scan.path, node.lineno, m.start(1), attr, public))
        why = f"a private method read from another package ({', '.join(foreign)})"
        if clash:
            findings.append(
                naming.Finding(
                    "(attribute)", attr, "keep", f"{why}, but {public} exists in {', '.join(clash)}: by hand"
                )
            )
        else:
            findings.append(naming.Finding("(attribute)", attr, "publicise", why, edits=edits))
    return findings
