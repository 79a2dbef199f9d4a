"""scripts/relayout.py's rewriting rules on small inputs, and its refusal to move a tree
holding a module it does not place (the full move is exercised on a throwaway
worktree, see the script's docstring)."""

from __future__ import annotations

import importlib.util
import subprocess

import pytest
from kilntest import REPO

spec = importlib.util.spec_from_file_location("relayout", REPO / "scripts" / "relayout.py")
relayout = importlib.util.module_from_spec(spec)
spec.loader.exec_module(relayout)

MOVES = {"build": "commands.build", "log": "basics.log", "dockerengine": "infra.docker",
         "patching": "domain.patching"}
PRESENT = {"build": "build.py", "log": "log.py", "dockerengine": "dockerengine.py", "patching": "patching/"}
DOTTED = {f"kiln.{k}": f"kiln.{v}" for k, v in MOVES.items()}


def test_from_kiln_imports_split_per_layer_keeping_names_and_comments():
    src = "from kiln import build, dockerengine, log  # noqa: E402\n"
    assert relayout.split_from_kiln_imports(src, MOVES).splitlines() == [
        "from kiln.basics import log  # noqa: E402",
        "from kiln.commands import build  # noqa: E402",
        "from kiln.infra import docker as dockerengine  # noqa: E402",
    ]


def test_dotted_names_move_but_labels_and_longer_names_do_not():
    line = 'mock("kiln.build.time"); import kiln.dockerengine; x = "ai.kiln.build.id"; kiln.buildx\n'
    assert relayout.rewrite_line(line, DOTTED, MOVES, PRESENT) == (
        'mock("kiln.commands.build.time"); import kiln.infra.docker; x = "ai.kiln.build.id"; kiln.buildx\n')


def test_file_paths_of_modules_and_packages_move():
    text = "see src/kiln/log.py and (../src/kiln/patching/applier.py), not kiln/logx.py\n"
    assert relayout.rewrite_paths(text, MOVES, PRESENT) == (
        "see src/kiln/basics/log.py and (../src/kiln/domain/patching/applier.py), not kiln/logx.py\n")


def test_relative_imports_become_absolute(tmp_path, monkeypatch):
    pkg = tmp_path / "src" / "kiln"
    (pkg / "patching").mkdir(parents=True)
    mod = pkg / "patching" / "bump.py"
    mod.write_text("from .. import log\nfrom ..errors import (\n    UsageError,\n)\nfrom .diff import merge3\n")
    monkeypatch.setattr(relayout, "PKG", pkg)
    assert relayout.absolutize(mod)
    assert mod.read_text() == ("from kiln import log\nfrom kiln.errors import (\n    UsageError,\n)\n"
                               "from kiln.patching.diff import merge3\n")


def test_a_module_missing_from_moves_stops_the_run_before_anything_changes(tmp_path, monkeypatch, capsys):
    pkg = tmp_path / "src" / "kiln"
    pkg.mkdir(parents=True)
    for name in ("__init__.py", "cli.py", "log.py", "brandnew.py"):
        (pkg / name).write_text("")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "."], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"],
                   check=True)
    monkeypatch.setattr(relayout, "ROOT", tmp_path)
    monkeypatch.setattr(relayout, "PKG", pkg)
    assert relayout.main() == 2
    err = capsys.readouterr().err
    assert "'brandnew'" in err and "'log'" not in err
    assert sorted(p.name for p in pkg.iterdir()) == ["__init__.py", "brandnew.py", "cli.py", "log.py"]


@pytest.mark.parametrize("layer", relayout.LAYERS[1:])
def test_every_move_lands_in_a_layer(layer):
    assert all(new.split(".")[0] in relayout.LAYERS for new in relayout.MOVES.values())
    assert any(new.startswith(f"{layer}.") for new in relayout.MOVES.values())
