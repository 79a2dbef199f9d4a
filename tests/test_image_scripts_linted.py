"""Every Python script shipped from docker-images/common is in the lint session's list:
a new in-image script without a .py suffix would otherwise go unread by ruff
and mypy."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def linted() -> set[str]:
    """IMAGE_SCRIPTS as noxfile.py spells it, read without importing nox."""
    tree = ast.parse((REPO / "noxfile.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "IMAGE_SCRIPTS" for t in node.targets):
            names = next(n for n in ast.walk(node.value) if isinstance(n, ast.Tuple))
            return {ast.literal_eval(e) for e in names.elts}
    raise AssertionError("noxfile.py has no IMAGE_SCRIPTS")


def python_scripts(folder: Path) -> set[str]:
    def is_python(p: Path) -> bool:
        first = p.read_text(errors="replace").split("\n", 1)[0]
        return p.suffix == ".py" or (first.startswith("#!") and "python" in first)

    return {p.name for p in folder.iterdir() if p.is_file() and is_python(p)}


def test_every_in_image_python_script_is_linted():
    shipped = python_scripts(REPO / "docker-images" / "common")
    assert shipped, "docker-images/common holds no Python script: the scan is wrong"
    assert shipped == linted(), f"not linted: {sorted(shipped - linted())}; gone: {sorted(linted() - shipped)}"


def test_the_scan_sees_a_new_script(tmp_path):
    (tmp_path / "kiln-new").write_text("#!/opt/kiln/venv/bin/python\nprint(1)\n")
    (tmp_path / "with-ca").write_text("#!/bin/sh\ntrue\n")
    assert python_scripts(tmp_path) == {"kiln-new"}
