"""Structural rules of src/kiln that import-linter cannot see (docs/architecture.md):
an import inside a function is only for a heavy or optional dependency, and says why on
its own line, so the module's real dependencies stay readable at its top."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "kiln"


def _late_imports_without_reason() -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines), filename=str(path))
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(func):
                if isinstance(node, ast.Import | ast.ImportFrom) and "#" not in lines[node.lineno - 1]:
                    found.append(f"{path.relative_to(SRC.parent)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return found


def test_function_level_imports_say_why():
    offenders = _late_imports_without_reason()
    assert not offenders, (
        "import at the top of the module, or say on the same line why it must be "
        "late (`# late: ...`):\n" + "\n".join(offenders)
    )


def test_only_the_daemon_module_imports_the_docker_sdk():
    """The docker SDK's types and quirks stay behind one package (lint-imports enforces the
    same once the layered layout is in place)."""
    daemon = SRC.parent / "kiln/infra/docker"
    users = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            if any(n == "docker" or n.startswith("docker.") for n in names) and daemon not in path.parents:
                users.append(f"{path.relative_to(SRC.parent)}:{node.lineno}")
    assert daemon.is_dir() and not users, users
