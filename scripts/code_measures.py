"""Print issue 34's code measures for this checkout (a maintainer's gauge, not a test).

    python scripts/code_measures.py [--json]

- largest module: lines of the longest .py under src/, engine/, testkit/, docker-images/
- fullest folder: .py modules directly inside one package folder of src/, engine/, testkit/
- bare dict returns: functions whose return annotation is `dict`, `dict[str, Any|object]`
  or a list of those (a document without a type), in commands/ and in all of src/
- domain names only tests use: public top-level names of src/kiln/domain that no other
  module of src/ (or engine/, testkit/) names, but a test does
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
        (len(p.read_text().splitlines()), str(p.relative_to(ROOT)))
        for p in _modules(*CODE_DIRS, "docker-images")
    )


def fullest_folder() -> tuple[int, str]:
    folders = {p.parent for p in _modules(*CODE_DIRS) if (p.parent / "__init__.py").exists()}
    return max((sum(1 for _ in f.glob("*.py")), str(f.relative_to(ROOT))) for f in folders)


def bare_dict_returns(under: str) -> list[str]:
    found = []
    for path in _modules(under):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns:
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


def domain_names_only_tests_use() -> list[str]:
    sources = {p: p.read_text() for p in _modules(*CODE_DIRS)}
    tests = "\n".join(p.read_text() for p in _modules("tests"))
    found = []
    for path in sorted(p for p in sources if "domain" in p.relative_to(ROOT).parts):
        for name in sorted(_public_names(ast.parse(sources[path]))):
            word = re.compile(rf"\b{re.escape(name)}\b")
            elsewhere = any(word.search(text) for p, text in sources.items() if p != path)
            if not elsewhere and word.search(tests):
                found.append(f"{path.relative_to(ROOT)}: {name}")
    return found


def not_strict() -> list[str]:
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict"], cwd=ROOT, capture_output=True, text=True
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
        print(f"{key.replace('_', ' ')}: {len(report[key])}")  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
