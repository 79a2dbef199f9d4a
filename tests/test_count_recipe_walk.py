"""scripts/count_recipe_walk.py on a tiny package: the stops in
visit order, the message left out, and the returns to a module the walk had left."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from kilntest import REPO

SCRIPT = REPO / "scripts" / "count_recipe_walk.py"

FILES = {
    "pkg/__init__.py": "",
    "pkg/a.py": """
from pkg import b


def start(name):
    thing = b.load(name)
    unknown = b.untyped(name)
    b.other(thing)
    log(f"{name} loaded")
    helper(thing)
    helper2(unknown)
    b.last(thing.x)


def helper(thing):
    pass


def helper2(value):
    pass


def log(message):
    pass
""",
    "pkg/b.py": """
from pkg.c import Thing


def load(name) -> Thing:
    return Thing(name)


def untyped(name):
    return name


def other(thing):
    pass


def last(value):
    pass
""",
    "pkg/c.py": """
class Thing:
    def __init__(self, name):
        self.x = name
""",
}


@pytest.fixture(scope="module")
def walk_script():
    spec = importlib.util.spec_from_file_location("count_recipe_walk", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["count_recipe_walk"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules["count_recipe_walk"]


def _package(root: Path) -> Path:
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_walk_follows_the_name_and_what_is_resolved_from_it(tmp_path, walk_script):
    stops = walk_script.walk(_package(tmp_path), "pkg.a.start", "name", ("pkg.c",))
    assert [(s.module, s.function) for s in stops] == [
        ("pkg.a", "start"),
        ("pkg.b", "load"),
        ("pkg.c", "Thing"),
        ("pkg.b", "untyped"),  # back in b (after c): a return
        ("pkg.b", "other"),  # `thing` came from a function returning a recipe type
        ("pkg.a", "helper"),  # back in a: a return; log(f"...") is a message, not followed
        ("pkg.b", "last"),  # back in b: a return; helper2(unknown) is not: untyped() returns no recipe type
    ]
    assert walk_script.returns(stops) == 3


def test_the_script_prints_its_definition_and_the_three_numbers(tmp_path):
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(_package(tmp_path)), "--start", "pkg.a.start", "--types", "pkg.c"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.startswith("walk: depth first")
    assert "  7 pkg.b  last  <- return" in out
    assert out.endswith("stops: 7\nmodules: 3\nreturns to a module it had left: 3\n")


def test_an_unknown_start_is_said(tmp_path):
    cli = subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(_package(tmp_path)), "--start", "pkg.a.nothing"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert cli.returncode != 0 and "no function pkg.a.nothing" in cli.stderr
