"""privatize's references: what the other files (Python, text, the docs' code spans) read of
src/kiln's modules, and where a name is named in a string or read off an unknown object."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from kiln_testkit.scripts import load_script

checkout = load_script("scripts/privatize_files.py")
module_names = load_script("scripts/privatize_modules.py")


# -- references from other files -----------------------------------------------------------
@dataclass
class Ref:
    module: str
    name: str
    path: Path
    edits: list[checkout.Edit]  # what a rename of the name changes in this file ([] when it cannot)
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
    source: checkout.Source | None = None


def resolve_relative(path: Path, level: int, module: str | None, src: Path | None = None) -> str | None:
    src = src or checkout.SRC
    if not path.is_relative_to(src):
        return module if level == 0 else None
    name = ".".join(path.relative_to(src).with_suffix("").parts).removesuffix(".__init__")
    package = checkout.package_of(name, path)
    parts = package.split(".")
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    base = ".".join(parts)
    return f"{base}.{module}" if module else base


class Scanner:
    def __init__(self, modules: dict[str, module_names.Module]) -> None:
        self.modules = modules

    def _module_of(self, name: str) -> str | None:
        name = checkout.SHIPPED_AS.get(name, name)
        return name if name in self.modules else None

    def scan(self, path: Path, is_test: bool) -> FileScan | None:
        source = checkout.Source.read(path)
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
                    elif alias.name in checkout.SHIPPED_AS:
                        aliases[alias.name] = checkout.SHIPPED_AS[alias.name]
                        scan.imported.add(checkout.SHIPPED_AS[alias.name])
                    if alias.name in ("importlib", "importlib.util"):
                        scan.dynamic = True
            elif isinstance(node, ast.ImportFrom):
                base = resolve_relative(path, node.level, node.module) if node.level else node.module
                base = checkout.SHIPPED_AS.get(base or "", base)
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
                    edits = [checkout.Edit(path, alias.lineno, alias.col_offset, alias.name, "")]
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
                        edits = [checkout.Edit(scan.path, node.end_lineno or node.lineno, col, node.attr, "")]
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
                if (
                    module_names.last_part(node.func) in checkout.SELF_NAMING
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                ):
                    seen.add(id(node.args[0]))  # TypeVar("T") names its own binding
        for node in ast.walk(src.tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and id(node) not in module_values:
                target = aliases.get(node.id)
                if target is not None and target != "kiln":
                    scan.escaped.add(target)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                self._string(scan, node, loose=id(node) not in seen)
        if scan.path.is_relative_to(checkout.IMAGE_SCRIPTS):  # a script beside the in-image modules: every word
            scan.string_words |= set(checkout.IDENT.findall(src.text))

    def _attr_call(
        self, scan: FileScan, node: ast.Call, aliases: dict[str, str], module_values: set[int], seen: set[int]
    ) -> None:
        """setattr(m, "name", ...), monkeypatch.setattr(m, "name", ...), mock.patch.object(m, "name")."""
        func = module_names.last_part(node.func)
        patch_object = (
            func == "object"
            and isinstance(node.func, ast.Attribute)
            and module_names.last_part(node.func.value) == "patch"
        )
        if (func not in checkout.ATTR_CALLS and not patch_object) or len(node.args) < 2:
            return
        target = self._chain(node.args[0], aliases)
        name = node.args[1]
        if target is None or not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
            return
        module_values.add(id(node.args[0]))
        seen.add(id(name))  # not a loose string as well
        edit = self._string_edit(scan, name, name.value)
        scan.refs.append(Ref(target, name.value, scan.path, [edit] if edit else [], "attribute string"))

    def _string_edit(self, scan: FileScan, node: ast.Constant, name: str) -> checkout.Edit | None:
        """The edit that renames the last dotted part `name` of a one-line plain string literal."""
        assert scan.source is not None
        raw = scan.source.segment(node)
        if raw is None or raw[:1] not in (b'"', b"'") or raw[1:-1].decode() != str(node.value):
            return None
        return checkout.Edit(scan.path, node.lineno, node.col_offset + len(raw) - 1 - len(name.encode()), name, "")

    def _string(self, scan: FileScan, node: ast.Constant, loose: bool) -> None:
        """A string that may name a module-level name: `"kiln.a.b.name"`, or (`loose`: no
        key, no comparison, not already read as an attribute's name) `"name"`, `"m.name"`."""
        value = str(node.value)
        scan.string_words.update(checkout.IDENT.findall(value))
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
        if checkout.IDENT.fullmatch(value):
            scan.strings.add(value)
        else:
            scan.dotted_strings.update(re.findall(r"([A-Za-z_]\w*)\.([A-Za-z_]\w*)", value))


def markdown_code(text: str) -> list[tuple[str, ...]]:
    """The dotted names a Markdown document's code spans are (`name`, `module.name(...)`,
    `Class.method`); fenced blocks are shell, YAML, JSON and text here, not Python."""
    text = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.DOTALL | re.MULTILINE)
    out = []
    for span in re.findall(r"`([^`\n]+)`", text):
        m = re.fullmatch(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:\(.*\)|\[.*\])?", span.strip())
        if m:
            out.append(tuple(m.group(1).split(".")))
    return out


def text_references() -> set[tuple[str, str]]:
    """(module, name) pairs that TEXT_FILES name: `kiln.a.b:name`, `kiln.a.b.name`,
    `from kiln.a.b import name, other`."""
    found: set[tuple[str, str]] = set()
    for pattern in checkout.TEXT_FILES:
        for path in sorted(checkout.ROOT.glob(pattern)):
            if not path.is_file():
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            found.update(re.findall(r"\b(kiln(?:\.\w+)*)[.:](\w+)", text))
            for module, names in re.findall(r"from\s+(kiln(?:\.\w+)*)\s+import\s+([\w, ]+)", text):
                found.update((module, n.strip()) for n in names.split(",") if n.strip())
    return found
