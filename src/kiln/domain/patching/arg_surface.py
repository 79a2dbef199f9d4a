"""What an engine version's command line and speculative config accept, read statically
from its own unpacked sources (vLLM cannot be imported on the host: no torch), and what
changed between two versions.

CLI flags are the fields of `EngineArgs` / `AsyncEngineArgs` (vllm/engine/arg_utils.py)
and of the OpenAI frontend's `BaseFrontendArgs` / `FrontendArgs`
(vllm/entrypoints/common/cli_args.py): a field `max_model_len` is the flag
`--max-model-len`; every `--flag` literal an `add_argument(...)` call of those classes
names is a flag too. Speculative-config keys are the init fields of `SpeculativeConfig`
(vllm/config/speculative.py). A default written as a reference to a config class
(`ModelConfig.max_model_len`, `get_field(KernelConfig, "x")`) is resolved against that
class's field in vllm/config/, so a default changed there shows up here.

"Renamed" cannot be known statically: a field that is gone is "removed"; where the new
sources say it is deprecated (a docstring, or a string naming it with "deprecated"),
that line is quoted as the note, and nothing is guessed.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

# (file under the site-packages root, the classes whose fields are CLI flags)
_FLAG_SOURCES = (
    ("vllm/engine/arg_utils.py", ("EngineArgs", "AsyncEngineArgs")),
    ("vllm/entrypoints/common/cli_args.py", ("BaseFrontendArgs", "FrontendArgs")),
)
_SPEC_SOURCE = ("vllm/config/speculative.py", ("SpeculativeConfig",))
_CONFIG_DIR = "vllm/config"
FLAG = "flag"
_SPEC = "speculative_config"
_DEPRECATED = re.compile(r"(?<![\w-])deprecat", re.IGNORECASE)
_FIELD_CALLS = {"Field", "field"}


@dataclass(frozen=True)
class _Setting:
    """One flag or speculative-config key of one engine version. default: its default
    as source text, resolved through config-class references (None: a flag with no
    field behind it); expression: the default as written, when that differs;
    deprecated: the source line saying it is deprecated, if any."""

    name: str
    default: str | None = None
    expression: str | None = None
    deprecated: str | None = None


@dataclass(frozen=True)
class _Surface:
    """What one engine version accepts, and the files it was read from."""

    flags: dict[str, _Setting]
    speculative: dict[str, _Setting]
    read: list[str] = field(default_factory=list)
    deprecations: list[str] = field(default_factory=list)  # every string of those files saying "deprecated"


@dataclass(frozen=True)
class Change:
    """One difference between two versions. kind: FLAG (name without `--`) or SPEC;
    change: removed | added | default (its default changed) | deprecated (newly)."""

    kind: str
    name: str
    change: str
    old: str | None = None
    new: str | None = None
    note: str | None = None

    @property
    def shown(self) -> str:
        """The name as written on a command line: `--flag` for a flag, the key as is otherwise."""
        return f"--{self.name}" if self.kind == FLAG else self.name


class _Module(ast.NodeVisitor):
    """One parsed source file: its classes and the string constants that say 'deprecated'."""

    def __init__(self, text: str) -> None:
        self.tree = ast.parse(text)
        self.classes = {n.name: n for n in ast.walk(self.tree) if isinstance(n, ast.ClassDef)}
        self.deprecations = [
            _one_line(n.value)
            for n in ast.walk(self.tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and _DEPRECATED.search(n.value)
        ]


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= 200 else line[:197] + "..."


class _Configs:
    """The config classes under vllm/config/, parsed on first use, for resolving
    `SomeConfig.field` defaults."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._classes: dict[str, ast.ClassDef] | None = None

    def get(self, name: str) -> ast.ClassDef | None:
        if self._classes is None:
            self._classes = {}
            for path in sorted((self.root / _CONFIG_DIR).rglob("*.py")):
                try:
                    module = _Module(path.read_text(encoding="utf-8"))
                except (SyntaxError, UnicodeDecodeError):
                    continue
                for cname, node in module.classes.items():
                    self._classes.setdefault(cname, node)
        return self._classes.get(name)


def _class_fields(cls: ast.ClassDef) -> dict[str, tuple[ast.expr | None, str | None]]:
    """name -> (default expression, its docstring) of a dataclass's init fields."""
    out: dict[str, tuple[ast.expr | None, str | None]] = {}
    body = cls.body
    for i, node in enumerate(body):
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        if "ClassVar" in ast.unparse(node.annotation) or _not_init(node.value):
            continue
        nxt = body[i + 1] if i + 1 < len(body) else None
        doc = (
            nxt.value.value
            if (isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str))
            else None
        )
        out[node.target.id] = (node.value, doc)
    return out


def _not_init(value: ast.expr | None) -> bool:
    return (
        isinstance(value, ast.Call)
        and _call_name(value) in _FIELD_CALLS
        and any(
            k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False for k in value.keywords
        )
    )


def _call_name(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _written_default(value: ast.expr | None) -> ast.expr | str | None:
    """The default a field's right-hand side sets: `Field(default=X)` / `field(default=X)`
    is X, `field(default_factory=F)` is the text `F()`; None for no default."""
    if value is None:
        return None
    if isinstance(value, ast.Call) and _call_name(value) in _FIELD_CALLS:
        for kw in value.keywords:
            if kw.arg == "default":
                return kw.value
            if kw.arg == "default_factory":
                factory = ast.unparse(kw.value)
                simple = isinstance(kw.value, (ast.Name, ast.Attribute))
                return f"{factory}()" if simple else f"({factory})()"
        return value.args[0] if value.args else None
    return value


def _reference(expr: ast.expr) -> tuple[str, str] | None:
    """(class, field) when a default refers to a config class's field."""
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id[:1].isupper():
        return expr.value.id, expr.attr
    if (
        isinstance(expr, ast.Call)
        and _call_name(expr) == "get_field"
        and len(expr.args) == 2
        and isinstance(expr.args[0], ast.Name)
        and isinstance(expr.args[1], ast.Constant)
        and isinstance(expr.args[1].value, str)
    ):
        return expr.args[0].id, expr.args[1].value
    return None


def _resolve(written: ast.expr | str | None, configs: _Configs, depth: int = 0) -> str | None:
    """The default as source text, following config-class references (3 levels at most)."""
    if written is None or isinstance(written, str):
        return written
    ref = _reference(written)
    if ref is not None and depth < 3:
        cls = configs.get(ref[0])
        fields = _class_fields(cls) if cls is not None else {}
        if ref[1] in fields:
            return _resolve(_written_default(fields[ref[1]][0]), configs, depth + 1)
    return ast.unparse(written)


def _settings(module: _Module, classes: tuple[str, ...], configs: _Configs, flags: bool) -> dict[str, _Setting]:
    out: dict[str, _Setting] = {}
    for cname in classes:
        cls = module.classes.get(cname)
        if cls is None:
            continue
        for name, (value, doc) in _class_fields(cls).items():
            written = _written_default(value)
            default = _resolve(written, configs)
            shown = written if isinstance(written, str) else ast.unparse(written) if written is not None else None
            key = name.replace("_", "-") if flags else name
            note = (
                _one_line(doc)
                if doc and _DEPRECATED.search(doc)
                else _mentioned(module.deprecations, name, key if flags else None)
            )
            out[key] = _Setting(key, default, shown if shown != default else None, note)
        if flags:
            for flag in _added_flags(cls):
                out.setdefault(
                    flag, _Setting(flag, deprecated=_mentioned(module.deprecations, flag.replace("-", "_"), flag))
                )
    return out


def _added_flags(cls: ast.ClassDef) -> list[str]:
    """Every `--flag` an `add_argument(...)` call in the class names (aliases too)."""
    found = []
    for node in ast.walk(cls):
        if isinstance(node, ast.Call) and _call_name(node) == "add_argument":
            found += [
                a.value[2:]
                for a in node.args
                if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("--")
            ]
    return found


def _mentioned(deprecations: list[str], snake: str, flag: str | None) -> str | None:
    """The first 'deprecated' string saying `--flag` (or the snake name, when it is
    distinctive: it has an underscore) is deprecated: the name, then "deprecat" in the
    same sentence ("--x is deprecated", "x (--x) is deprecated and will be removed")."""
    names = [f"--{re.escape(flag)}"] if flag else []
    if "_" in snake:
        names.append(rf"(?<![\w-]){re.escape(snake)}")
    if not names:
        return None
    pat = re.compile(rf"(?:{'|'.join(names)})(?![\w-])[^.]{{0,60}}?(?<![\w-])deprecat", re.IGNORECASE)
    return next((s for s in deprecations if pat.search(s)), None)


def read_surface(root: Path) -> _Surface:
    """The flags and speculative-config keys of the engine unpacked under `root` (a
    site-packages-like folder holding vllm/); files that are missing are left out."""
    configs = _Configs(root)
    flags: dict[str, _Setting] = {}
    spec: dict[str, _Setting] = {}
    read: list[str] = []
    deprecations: list[str] = []
    for rel, classes in (*_FLAG_SOURCES, _SPEC_SOURCE):
        path = root / rel
        if not path.is_file():
            continue
        module = _Module(path.read_text(encoding="utf-8"))
        read.append(rel)
        deprecations += module.deprecations
        if (rel, classes) == _SPEC_SOURCE:
            spec.update(_settings(module, classes, configs, flags=False))
        else:
            for key, setting in _settings(module, classes, configs, flags=True).items():
                flags.setdefault(key, setting)
    return _Surface(flags, spec, read, deprecations)


def compare(old: _Surface, new: _Surface) -> list[Change]:
    """Flags first, then speculative-config keys; each sorted by name."""
    return [
        *_compare(FLAG, old.flags, new.flags, new.deprecations),
        *_compare(_SPEC, old.speculative, new.speculative, new.deprecations),
    ]


def _compare(kind: str, old: dict[str, _Setting], new: dict[str, _Setting], said: list[str]) -> list[Change]:
    out = []
    for name in sorted(old.keys() | new.keys()):
        a, b = old.get(name), new.get(name)
        if b is None and a is not None:
            out.append(Change(kind, name, "removed", a.default, None, _removal_note(kind, a, said)))
        elif a is None and b is not None:
            out.append(Change(kind, name, "added", None, b.default, b.deprecated))
        elif a is not None and b is not None:
            if a.default != b.default:
                out.append(Change(kind, name, "default", a.default, b.default, b.deprecated))
            elif b.deprecated and not a.deprecated:
                out.append(Change(kind, name, "deprecated", a.default, b.default, b.deprecated))
    return out


def _removal_note(kind: str, gone: _Setting, said: list[str]) -> str | None:
    """What the sources say about a setting that is gone; nothing is guessed: a
    'deprecated' string of the new sources naming it, else the old sources' own
    deprecation of it."""
    snake = gone.name.replace("-", "_")
    now = _mentioned(said, snake, gone.name if kind == FLAG else None)
    if now:
        return f"new sources: {now}"
    return f"deprecated before: {gone.deprecated}" if gone.deprecated else None


def used_changes(changes: list[Change], flags: set[str], spec_keys: set[str]) -> list[Change]:
    """The changes that touch what a recipe uses (its flags without `--`, its
    speculative-config keys)."""
    return [c for c in changes if (c.name in flags if c.kind == FLAG else c.name in spec_keys)]
