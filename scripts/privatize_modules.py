"""privatize's modules: each module of src/kiln with its module-level definitions, the names
its `__all__` lists and the identifiers it uses, and which classes are data."""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kiln_testkit.scripts import load_script

checkout = load_script("scripts/privatize_files.py")
scoping = load_script("scripts/privatize_scopes.py")


# -- a module's own names --------------------------------------------------------------------
@dataclass
class Definition:
    module: str
    name: str
    kind: str  # function, class, assignment
    stmt: ast.stmt
    data_class: str | None = None  # why a class's name is data (TypedDict, exception, ...)


@dataclass
class Module:
    name: str
    package: str
    source: checkout.Source
    walker: scoping.ScopeWalker
    definitions: dict[str, Definition]
    all_names: set[str]
    identifiers: set[str]  # every identifier in the file (names, attributes, args)

    @property
    def path(self) -> Path:
        return self.source.path


def _top_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Module-level statements, also inside a top-level if/try/with (not in a def or class)."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If | ast.Try | ast.With):
            nested = [*stmt.body, *stmt.orelse] if isinstance(stmt, ast.If) else list(stmt.body)
            if isinstance(stmt, ast.Try):
                nested += [*stmt.orelse, *stmt.finalbody] + [s for h in stmt.handlers for s in h.body]
            yield from _top_statements(nested)


def _target_names(target: ast.expr) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, ast.Tuple | ast.List):
        for elt in target.elts:
            yield from _target_names(elt)
    elif isinstance(target, ast.Starred):
        yield from _target_names(target.value)


def last_part(node: ast.expr) -> str:
    if isinstance(node, ast.Subscript):
        return last_part(node.value)
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _definitions(module: str, tree: ast.Module) -> dict[str, Definition]:
    found: dict[str, Definition] = {}
    for stmt in _top_statements(tree.body):
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            found.setdefault(stmt.name, Definition(module, stmt.name, "function", stmt))
        elif isinstance(stmt, ast.ClassDef):
            found.setdefault(stmt.name, Definition(module, stmt.name, "class", stmt))
        elif isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                for name in _target_names(target):
                    found.setdefault(name, Definition(module, name, "assignment", stmt))
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            found.setdefault(stmt.target.id, Definition(module, stmt.target.id, "assignment", stmt))
    return found


def _all_names(tree: ast.Module) -> set[str]:
    for stmt in tree.body:
        targets = (
            stmt.targets
            if isinstance(stmt, ast.Assign)
            else [stmt.target]
            if isinstance(stmt, ast.AnnAssign | ast.AugAssign)
            else []
        )
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            value = getattr(stmt, "value", None)
            if isinstance(value, ast.List | ast.Tuple):
                return {e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def identifiers_of(tree: ast.AST) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(node.name)
        elif isinstance(node, ast.alias):
            out.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.keyword) and node.arg:
            out.add(node.arg)
    return out


def load_modules() -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for path in checkout.py_files("src/kiln"):
        source = checkout.Source.read(path)
        if source is None:
            continue
        name = checkout.module_name(path)
        modules[name] = Module(
            name,
            checkout.package_of(name, path),
            source,
            scoping.ScopeWalker(source.tree),
            _definitions(name, source.tree),
            _all_names(source.tree),
            identifiers_of(source.tree),
        )
    _mark_data_classes(modules)
    return modules


def _mark_data_classes(modules: dict[str, Module]) -> None:
    """Exceptions, TypedDicts, pydantic models and enums, through their bases (by name,
    across modules, until nothing changes)."""
    classes = {(m.name, d.name): d for m in modules.values() for d in m.definitions.values() if d.kind == "class"}
    by_name: dict[str, list[Definition]] = defaultdict(list)
    for d in classes.values():
        by_name[d.name].append(d)
    changed = True
    while changed:
        changed = False
        for d in classes.values():
            if d.data_class:
                continue
            assert isinstance(d.stmt, ast.ClassDef)
            for base in d.stmt.bases:
                last = last_part(base)
                why = None
                if last in checkout.DATA_BASES:
                    why = last
                elif checkout.EXCEPTION_BASE.search(last) or last in ("Exception", "BaseException"):
                    why = "an exception"
                elif any(other.data_class for other in by_name.get(last, [])):
                    why = next(o.data_class for o in by_name[last] if o.data_class)
                if why:
                    d.data_class = why
                    changed = True
                    break
