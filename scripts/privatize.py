#!/usr/bin/env python3
"""Private by default (docs/architecture.md, "Private names"): a module-level name
of src/kiln that no other module uses is `_private`, and a `_private` name is not used
from another package.

    python scripts/privatize.py            the report, exit 0
    python scripts/privatize.py --check    the report; exit 1 when there is anything to change (CI)
    python scripts/privatize.py --write    make the changes (to a fixed point), then report
    python scripts/privatize.py --stats    the counts of module-local public names (-v: the names)

A codemod, meant to be re-run on any checkout rather than merged: a second --write
changes nothing. Standard library only (ast, tokenize); each edit is one identifier at a
position the syntax tree gives, checked against the file's bytes before it is made.

For every module-level name of a module under src/kiln (def, class, assignment,
annotated assignment; also inside a top-level `if`/`try`/`with`):

- rename `name` -> `_name` when no other module uses it. The users are the Python files of
  src/, engine/, testkit/, benchmarks/, scripts/ (this script left out), noxfile.py and
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

Never renamed: dunders, names in `__all__`, EXEMPT below, what the module's
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
import io
import re
import shutil
import subprocess
import sys
import tokenize
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # --root: another checkout (the tests' samples)
SRC = ROOT / "src"
PACKAGE = SRC / "kiln"
# Python files whose references keep a name public (besides src/kiln itself)
USER_DIRS = ("src", "engine", "testkit", "benchmarks", "scripts")
USER_FILES = ("noxfile.py",)
IMAGE_SCRIPTS = ROOT / "docker-images"  # Python scripts shipped into images (no .py suffix)
# other text that can name a kiln name: `python3 -c 'from kiln.a.b import name'`, entry points
TEXT_FILES = ("pyproject.toml", "Makefile", "scripts/*.sh", ".ci/*", "docker-images/**/Dockerfile")
TEST_DIRS = ("tests",)
DOCS = ("docs", "README.md")
# the in-image modules by the file names they are shipped under (kiln.domain.images.engine_image)
SHIPPED_AS = {
    "kiln_patching": "kiln.inimage.patch_applier",
    "kiln_patchtree": "kiln.inimage.patch_tree",
    "kiln_patchformat": "kiln.inimage.patch_format",
    "kiln_hfcache": "kiln.inimage.hf_cache",
}
INIMAGE = "kiln.inimage"
# Names that stay public though no other module uses them: "module:name" -> why.
EXEMPT: dict[str, str] = {}
# classes whose names are data (see the docstring): their bases, by the last dotted part
DATA_BASES = ("TypedDict", "BaseModel", "RootModel", "Enum", "StrEnum", "IntEnum", "Flag", "IntFlag")
EXCEPTION_BASE = re.compile(r"(Error|Exception|Warning|Exit|Interrupt)$")
# decorators that register nothing: a dead definition under one of them may be deleted
PURE_DECORATORS = {"dataclass", "cache", "lru_cache", "total_ordering", "final", "runtime_checkable"}
# callables whose first argument names the module-level binding they are assigned to
SELF_NAMING = {"TypeVar", "NewType", "ParamSpec", "TypeVarTuple", "NamedTuple", "TypedDict"}
# callables that read or write an attribute named by a string: (object, "name", ...)
ATTR_CALLS = {"setattr", "getattr", "hasattr", "delattr"}
IDENT = re.compile(r"[A-Za-z_]\w*")


# -- files -------------------------------------------------------------------------------
def _set_root(root: Path) -> None:
    global ROOT, SRC, PACKAGE, IMAGE_SCRIPTS
    ROOT = root.resolve()
    SRC = ROOT / "src"
    PACKAGE = SRC / "kiln"
    IMAGE_SCRIPTS = ROOT / "docker-images"
    _PROSE.clear()


def _py_files(*dirs: str) -> list[Path]:
    out: list[Path] = []
    for d in dirs:
        base = ROOT / d
        if base.is_file():
            out.append(base)
        elif base.is_dir():
            out += [p for p in base.rglob("*.py") if "__pycache__" not in p.parts and ".venv" not in p.parts]
    return sorted(set(out))


def _image_scripts() -> list[Path]:
    """The Python scripts under docker-images/ (by suffix or by their #! line)."""
    out = []
    for path in sorted(IMAGE_SCRIPTS.rglob("*")) if IMAGE_SCRIPTS.is_dir() else []:
        if not path.is_file() or path.suffix not in ("", ".py"):
            continue
        try:
            head = path.read_bytes()[:100]
        except OSError:
            continue
        if path.suffix == ".py" or (head.startswith(b"#!") and b"python" in head.split(b"\n")[0]):
            out.append(path)
    return out


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


# -- edits ---------------------------------------------------------------------------------
@dataclass(frozen=True, order=True)
class Edit:
    """Replace `old` by `new` at (line, byte column) of a file: one identifier."""

    path: Path
    line: int
    col: int
    old: str
    new: str


@dataclass
class Source:
    path: Path
    text: str
    tree: ast.Module
    lines: list[bytes] = field(default_factory=list)

    @classmethod
    def read(cls, path: Path) -> Source | None:
        text = path.read_text(encoding="utf-8")
        try:
            tree = ast.parse(text, filename=str(path))
        except SyntaxError:
            return None
        return cls(path, text, tree, text.encode("utf-8").splitlines(keepends=True))

    def at(self, line: int, col: int, length: int) -> str:
        return self.lines[line - 1][col : col + length].decode("utf-8", "replace")

    def segment(self, node: ast.expr) -> bytes | None:
        """The node's source bytes when it lies on one line."""
        if node.end_lineno != node.lineno or node.end_col_offset is None:
            return None
        return self.lines[node.lineno - 1][node.col_offset : node.end_col_offset]


def apply_edits(edits: Iterable[Edit]) -> list[Path]:
    by_file: dict[Path, list[Edit]] = defaultdict(list)
    for e in set(edits):
        by_file[e.path].append(e)
    for path, file_edits in by_file.items():
        lines = path.read_bytes().splitlines(keepends=True)
        for e in sorted(file_edits, reverse=True):
            line = lines[e.line - 1]
            old = e.old.encode()
            if line[e.col : e.col + len(old)] != old:
                raise SystemExit(
                    f"privatize: {_rel(path)}:{e.line}:{e.col}: expected {e.old!r}, "
                    f"found {line[e.col : e.col + len(old)]!r} (nothing written to it)"
                )
            lines[e.line - 1] = line[: e.col] + e.new.encode() + line[e.col + len(old) :]
        path.write_bytes(b"".join(lines))
    return sorted(by_file)


# -- scopes --------------------------------------------------------------------------------
@dataclass(eq=False)
class Scope:
    kind: str  # module, function, class, comprehension
    parent: Scope | None
    bound: set[str] = field(default_factory=set)
    globals: set[str] = field(default_factory=set)
    nonlocals: set[str] = field(default_factory=set)
    loads: set[str] = field(default_factory=set)

    def binding_scope(self) -> Scope:
        """Where a walrus inside a comprehension binds."""
        scope = self
        while scope.kind == "comprehension" and scope.parent is not None:
            scope = scope.parent
        return scope


_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


class ScopeWalker:
    """Every Name of a module with the scope it is read or bound in; then which of them
    are the module-level binding of a name (Python's rules: function scopes skip class
    bodies, `global`/`nonlocal`, comprehension scopes, walrus)."""

    def __init__(self, tree: ast.Module) -> None:
        self.module = Scope("module", None)
        self.names: list[tuple[ast.Name, Scope]] = []
        self.annotations: list[tuple[ast.Constant, Scope]] = []  # string annotations
        self.defs: list[tuple[ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef, Scope]] = []
        self.globals_stmts: list[tuple[ast.Global, Scope]] = []
        self.imports: list[tuple[ast.alias, Scope]] = []  # `from m import name` (any scope)
        for stmt in tree.body:
            self._visit(stmt, self.module)

    # binding helpers
    def _bind(self, scope: Scope, name: str) -> None:
        scope.bound.add(name)

    def _visit_args(self, args: ast.arguments, outer: Scope, inner: Scope) -> None:
        for default in [*args.defaults, *(d for d in args.kw_defaults if d is not None)]:
            self._visit(default, outer)
        every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
        every += [a for a in (args.vararg, args.kwarg) if a is not None]
        for a in every:
            self._bind(inner, a.arg)
            if a.annotation is not None:
                self._visit_annotation(a.annotation, outer)

    def _visit_annotation(self, node: ast.expr, scope: Scope) -> None:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                self.annotations.append((sub, scope))
        self._visit(node, scope)

    def _visit(self, node: ast.AST, scope: Scope) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for d in node.decorator_list:
                self._visit(d, scope)
            inner = Scope("function", scope)
            self._visit_args(node.args, scope, inner)
            if node.returns is not None:
                self._visit_annotation(node.returns, scope)
            self._bind(scope, node.name)
            self.defs.append((node, scope))
            for stmt in node.body:
                self._visit(stmt, inner)
        elif isinstance(node, ast.Lambda):
            inner = Scope("function", scope)
            self._visit_args(node.args, scope, inner)
            self._visit(node.body, inner)
        elif isinstance(node, ast.ClassDef):
            for sub in [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]:
                self._visit(sub, scope)
            self._bind(scope, node.name)
            self.defs.append((node, scope))
            inner = Scope("class", scope)
            for stmt in node.body:
                self._visit(stmt, inner)
        elif isinstance(node, _COMPREHENSIONS):
            inner = Scope("comprehension", scope)
            for i, gen in enumerate(node.generators):
                self._visit(gen.iter, scope if i == 0 else inner)
                self._visit(gen.target, inner)
                for cond in gen.ifs:
                    self._visit(cond, inner)
            parts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            for part in parts:
                self._visit(part, inner)
        elif isinstance(node, ast.Name):
            self.names.append((node, scope))
            if isinstance(node.ctx, ast.Load):
                scope.loads.add(node.id)
            else:
                self._bind(scope, node.id)
        elif isinstance(node, ast.NamedExpr):
            self._visit(node.value, scope)
            target = node.target
            self.names.append((target, scope.binding_scope()))
            self._bind(scope.binding_scope(), target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                if alias.name != "*":
                    self._bind(scope, alias.asname or alias.name.split(".")[0])
                    self.imports.append((alias, scope))
        elif isinstance(node, ast.Global):
            scope.globals.update(node.names)
            self.globals_stmts.append((node, scope))
        elif isinstance(node, ast.Nonlocal):
            scope.nonlocals.update(node.names)
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs | ast.MatchStar)):
            if node.name:
                self._bind(scope, node.name)
            for child in ast.iter_child_nodes(node):
                self._visit(child, scope)
        elif isinstance(node, ast.MatchMapping):
            if node.rest:
                self._bind(scope, node.rest)
            for child in ast.iter_child_nodes(node):
                self._visit(child, scope)
        elif isinstance(node, ast.AnnAssign):
            self._visit(node.target, scope)
            self._visit_annotation(node.annotation, scope)
            if node.value is not None:
                self._visit(node.value, scope)
        else:
            for child in ast.iter_child_nodes(node):
                self._visit(child, scope)

    def resolve(self, name: str, scope: Scope) -> Scope | None:
        """The scope whose binding `name` read or bound in `scope` is; None when a class
        body both binds and reads it (Python would look in the class first, then in the
        module: no position can be renamed safely)."""
        current = scope
        first = True
        while current.kind != "module" and current.parent is not None:
            if name in current.globals:
                return self.module
            if current.kind == "class":
                if first and name in current.bound:
                    return None if name in current.loads else current
            elif name in current.bound and name not in current.nonlocals:
                return current
            first = False
            current = current.parent
        return self.module

    def is_module_level(self, name: str, scope: Scope) -> bool | None:
        """Whether `name` read or bound in `scope` is the module-level binding (None: see resolve)."""
        found = self.resolve(name, scope)
        return None if found is None else found is self.module


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
    source: Source
    walker: ScopeWalker
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


def _last(node: ast.expr) -> str:
    if isinstance(node, ast.Subscript):
        return _last(node.value)
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


def _identifiers(tree: ast.AST) -> set[str]:
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
    for path in _py_files("src/kiln"):
        source = Source.read(path)
        if source is None:
            continue
        name = _module_name(path)
        modules[name] = Module(
            name,
            _package_of(name, path),
            source,
            ScopeWalker(source.tree),
            _definitions(name, source.tree),
            _all_names(source.tree),
            _identifiers(source.tree),
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
                last = _last(base)
                why = None
                if last in DATA_BASES:
                    why = last
                elif EXCEPTION_BASE.search(last) or last in ("Exception", "BaseException"):
                    why = "an exception"
                elif any(other.data_class for other in by_name.get(last, [])):
                    why = next(o.data_class for o in by_name[last] if o.data_class)
                if why:
                    d.data_class = why
                    changed = True
                    break


# -- references from other files -----------------------------------------------------------
@dataclass
class Ref:
    module: str
    name: str
    path: Path
    edits: list[Edit]  # what a rename of the name changes in this file ([] when it cannot)
    how: str


@dataclass
class FileScan:
    path: Path
    is_test: bool
    refs: list[Ref] = field(default_factory=list)
    strings: set[str] = field(default_factory=set)  # strings that are one identifier
    dotted_strings: set[tuple[str, str]] = field(default_factory=set)  # `a.b` inside a string: (a, b)
    string_words: set[str] = field(default_factory=set)  # every word of its strings (in-image modules)
    unknown_attrs: set[str] = field(default_factory=set)  # `.x` read on what is no module
    private_attrs: list[tuple[str, int]] = field(default_factory=list)  # `obj._x` (not self/cls)
    imported: set[str] = field(default_factory=set)  # kiln modules it imports (or from)
    escaped: set[str] = field(default_factory=set)  # kiln modules it passes around as values
    dynamic: bool = False  # imports modules by name (importlib)
    aliases: dict[str, str] = field(default_factory=dict)  # local name -> the kiln module it is
    source: Source | None = None


def _resolve_relative(path: Path, level: int, module: str | None, src: Path | None = None) -> str | None:
    src = src or SRC
    if not path.is_relative_to(src):
        return module if level == 0 else None
    name = ".".join(path.relative_to(src).with_suffix("").parts).removesuffix(".__init__")
    package = _package_of(name, path)
    parts = package.split(".")
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    base = ".".join(parts)
    return f"{base}.{module}" if module else base


class Scanner:
    def __init__(self, modules: dict[str, Module]) -> None:
        self.modules = modules

    def _module_of(self, name: str) -> str | None:
        name = SHIPPED_AS.get(name, name)
        return name if name in self.modules else None

    def scan(self, path: Path, is_test: bool) -> FileScan | None:
        source = Source.read(path)
        if source is None:
            return None
        scan = FileScan(path, is_test, source=source)
        aliases = scan.aliases
        for node in ast.walk(source.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = self._module_of(alias.name)
                    if alias.asname and target:
                        aliases[alias.asname] = target
                        scan.imported.add(target)
                    elif not alias.asname and alias.name.split(".")[0] == "kiln":
                        aliases["kiln"] = "kiln"
                        scan.imported.add(alias.name)
                    elif alias.name in SHIPPED_AS:
                        aliases[alias.name] = SHIPPED_AS[alias.name]
                        scan.imported.add(SHIPPED_AS[alias.name])
                    if alias.name in ("importlib", "importlib.util"):
                        scan.dynamic = True
            elif isinstance(node, ast.ImportFrom):
                base = _resolve_relative(path, node.level, node.module) if node.level else node.module
                base = SHIPPED_AS.get(base or "", base)
                if base == "importlib":
                    scan.dynamic = True
                if base not in self.modules:
                    continue
                scan.imported.add(base)
                for alias in node.names:
                    if alias.name == "*":
                        for name in self.modules[base].definitions:
                            scan.refs.append(Ref(base, name, path, [], "import *"))
                        continue
                    sub = f"{base}.{alias.name}"
                    if sub in self.modules:
                        aliases[alias.asname or alias.name] = sub
                        scan.imported.add(sub)
                        continue
                    edits = [Edit(path, alias.lineno, alias.col_offset, alias.name, "")]
                    ref = Ref(base, alias.name, path, edits, "from-import")
                    scan.refs.append(ref)
        self._scan_uses(scan, aliases)
        return scan

    def _chain(self, node: ast.expr, aliases: dict[str, str]) -> str | None:
        """The kiln module an expression names (an alias, or `kiln.a.b` through it)."""
        if isinstance(node, ast.Name):
            return aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self._chain(node.value, aliases)
            if base is not None and f"{base}.{node.attr}" in self.modules:
                return f"{base}.{node.attr}"
        return None

    def _scan_uses(self, scan: FileScan, aliases: dict[str, str]) -> None:
        assert scan.source is not None
        src = scan.source
        module_values: set[int] = set()  # ids of alias Names used as the base of an attribute
        seen: set[int] = set()  # ids of strings already read as a reference
        for node in ast.walk(src.tree):
            if isinstance(node, ast.Attribute):
                base = self._chain(node.value, aliases)
                if base is not None:
                    module_values.add(id(node.value))
                    if f"{base}.{node.attr}" not in self.modules:
                        col = (node.end_col_offset or 0) - len(node.attr.encode())
                        edits = [Edit(scan.path, node.end_lineno or node.lineno, col, node.attr, "")]
                        scan.refs.append(Ref(base, node.attr, scan.path, edits, "attribute"))
                else:
                    scan.unknown_attrs.add(node.attr)
                    if (
                        node.attr.startswith("_")
                        and not node.attr.startswith("__")
                        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                    ):
                        scan.private_attrs.append((node.attr, node.lineno))
            elif isinstance(node, ast.Subscript):
                seen.add(id(node.slice))  # a key: `doc["name"]`
            elif isinstance(node, ast.Dict):
                seen.update(id(k) for k in node.keys if k is not None)
            elif isinstance(node, ast.Compare):
                seen.update(id(n) for n in [node.left, *node.comparators])
            elif isinstance(node, ast.Call):
                self._attr_call(scan, node, aliases, module_values, seen)
                if _last(node.func) in SELF_NAMING and node.args and isinstance(node.args[0], ast.Constant):
                    seen.add(id(node.args[0]))  # TypeVar("T") names its own binding
        for node in ast.walk(src.tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and id(node) not in module_values:
                target = aliases.get(node.id)
                if target is not None and target != "kiln":
                    scan.escaped.add(target)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                self._string(scan, node, loose=id(node) not in seen)
        if scan.path.is_relative_to(IMAGE_SCRIPTS):  # a script beside the in-image modules: every word
            scan.string_words |= set(IDENT.findall(src.text))

    def _attr_call(
        self, scan: FileScan, node: ast.Call, aliases: dict[str, str], module_values: set[int], seen: set[int]
    ) -> None:
        """setattr(m, "name", ...), monkeypatch.setattr(m, "name", ...), mock.patch.object(m, "name")."""
        func = _last(node.func)
        patch_object = func == "object" and isinstance(node.func, ast.Attribute) and _last(node.func.value) == "patch"
        if (func not in ATTR_CALLS and not patch_object) or len(node.args) < 2:
            return
        target = self._chain(node.args[0], aliases)
        name = node.args[1]
        if target is None or not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
            return
        module_values.add(id(node.args[0]))
        seen.add(id(name))  # not a loose string as well
        edit = self._string_edit(scan, name, name.value)
        scan.refs.append(Ref(target, name.value, scan.path, [edit] if edit else [], "attribute string"))

    def _string_edit(self, scan: FileScan, node: ast.Constant, name: str) -> Edit | None:
        """The edit that renames the last dotted part `name` of a one-line plain string literal."""
        assert scan.source is not None
        raw = scan.source.segment(node)
        if raw is None or raw[:1] not in (b'"', b"'") or raw[1:-1].decode() != str(node.value):
            return None
        return Edit(scan.path, node.lineno, node.col_offset + len(raw) - 1 - len(name.encode()), name, "")

    def _string(self, scan: FileScan, node: ast.Constant, loose: bool) -> None:
        """A string that may name a module-level name: `"kiln.a.b.name"`, or (`loose`: no
        key, no comparison, not already read as an attribute's name) `"name"`, `"m.name"`."""
        value = str(node.value)
        scan.string_words.update(IDENT.findall(value))
        if not value or (not loose and not value.startswith("kiln")):
            return
        dotted = re.fullmatch(r"((?:kiln|kiln_\w+)(?:\.\w+)*)[.:](\w+)", value)
        if dotted and self._module_of(dotted.group(1)):
            module = self._module_of(dotted.group(1))
            assert module is not None
            if f"{module}.{dotted.group(2)}" not in self.modules:
                edit = self._string_edit(scan, node, dotted.group(2)) if value[len(dotted.group(1))] == "." else None
                scan.refs.append(Ref(module, dotted.group(2), scan.path, [edit] if edit else [], "dotted string"))
                return
        if IDENT.fullmatch(value):
            scan.strings.add(value)
        else:
            scan.dotted_strings.update(re.findall(r"([A-Za-z_]\w*)\.([A-Za-z_]\w*)", value))


def _markdown_code(text: str) -> list[tuple[str, ...]]:
    """The dotted names a Markdown document's code spans are (`name`, `module.name(...)`,
    `Class.method`); fenced blocks are shell, YAML, JSON and text here, not Python."""
    text = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.DOTALL | re.MULTILINE)
    out = []
    for span in re.findall(r"`([^`\n]+)`", text):
        m = re.fullmatch(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:\(.*\)|\[.*\])?", span.strip())
        if m:
            out.append(tuple(m.group(1).split(".")))
    return out


def _text_references() -> set[tuple[str, str]]:
    """(module, name) pairs that TEXT_FILES name: `kiln.a.b:name`, `kiln.a.b.name`,
    `from kiln.a.b import name, other`."""
    found: set[tuple[str, str]] = set()
    for pattern in TEXT_FILES:
        for path in sorted(ROOT.glob(pattern)):
            if not path.is_file():
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            found.update(re.findall(r"\b(kiln(?:\.\w+)*)[.:](\w+)", text))
            for module, names in re.findall(r"from\s+(kiln(?:\.\w+)*)\s+import\s+([\w, ]+)", text):
                found.update((module, n.strip()) for n in names.split(",") if n.strip())
    return found


# -- the analysis ----------------------------------------------------------------------------
@dataclass
class Finding:
    module: str
    name: str
    action: str  # rename, delete, publicise, keep
    why: str
    edits: list[Edit] = field(default_factory=list)
    deletion: tuple[Path, int, int] | None = None  # lines (first, last) to delete
    inimage: bool = False

    def line(self) -> str:
        where = f"{self.module}:{self.name}"
        return {
            "rename": f"{where} -> _{self.name}: {self.why}",
            "delete": f"{where}: {self.why}; delete it",
            "publicise": f"{where} -> {self.name.lstrip('_')}: {self.why}",
            "keep": f"{where} stays public: {self.why}",
        }[self.action]


@dataclass
class Analysis:
    modules: dict[str, Module]
    scans: list[FileScan]
    findings: list[Finding]
    problems: list[str]  # what --write cannot fix (CI fails on them too)


def _own_uses(module: Module, name: str) -> tuple[list[Edit], int, bool]:
    """The edits renaming module-level `name` in its module, the number of its uses there
    (bindings and definitions left out), and whether every position is certain."""
    src, walker = module.source, module.walker
    new = "_" + name
    edits: list[Edit] = []
    uses = 0
    certain = True
    for node, scope in walker.names:
        if node.id != name:
            continue
        level = walker.is_module_level(name, scope)
        if level is None:
            certain = False
        elif level:
            edits.append(Edit(src.path, node.lineno, node.col_offset, name, new))
            if isinstance(node.ctx, ast.Load) or scope is not walker.module:
                uses += 1
    for define, scope in walker.defs:
        if define.name == name and scope is walker.module:
            line = src.lines[define.lineno - 1]
            keyword = rb"class" if isinstance(define, ast.ClassDef) else rb"(?:async\s+)?def"
            m = re.compile(keyword + rb"\s+(" + re.escape(name.encode()) + rb")\b").match(line, define.col_offset)
            if m is None:
                certain = False
                continue
            edits.append(Edit(src.path, define.lineno, m.start(1), name, new))
        elif define.name == name and scope is not walker.module and walker.is_module_level(name, scope):
            certain = False  # a def inside a function that declares the name global
    for stmt, _scope in walker.globals_stmts:
        if name in stmt.names:
            line = src.lines[stmt.lineno - 1]
            for m in re.finditer(rb"(?<![\w.])" + re.escape(name.encode()) + rb"\b", line[stmt.col_offset :]):
                edits.append(Edit(src.path, stmt.lineno, stmt.col_offset + m.start(), name, new))
            uses += 1
    for const, _scope in walker.annotations:
        raw = src.segment(const)
        if raw is None or name not in str(const.value):
            continue
        for m in re.finditer(rb"(?<![\w.])" + re.escape(name.encode()) + rb"(?!\w)", raw):
            edits.append(Edit(src.path, const.lineno, const.col_offset + m.start(), name, new))
            uses += 1
    # `T = TypeVar("T")`: the string names the binding
    definition = module.definitions.get(name)
    if (
        definition is not None
        and isinstance(definition.stmt, ast.Assign)
        and isinstance(definition.stmt.value, ast.Call)
    ):
        call = definition.stmt.value
        if (
            _last(call.func) in SELF_NAMING
            and call.args
            and isinstance(call.args[0], ast.Constant)
            and call.args[0].value == name
        ):
            raw = src.segment(call.args[0])
            if raw is not None and raw[1:-1] == name.encode():
                edits.append(Edit(src.path, call.args[0].lineno, call.args[0].col_offset + 1, name, new))
    edits += _prose_edits(module, name)
    return edits, uses, certain


def _prose_edits(module: Module, name: str) -> list[Edit]:
    """`name` in backticks (`name`, `name(...)`, `name.attr`, `name[...]`) in the module's
    comments and in the docstrings of the module and its functions."""
    pattern = re.compile(rb"(?<=`)" + re.escape(name.encode()) + rb"(?=[`(\[.])")
    return [
        Edit(module.path, line, col + m.start(), name, "_" + name)
        for line, col, chunk in _prose(module.source)
        for m in pattern.finditer(chunk)
    ]


_PROSE: dict[Path, list[tuple[int, int, bytes]]] = {}


def _prose(src: Source) -> list[tuple[int, int, bytes]]:
    """(line, byte column, bytes) of every line of the file's comments and of the
    docstrings of the module and its functions (a class docstring can be a JSON Schema's
    description: left alone)."""
    if src.path in _PROSE:
        return _PROSE[src.path]
    docstrings: set[tuple[int, int]] = set()
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                line = first.value.lineno
                docstrings.add((line, len(src.lines[line - 1][: first.value.col_offset].decode("utf-8"))))
    out = []
    for tok in tokenize.tokenize(io.BytesIO(src.text.encode("utf-8")).readline):
        if tok.type == tokenize.COMMENT or (tok.type == tokenize.STRING and tok.start in docstrings):
            # token columns count characters: each of the token's lines, in bytes
            for offset, text in enumerate(tok.string.split("\n")):
                line_no = tok.start[0] + offset
                head = src.lines[line_no - 1]
                base = len(head.decode("utf-8")[: tok.start[1]].encode()) if offset == 0 else 0
                out.append((line_no, base, text.encode("utf-8")))
    _PROSE[src.path] = out
    return out


def _qualified_prose_edits(scans: list[FileScan], renames: dict[tuple[str, str], str]) -> list[Edit]:
    """`module.name` (or `kiln.a.module.name`) in other files' comments and docstrings, for
    each renamed name: `launch_arg_probe.PROBE_ENV` -> `launch_arg_probe._PROBE_ENV`."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for module, name in renames:
        by_name[name].append(module)
    edits = []
    chain = re.compile(rb"(?<![\w.])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
    for scan in scans:
        if scan.source is None:
            continue
        for line, col, chunk in _prose(scan.source):
            for m in chain.finditer(chunk):
                parts = m.group().decode().split(".")
                offset = m.start()
                for i, part in enumerate(parts):
                    if i and part in by_name:
                        prefix = parts[:i]
                        for module in by_name[part]:
                            if module.split(".")[-len(prefix) :] == prefix:
                                edits.append(Edit(scan.path, line, col + offset, part, renames[(module, part)]))
                    offset += len(part.encode()) + 1
    return edits


def _inert(value: ast.expr | None) -> bool:
    """A value whose making does nothing else: literals, names, `a.b`, `x[int]`, `X | None`."""
    if value is None:
        return True
    return all(
        isinstance(
            n,
            ast.Constant
            | ast.Name
            | ast.Attribute
            | ast.Subscript
            | ast.Tuple
            | ast.List
            | ast.Set
            | ast.Dict
            | ast.BinOp
            | ast.UnaryOp
            | ast.Load
            | ast.operator
            | ast.unaryop,
        )
        for n in ast.walk(value)
    )


def _deletion(module: Module, definition: Definition) -> tuple[Path, int, int] | None:
    """The lines of a dead definition's statement (decorators and the comment lines right
    above it included), when it is a whole statement at module level that defines only it."""
    stmt = definition.stmt
    if stmt not in module.source.tree.body:
        return None
    if isinstance(stmt, ast.Assign | ast.AnnAssign):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        if len(targets) != 1 or not isinstance(targets[0], ast.Name) or not _inert(stmt.value):
            return None  # several names, or a value whose making may do something
    decorators = getattr(stmt, "decorator_list", [])
    if any(_last(d.func if isinstance(d, ast.Call) else d) not in PURE_DECORATORS for d in decorators):
        return None  # a decorator may register it somewhere
    first = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])
    last = stmt.end_lineno or stmt.lineno
    lines = module.source.lines
    if lines[last - 1].rstrip().endswith(b"\\") or lines[first - 1][:1].isspace():
        return None
    while first > 1 and lines[first - 2].lstrip().startswith(b"#"):
        first -= 1
    return module.path, first, last


def analyse() -> Analysis:
    _PROSE.clear()  # files change between two analyses of one --write
    modules = load_modules()
    scanner = Scanner(modules)
    scans: list[FileScan] = []
    users = _py_files(*USER_DIRS, *USER_FILES)
    for path in users + _image_scripts():
        if path == Path(__file__).resolve():
            continue  # this script names names in its own text
        scan = scanner.scan(path, is_test=False)
        if scan is not None:
            scans.append(scan)
    for path in _py_files(*TEST_DIRS):
        scan = scanner.scan(path, is_test=True)
        if scan is not None:
            scans.append(scan)
    own_of = {m.path: m.name for m in modules.values()}
    docs: list[tuple[str, ...]] = []
    for doc in DOCS:
        base = ROOT / doc
        for md in [base] if base.is_file() else sorted(base.rglob("*.md")) if base.is_dir() else []:
            docs += _markdown_code(md.read_text(encoding="utf-8"))
    text_refs = _text_references()

    refs: dict[tuple[str, str], list[Ref]] = defaultdict(list)
    for scan in scans:
        for ref in scan.refs:
            if own_of.get(scan.path) != ref.module:
                refs[(ref.module, ref.name)].append(ref)
    # where a module is passed around as a value: the file that does it, and the files
    # importing that file's module (cli.COMMANDS read by a test)
    escaped: dict[str, set[Path]] = defaultdict(set)
    for scan in scans:
        for m in scan.escaped:
            if own_of.get(scan.path) != m:
                escaped[m].add(scan.path)
                holder = own_of.get(scan.path)
                escaped[m] |= {s.path for s in scans if holder is not None and holder in s.imported}
    schema_words: set[str] = set()
    for schema in sorted((PACKAGE / "schemas").glob("*.json")):
        schema_words |= set(IDENT.findall(schema.read_text(encoding="utf-8")))

    findings: list[Finding] = []
    problems: list[str] = []
    for module in modules.values():
        inimage = module.name == INIMAGE or module.name.startswith(INIMAGE + ".")
        for name, definition in sorted(module.definitions.items()):
            key = f"{module.name}:{name}"
            if name.startswith("__"):
                continue
            if name.startswith("_"):
                findings += _publicise(module, name, refs.get((module.name, name), []), modules, scans, own_of)
                continue

            def keep(why: str, name: str = name, module: Module = module, inimage: bool = inimage) -> None:
                findings.append(Finding(module.name, name, "keep", why, inimage=inimage))  # noqa: B023  (appended now)

            if name in module.all_names:
                keep("in __all__")
                continue
            if key in EXEMPT:
                keep(f"exempt: {EXEMPT[key]}")
                continue
            found = refs.get((module.name, name), [])
            users_refs = [r for r in found if not _is_test(r.path)]
            if users_refs:
                continue  # public, and used as such
            if (module.name, name) in text_refs:
                keep(f"named in {', '.join(TEXT_FILES)}")
                continue
            if name in _main_block_names(module.source.tree):
                keep('what the module runs as a script (`if __name__ == "__main__":`)')
                continue
            loose = _loose_reasons(module, name, scans, own_of, escaped, docs, inimage)
            unrewritable = [r for r in found if not r.edits]
            edits, uses, certain = _own_uses(module, name)
            if loose or unrewritable:
                reasons = loose + [f"{_rel(r.path)} ({r.how})" for r in unrewritable]
                keep("may be used by name: " + ", ".join(sorted(set(reasons))[:4]))
                continue
            if definition.data_class == "TypedDict" and name in schema_words:
                keep("a TypedDict named in a JSON Schema of src/kiln/schemas")
                continue
            if definition.data_class and definition.data_class != "TypedDict":
                keep(f"its class name is data ({definition.data_class})")
                continue
            if not certain:
                keep("a class body reads it and binds its own (no safe rename)")
                continue
            new = "_" + name
            tests = sorted({_rel(r.path) for r in found})
            bound_in = {module.path, *(r.path for r in found if r.how == "from-import")}
            clash = [p for p in bound_in if _binds(p, new, modules, scans)]
            if clash:
                keep(f"{new} already exists in {', '.join(_rel(p) for p in clash)}")
                continue
            if not found and uses == 0:
                deletion = _deletion(module, definition)
                if deletion is None:
                    problems.append(f"{key}: used nowhere, but is not a whole statement of its own: delete it by hand")
                    continue
                findings.append(
                    Finding(module.name, name, "delete", "used nowhere", deletion=deletion, inimage=inimage)
                )
                continue
            for ref in found:
                edits += [Edit(e.path, e.line, e.col, e.old, new) for e in ref.edits]
                edits += _test_binding_edits(ref, scans, name, new)
            why = "used only in its module" + (f" and by tests ({', '.join(tests)})" if tests else "")
            findings.append(Finding(module.name, name, "rename", why, edits=edits, inimage=inimage))
    findings += _private_attributes(modules, scans, own_of)
    renames = {(f.module, f.name): "_" + f.name for f in findings if f.action == "rename"}
    renames.update({(f.module, f.name): f.name.lstrip("_") for f in findings if f.action == "publicise"})
    prose = _qualified_prose_edits(scans, renames)
    for f in findings:
        if (f.module, f.name) in renames:
            f.edits += [e for e in prose if e.old == f.name and renames[(f.module, f.name)] == e.new]
    return Analysis(modules, scans, findings, problems)


def _main_block_names(tree: ast.Module) -> set[str]:
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


def _is_test(path: Path) -> bool:
    return any(path.is_relative_to(ROOT / d) for d in TEST_DIRS)


def _binds(path: Path, name: str, modules: dict[str, Module], scans: list[FileScan]) -> bool:
    for module in modules.values():
        if module.path == path:
            return name in module.identifiers
    for scan in scans:
        if scan.path == path and scan.source is not None:
            return name in _identifiers(scan.source.tree)
    return False


def _loose_reasons(
    module: Module,
    name: str,
    scans: list[FileScan],
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
            why.append(f"{_rel(scan.path)} (a string)")
        if (dotted[-1], name) in scan.dotted_strings or any(
            (alias, name) in scan.dotted_strings for alias, m in scan.aliases.items() if m == module.name
        ):
            why.append(f"{_rel(scan.path)} (`.{name}` in a string)")
        if scan.path in escaped.get(module.name, ()) and name in scan.unknown_attrs:
            why.append(f"{_rel(scan.path)} (.{name}: the module is passed around there)")
        if (
            inimage
            and name in scan.string_words
            and (scan.imported & {INIMAGE, module.name} or scan.path.is_relative_to(IMAGE_SCRIPTS))
            and not scan.is_test
        ):
            why.append(f"{_rel(scan.path)} (a word in its strings; in-image module)")
    return why


def _test_binding_edits(ref: Ref, scans: list[FileScan], name: str, new: str) -> list[Edit]:
    """`from m import name` (no `as`) in a test: every use of the binding it makes, in the
    scope it makes it in (a module's, or a test function's)."""
    if ref.how != "from-import":
        return []
    scan = next(s for s in scans if s.path == ref.path)
    if scan.source is None:
        return []
    walker = ScopeWalker(scan.source.tree)
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
            out.append(Edit(scan.path, node.lineno, node.col_offset, name, new))
    for define, scope in walker.defs:
        if define.name == name and walker.resolve(name, scope) is where[0]:
            raise SystemExit(f"privatize: {_rel(scan.path)} imports {name} and defines it too")
    return out


def _publicise(
    module: Module,
    name: str,
    found: list[Ref],
    modules: dict[str, Module],
    scans: list[FileScan],
    own_of: dict[Path, str],
) -> list[Finding]:
    """A `_name` that a module of another package uses: made public."""
    outside = [
        r
        for r in found
        if not _is_test(r.path) and (r.path not in own_of or modules[own_of[r.path]].package != module.package)
    ]
    if not outside:
        return []
    public = name.lstrip("_")
    users = sorted({_rel(r.path) for r in outside})
    if public in module.definitions or any(_binds(r.path, public, modules, scans) for r in found):
        return [
            Finding(module.name, name, "keep", f"used from {', '.join(users)}, but {public} exists: move it by hand")
        ]
    edits = [Edit(e.path, e.line, e.col, name, public) for e, _ in ((e, 0) for e in _own_uses(module, name)[0])]
    for ref in found:
        edits += [Edit(e.path, e.line, e.col, e.old, public) for e in ref.edits]
        edits += _test_binding_edits(ref, scans, name, public)
    return [
        Finding(
            module.name, name, "publicise", f"private, but used from another package ({', '.join(users)})", edits=edits
        )
    ]


def _private_attributes(modules: dict[str, Module], scans: list[FileScan], own_of: dict[Path, str]) -> list[Finding]:
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
                (modules[own_of[s.path]].package, _rel(s.path))
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
        edits: list[Edit] = []
        clash = []
        for scan in scans:
            if scan.source is None:
                continue
            if public in _identifiers(scan.source.tree) and attr in _identifiers(scan.source.tree):
                clash.append(_rel(scan.path))
            for node in ast.walk(scan.source.tree):
                if isinstance(node, ast.Attribute) and node.attr == attr:
                    col = (node.end_col_offset or 0) - len(attr.encode())
                    edits.append(Edit(scan.path, node.end_lineno or node.lineno, col, attr, public))
                elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == attr:
                    m = re.compile(rb"(?:async\s+)?def\s+(" + re.escape(attr.encode()) + rb")\b").match(
                        scan.source.lines[node.lineno - 1], node.col_offset
                    )
                    if m:
                        edits.append(Edit(scan.path, node.lineno, m.start(1), attr, public))
        why = f"a private method read from another package ({', '.join(foreign)})"
        if clash:
            findings.append(
                Finding("(attribute)", attr, "keep", f"{why}, but {public} exists in {', '.join(clash)}: by hand")
            )
        else:
            findings.append(Finding("(attribute)", attr, "publicise", why, edits=edits))
    return findings


# -- the rule the unit tier checks -----------------------------------------------------------
def cross_package_private_imports(files: Iterable[Path], src: Path | None = None) -> list[str]:
    """Each `from kiln.a.b import _name`, or `b._name` through an imported module, in a file
    under `src` (default: src/) that is not in package kiln.a: `path:line: kiln.a.b._name`.
    A private name may be shared inside its package (kiln.infra.docker's `_daemon`), not
    beyond: a name another package needs is public (or lives in that package)."""
    src = src or SRC
    found = []
    for path in files:
        module = ".".join(path.relative_to(src).with_suffix("").parts).removesuffix(".__init__")
        own = _package(module, src)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        modules: dict[str, str] = {}  # a local name -> the kiln module it is
        taken: list[tuple[int, str, str]] = []  # (line, module, private name)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                base = _resolve_relative(path, node.level, node.module, src) if node.level else node.module
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
def stats(modules: dict[str, Module]) -> tuple[dict[str, int], list[str]]:
    """Public module-level names of src/kiln (and of src/kiln/domain) whose word appears in
    no other file (.py under src/ engine/ testkit/ tests/ benchmarks/ scripts/, noxfile.py,
    docs/*.md, README.md): "used only in their own module", counted by a
    word search (grep's way); and those also used nowhere in their own module ("dead")."""
    texts = {
        p: p.read_text(encoding="utf-8") for p in _py_files(*USER_DIRS, *USER_FILES, *TEST_DIRS) + _image_scripts()
    }
    texts.update({p: p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").rglob("*.md"))})
    words_by_file = {p: set(IDENT.findall(t)) for p, t in texts.items()}
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
            counts["public_local_inimage"] += module.name.startswith(INIMAGE)
            if _own_uses(module, name)[1] == 0:
                counts["dead"] += 1
    return counts, local


# -- main ----------------------------------------------------------------------------------
def _report(analysis: Analysis, verbose: bool) -> list[str]:
    todo = [f for f in analysis.findings if f.action != "keep"]
    lines = []
    for f in sorted(todo, key=lambda f: (f.inimage, f.action, f.module, f.name)):
        lines.append(("[in-image] " if f.inimage else "") + f.line())
    if verbose:
        lines += [f.line() for f in analysis.findings if f.action == "keep"]
    lines += analysis.problems
    return lines


def write(analysis: Analysis) -> list[Path]:
    edits: list[Edit] = []
    deletions: dict[Path, list[tuple[int, int]]] = defaultdict(list)
    for f in analysis.findings:
        if f.action in ("rename", "publicise"):
            edits += f.edits
        elif f.action == "delete" and f.deletion:
            deletions[f.deletion[0]].append(f.deletion[1:])
    changed = set(apply_edits(edits))
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
    _set_root(args.root)
    if args.stats:
        counts, local = stats(load_modules())
        for key, value in counts.items():
            print(f"{key}: {value}")
        if args.verbose:
            print("\n".join(f"  public, only its module names it: {name}" for name in local))
        return 0
    analysis = analyse()
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
        analysis = analyse()
    ruff = shutil.which("ruff")
    if changed and ruff:  # import lists re-sorted, imports only a deleted name used removed
        subprocess.run(
            [ruff, "check", "--quiet", "--fix", "--select", "I001,F401", *map(str, sorted(changed))],
            cwd=ROOT,
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
