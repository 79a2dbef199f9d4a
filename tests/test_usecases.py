"""The use-cases layer (docs/architecture.md, "Use-cases"): its Python example runs as
written, no use-case prints (its command prints what it returns; it says what it is doing
through kiln.usecases.progress), and the CLI shows that progress as kiln's lines."""

from __future__ import annotations

import ast
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from kilntest import REPO

from kiln import cli
from kiln.domain.recipes.resolved import ResolvedRecipe
from kiln.usecases import build, progress, smoke

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


def _prints(source: str) -> list[int]:
    """The lines of `source` that print: print(), anything of kiln.basics.log's but its
    human_* formatters (which a use-case imports by name), sys.stdout or sys.stderr."""
    streams = {("sys", "stdout"), ("sys", "stderr")}
    found = []
    for node in ast.walk(ast.parse(source)):
        printed = isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"
        written = (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and (node.value.id == "log" or (node.value.id, node.attr) in streams)
        )
        if printed or written:
            found.append(node.lineno)
    return sorted(found)


def test_no_use_case_prints():
    found = [
        f"{path.relative_to(REPO)}:{line}"
        for path in sorted(USECASES.glob("*.py"))
        for line in _prints(path.read_text())
    ]
    assert not found, f"a use-case prints (kiln.usecases.progress says what it does; its command prints): {found}"


def test_the_print_check_can_fail():
    source = "from kiln.basics import log\nprint('x')\nlog.out.print('y')\nlog.warn('z')\nsys.stderr.write('w')\n"
    assert _prints(source) == [2, 3, 4, 5]


def test_progress_shows_nothing_without_the_cli_and_kiln_lines_with_it(monkeypatch, capsys):
    """A caller in Python sees no progress unless it asks; main's handler shows each kind
    of record as the line kiln.basics.log prints for it, installed once."""
    monkeypatch.setattr(progress.LOGGER, "handlers", [logging.NullHandler()])
    progress.step("building")
    assert capsys.readouterr().err == ""
    cli._show_progress()
    cli._show_progress()  # main runs it on every call (tests run main in-process)
    assert [type(h) for h in progress.LOGGER.handlers].count(cli._ProgressLines) == 1
    progress.step("building")
    progress.ok("done")
    progress.warn("careful")
    progress.summary("built", {"tag": "kiln/x:1", "took": "2 s"})
    progress.verdict(False, "chat", "empty")
    err = capsys.readouterr().err
    assert "==> building\n" in err
    assert "ok done\n" in err
    assert "warning: careful\n" in err
    assert "built\n  tag   kiln/x:1\n  took  2 s\n" in err
    assert "FAIL chat: empty\n" in err


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
