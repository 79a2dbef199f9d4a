"""Print this checkout's code measures (a maintainer's gauge, not a test).

    python scripts/code_measures.py [--json]

- largest module: lines of the longest .py under src/, engine/, testkit/, docker-images/
- fullest folder: .py modules directly inside one package folder of src/, engine/, testkit/
- bare dict returns: functions whose return annotation is `dict`, `dict[str, Any|object]`
  or a list of those (a document without a type), in commands/ and in all of src/
- domain names only tests use: public top-level names of src/kiln/domain that no other
  module of src/, engine/, testkit/, benchmarks/, scripts/ or docs/ names, and no public
  signature of their own module names (the type of what a public function returns is
  public with it), but a test does
- strict: files `mypy --strict` reports errors in (0 when every module is strict)
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE_DIRS = ("src", "engine", "testkit")
BARE = re.compile(r"^(list\[)?dict(\[str, (Any|object)\])?\]?$")


def _modules(*dirs: str) -> list[Path]:
    return sorted(p for d in dirs for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts)


def largest_module() -> tuple[int, str]:
    return max(
        (len(p.read_text().splitlines()), str(p.relative_to(ROOT))) for p in _modules(*CODE_DIRS, "docker-images")
    )


def fullest_folder() -> tuple[int, str]:
    folders = {p.parent for p in _modules(*CODE_DIRS) if (p.parent / "__init__.py").exists()}
    return max((sum(1 for _ in f.glob("*.py")), str(f.relative_to(ROOT))) for f in folders)


def bare_dict_returns(under: str) -> list[str]:
    found = []
    for path in _modules(under):
        for node in ast.walk(ast.parse(path.read_text())):
            if (  # the inner condition keeps its own comment  # noqa: SIM102
                isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns
            ):
                if BARE.match(ast.unparse(node.returns).replace("typing.", "")):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    return found


def _public_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("_")}


def _public_signatures(tree: ast.Module) -> str:
    """The annotations of the module's public functions (and public methods of its
    public classes), as text."""
    parts: list[str] = []
    scopes = [tree.body] + [n.body for n in tree.body if isinstance(n, ast.ClassDef) and not n.name.startswith("_")]
    for body in scopes:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("_"):
                args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                parts += [ast.unparse(a.annotation) for a in args if a.annotation is not None]
                parts += [ast.unparse(node.returns)] if node.returns is not None else []
    return "\n".join(parts)


def _identifiers(paths: list[Path]) -> set[str]:
    found: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Name):
                found.add(node.id)
            elif isinstance(node, ast.Attribute):
                found.add(node.attr)
            elif isinstance(node, ast.alias):
                found.add(node.name.rsplit(".", 1)[-1])
    return found


def domain_names_only_tests_use() -> list[str]:
    sources = {p: p.read_text() for p in _modules(*CODE_DIRS, "benchmarks", "scripts")}
    sources.update({p: p.read_text() for p in sorted((ROOT / "docs").rglob("*.md"))})
    tests = _identifiers(_modules("tests"))  # names in code, not words in docstrings or data
    found = []
    for path in sorted(
        p
        for p in sources
        if p.suffix == ".py" and "domain" in p.relative_to(ROOT).parts and p.is_relative_to(ROOT / "src")
    ):
        tree = ast.parse(sources[path])
        signatures = _public_signatures(tree)
        for name in sorted(_public_names(tree)):
            word = re.compile(rf"\b{re.escape(name)}\b")
            elsewhere = any(word.search(text) for p, text in sources.items() if p != path)
            elsewhere = elsewhere or bool(word.search(signatures))
            if not elsewhere and name in tests:
                found.append(f"{path.relative_to(ROOT)}: {name}")
    return found


def not_strict() -> list[str]:
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout
    return sorted({line.split(":")[0] for line in out.splitlines() if ": error:" in line})


def main() -> int:
    lines, module = largest_module()
    count, folder = fullest_folder()
    report = {
        "largest_module": {"lines": lines, "path": module},
        "fullest_folder": {"modules": count, "path": folder},
        "bare_dict_returns_commands": bare_dict_returns("src/kiln/commands"),
        "bare_dict_returns_src": bare_dict_returns("src"),
        "domain_names_only_tests_use": domain_names_only_tests_use(),
        "files_not_strict": not_strict(),
    }
    if "--json" in sys.argv:
        print(json.dumps(report, indent=2))
        return 0
    print(f"largest module: {lines} lines ({module})")
    print(f"fullest folder: {count} modules ({folder})")
    for key in (
        "bare_dict_returns_commands",
        "bare_dict_returns_src",
        "domain_names_only_tests_use",
        "files_not_strict",
    ):
        print(f"{key.replace('_', ' ')}: {len(report[key])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
