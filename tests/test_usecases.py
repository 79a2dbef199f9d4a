"""The use-cases layer (docs/architecture.md, "Use-cases"): its Python example runs as
written, and no use-case writes on stdout (its command prints what it returns)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from kilntest import REPO

from kiln.domain.recipes.resolved import ResolvedRecipe
from kiln.usecases import build, smoke

DOC = REPO / "docs" / "architecture.md"
MARKER = "<!-- python-api: build, then smoke -->"
USECASES = REPO / "src" / "kiln" / "usecases"


def _example() -> str:
    """The Python block right after the marker in docs/architecture.md."""
    lines = DOC.read_text().splitlines()
    start = lines.index(MARKER) + 1
    assert lines[start] == "```python", (
        f"docs/architecture.md:{start + 1}: the marker is not followed by a python block"
    )
    end = lines.index("```", start + 1)
    return "\n".join(lines[start + 1 : end]) + "\n"


def test_the_documented_example_builds_then_smokes_the_resolved_recipe(monkeypatch, capsys):
    """Both use-cases replaced by recorders: the example hands each the recipe resolved
    once, in order, and prints what they return."""
    calls: list[tuple[str, ResolvedRecipe]] = []

    def built(recipe: ResolvedRecipe, **kwargs: object) -> SimpleNamespace:
        calls.append(("build", recipe))
        return SimpleNamespace(image_id="sha256:" + "ab" * 32)

    def smoked(recipe: ResolvedRecipe, **kwargs: object) -> dict[str, object]:
        calls.append(("smoke", recipe))
        return {"passed": True}

    monkeypatch.setattr(build, "build_recipe", built)
    monkeypatch.setattr(smoke, "smoke", smoked)
    exec(compile(_example(), str(DOC), "exec"), {})  # the block, as a reader would run it
    assert [what for what, _ in calls] == ["build", "smoke"]
    assert all(isinstance(recipe, ResolvedRecipe) and recipe.name == "tiny-moe" for _, recipe in calls)
    assert calls[0][1] is calls[1][1]  # resolved once
    assert capsys.readouterr().out == f"sha256:{'ab' * 32} True\n"


def _writes_stdout(source: str) -> list[int]:
    """The lines of `source` that write on stdout: print(), log.out, log.emit_json, sys.stdout."""
    stdout = {("log", "out"), ("log", "emit_json"), ("sys", "stdout")}
    found = []
    for node in ast.walk(ast.parse(source)):
        printed = isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"
        written = (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and (node.value.id, node.attr) in stdout
        )
        if printed or written:
            found.append(node.lineno)
    return sorted(found)


def test_no_use_case_writes_on_stdout():
    found = [
        f"{path.relative_to(REPO)}:{line}"
        for path in sorted(USECASES.glob("*.py"))
        for line in _writes_stdout(path.read_text())
    ]
    assert not found, f"a use-case writes on stdout (its command prints what it returns): {found}"


def test_the_stdout_check_can_fail():
    source = "from kiln.basics import log\nprint('x')\nlog.out.print('y')\nlog.emit_json({})\nlog.info('z')\n"
    assert _writes_stdout(source) == [2, 3, 4]


@pytest.mark.e2e
@pytest.mark.docker
def test_the_documented_example_runs_for_real(tiny_moe, tmp_path: Path):
    """The block, run as a reader would (its own process, the checkout as the working
    directory): tiny-moe is up to date, so it is found, then served and smoke-tested."""
    env = {**os.environ, "KILN_STATE_DIR": str(tmp_path / "state")}
    result = subprocess.run(
        [sys.executable, "-c", _example()], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr[-4000:]
    image_id, passed = result.stdout.split()
    assert image_id == tiny_moe.image.id
    assert passed == "True"
