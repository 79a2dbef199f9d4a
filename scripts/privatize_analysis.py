"""privatize's analysis: each module-level name of src/kiln to rename, delete or keep, with
the edits in its module, its tests and the prose that names it."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from kiln_testkit.scripts import load_script

checkout = load_script("scripts/privatize_files.py")
module_names = load_script("scripts/privatize_modules.py")
cross_refs = load_script("scripts/privatize_references.py")
publicising = load_script("scripts/privatize_publicise.py")


# -- the analysis ----------------------------------------------------------------------------
@dataclass
class Finding:
    module: str
    name: str
    action: str  # rename, delete, publicise, keep
    why: str
    edits: list[checkout.Edit] = field(default_factory=list)
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
    modules: dict[str, module_names.Module]
    scans: list[cross_refs.FileScan]
    findings: list[Finding]
    problems: list[str]  # what --write cannot fix (CI fails on them too)


def own_uses(module: module_names.Module, name: str) -> tuple[list[checkout.Edit], int, bool]:
    """The edits renaming module-level `name` in its module, the number of its uses there
    (bindings and definitions left out), and whether every position is certain."""
    src, walker = module.source, module.walker
    new = "_" + name
    edits: list[checkout.Edit] = []
    uses = 0
    certain = True
    for node, scope in walker.names:
        if node.id != name:
            continue
        level = walker.is_module_level(name, scope)
        if level is None:
            certain = False
        elif level:
            edits.append(checkout.Edit(src.path, node.lineno, node.col_offset, name, new))
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
            edits.append(checkout.Edit(src.path, define.lineno, m.start(1), name, new))
        elif define.name == name and scope is not walker.module and walker.is_module_level(name, scope):
            certain = False  # a def inside a function that declares the name global
    for stmt, _scope in walker.globals_stmts:
        if name in stmt.names:
            line = src.lines[stmt.lineno - 1]
            for m in re.finditer(rb"(?<![\w.])" + re.escape(name.encode()) + rb"\b", line[stmt.col_offset :]):
                edits.append(checkout.Edit(src.path, stmt.lineno, stmt.col_offset + m.start(), name, new))
            uses += 1
    for const, _scope in walker.annotations:
        raw = src.segment(const)
        if raw is None or name not in str(const.value):
            continue
        for m in re.finditer(rb"(?<![\w.])" + re.escape(name.encode()) + rb"(?!\w)", raw):
            edits.append(checkout.Edit(src.path, const.lineno, const.col_offset + m.start(), name, new))
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
            module_names.last_part(call.func) in checkout.SELF_NAMING
            and call.args
            and isinstance(call.args[0], ast.Constant)
            and call.args[0].value == name
        ):
            raw = src.segment(call.args[0])
            if raw is not None and raw[1:-1] == name.encode():
                edits.append(checkout.Edit(src.path, call.args[0].lineno, call.args[0].col_offset + 1, name, new))
    edits += _prose_edits(module, name)
    return edits, uses, certain


def _prose_edits(module: module_names.Module, name: str) -> list[checkout.Edit]:
    """`name` in backticks (`name`, `name(...)`, `name.attr`, `name[...]`) in the module's
    comments and in the docstrings of the module and its functions."""
    pattern = re.compile(rb"(?<=`)" + re.escape(name.encode()) + rb"(?=[`(\[.])")
    return [
        checkout.Edit(module.path, line, col + m.start(), name, "_" + name)
        for line, col, chunk in _prose(module.source)
        for m in pattern.finditer(chunk)
    ]


def _prose(src: checkout.Source) -> list[tuple[int, int, bytes]]:
    """(line, byte column, bytes) of every line of the file's comments and of the
    docstrings of the module and its functions (a class docstring can be a JSON Schema's
    description: left alone)."""
    if src.path in checkout.PROSE:
        return checkout.PROSE[src.path]
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
    checkout.PROSE[src.path] = out
    return out


def _qualified_prose_edits(
    scans: list[cross_refs.FileScan], renames: dict[tuple[str, str], str]
) -> list[checkout.Edit]:
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
                                edits.append(
                                    checkout.Edit(scan.path, line, col + offset, part, renames[(module, part)])
                                )
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


def _deletion(module: module_names.Module, definition: module_names.Definition) -> tuple[Path, int, int] | None:
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
    if any(
        module_names.last_part(d.func if isinstance(d, ast.Call) else d) not in checkout.PURE_DECORATORS
        for d in decorators
    ):
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
    checkout.PROSE.clear()  # files change between two analyses of one --write
    modules = module_names.load_modules()
    scanner = cross_refs.Scanner(modules)
    scans: list[cross_refs.FileScan] = []
    users = checkout.py_files(*checkout.USER_DIRS, *checkout.USER_FILES)
    for path in users + checkout.image_scripts():
        if path.parent == Path(__file__).resolve().parent and path.name.startswith("privatize"):
            continue  # this script and its parts name names in their own text
        scan = scanner.scan(path, is_test=False)
        if scan is not None:
            scans.append(scan)
    for path in checkout.py_files(*checkout.TEST_DIRS):
        scan = scanner.scan(path, is_test=True)
        if scan is not None:
            scans.append(scan)
    own_of = {m.path: m.name for m in modules.values()}
    docs: list[tuple[str, ...]] = []
    for doc in checkout.DOCS:
        base = checkout.ROOT / doc
        for md in [base] if base.is_file() else sorted(base.rglob("*.md")) if base.is_dir() else []:
            docs += cross_refs.markdown_code(md.read_text(encoding="utf-8"))
    text_refs = cross_refs.text_references()

    refs: dict[tuple[str, str], list[cross_refs.Ref]] = defaultdict(list)
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
    for schema in sorted((checkout.PACKAGE / "schemas").glob("*.json")):
        schema_words |= set(checkout.IDENT.findall(schema.read_text(encoding="utf-8")))

    findings: list[Finding] = []
    problems: list[str] = []
    for module in modules.values():
        inimage = module.name == checkout.INIMAGE or module.name.startswith(checkout.INIMAGE + ".")
        for name, definition in sorted(module.definitions.items()):
            key = f"{module.name}:{name}"
            if name.startswith("__"):
                continue
            if name.startswith("_"):
                findings += publicising.publicise_edits(
                    module, name, refs.get((module.name, name), []), modules, scans, own_of
                )
                continue

            def keep(why: str, name: str = name, module: module_names.Module = module, inimage: bool = inimage) -> None:
                findings.append(Finding(module.name, name, "keep", why, inimage=inimage))  # noqa: B023  (appended now)

            if name in module.all_names:
                keep("in __all__")
                continue
            if key in checkout.EXEMPT:
                keep(f"exempt: {checkout.EXEMPT[key]}")
                continue
            found = refs.get((module.name, name), [])
            users_refs = [r for r in found if not publicising.is_test_file(r.path)]
            if users_refs:
                continue  # public, and used as such
            if (module.name, name) in text_refs:
                keep(f"named in {', '.join(checkout.TEXT_FILES)}")
                continue
            if name in publicising.main_block_names(module.source.tree):
                keep('what the module runs as a script (`if __name__ == "__main__":`)')
                continue
            loose = publicising.loose_reasons(module, name, scans, own_of, escaped, docs, inimage)
            unrewritable = [r for r in found if not r.edits]
            edits, uses, certain = own_uses(module, name)
            if loose or unrewritable:
                reasons = loose + [f"{checkout.rel(r.path)} ({r.how})" for r in unrewritable]
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
            tests = sorted({checkout.rel(r.path) for r in found})
            bound_in = {module.path, *(r.path for r in found if r.how == "from-import")}
            clash = [p for p in bound_in if publicising.binds_name(p, new, modules, scans)]
            if clash:
                keep(f"{new} already exists in {', '.join(checkout.rel(p) for p in clash)}")
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
                edits += [checkout.Edit(e.path, e.line, e.col, e.old, new) for e in ref.edits]
                edits += publicising.test_binding_edits(ref, scans, name, new)
            why = "used only in its module" + (f" and by tests ({', '.join(tests)})" if tests else "")
            findings.append(Finding(module.name, name, "rename", why, edits=edits, inimage=inimage))
    findings += publicising.private_attributes(modules, scans, own_of)
    renames = {(f.module, f.name): "_" + f.name for f in findings if f.action == "rename"}
    renames.update({(f.module, f.name): f.name.lstrip("_") for f in findings if f.action == "publicise"})
    prose = _qualified_prose_edits(scans, renames)
    for f in findings:
        if (f.module, f.name) in renames:
            f.edits += [e for e in prose if e.old == f.name and renames[(f.module, f.name)] == e.new]
    return Analysis(modules, scans, findings, problems)
