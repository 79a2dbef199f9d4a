"""privatize's files and edits: the checkout it reads (--root moves it), the files whose
references count, and edits of one identifier each, checked against the file's bytes."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterable
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
def set_root(root: Path) -> None:
    global ROOT, SRC, PACKAGE, IMAGE_SCRIPTS
    ROOT = root.resolve()
    SRC = ROOT / "src"
    PACKAGE = SRC / "kiln"
    IMAGE_SCRIPTS = ROOT / "docker-images"
    PROSE.clear()


def py_files(*dirs: str) -> list[Path]:
    out: list[Path] = []
    for d in dirs:
        base = ROOT / d
        if base.is_file():
            out.append(base)
        elif base.is_dir():
            out += [p for p in base.rglob("*.py") if "__pycache__" not in p.parts and ".venv" not in p.parts]
    return sorted(set(out))


def image_scripts() -> list[Path]:
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


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def rel(path: Path) -> str:
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
                    f"privatize: {rel(path)}:{e.line}:{e.col}: expected {e.old!r}, "
                    f"found {line[e.col : e.col + len(old)]!r} (nothing written to it)"
                )
            lines[e.line - 1] = line[: e.col] + e.new.encode() + line[e.col + len(old) :]
        path.write_bytes(b"".join(lines))
    return sorted(by_file)


PROSE: dict[Path, list[tuple[int, int, bytes]]] = {}
