"""Private by default (docs/architecture.md, "Private names"): a module-level
name of src/kiln that no other module uses is `_private`, and no module takes a `_private`
name from a module of another package. scripts/privatize.py is both the rule and the
codemod that applies it; these tests run its check on this checkout, and its detectors
and rewrites on small samples made to fail."""

from __future__ import annotations

import importlib.util
import sys
import textwrap

import pytest
from kilntest import REPO

SRC = REPO / "src"


@pytest.fixture(scope="module")
def privatize():
    """scripts/privatize.py, imported from its file (scripts/ is no package)."""
    spec = importlib.util.spec_from_file_location("privatize_script", REPO / "scripts" / "privatize.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def _tree(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))


def test_no_module_takes_a_private_name_from_another_package(privatize):
    found = privatize.cross_package_private_imports(sorted((SRC / "kiln").rglob("*.py")), SRC)
    assert not found, (
        "private names used from another package: make each public (or move it "
        "into the package that uses it): " + "; ".join(found)
    )


def test_every_name_only_its_module_uses_is_private(privatize, capsys):
    code = privatize.main(["--check"])
    out = capsys.readouterr().out
    assert code == 0, (
        "public names no other module uses, dead names, or private names used from "
        "another package: run `python scripts/privatize.py --write` (or, for a name that "
        f"must stay public, add it to EXEMPT there, saying why):\n{out}"
    )


def test_the_import_rule_sees_a_private_name_taken_across_packages(privatize, tmp_path):
    src = tmp_path / "src"
    _tree(
        src,
        {
            "kiln/__init__.py": "",
            "kiln/a/__init__.py": "",
            "kiln/a/x.py": "def _helper() -> None: ...\n",
            "kiln/a/y.py": "from kiln.a.x import _helper\n",  # its own package: allowed
            "kiln/b/__init__.py": "",
            "kiln/b/z.py": "from kiln.a.x import _helper\nfrom kiln.a import x\nx._helper()\nx.__name__\n",
        },
    )
    assert privatize.cross_package_private_imports(sorted(src.rglob("*.py")), src) == [
        "kiln/b/z.py:1: kiln.a.x._helper",
        "kiln/b/z.py:3: kiln.a.x._helper",
    ]


SAMPLE = {
    "src/kiln/__init__.py": "",
    "src/kiln/a/__init__.py": "",
    "src/kiln/a/m.py": '''
        """A sample: `helper` is only this module's."""

        from typing import TypeVar

        T = TypeVar("T")
        LIMIT = 3  # what `helper` allows
        BY_NAME = 1  # read with getattr() by kiln.b.n


        class Oops(Exception):
            """An exception's name is data (`type(exc).__name__`): it stays."""


        def helper(x: T) -> T:
            return x


        def unused() -> int:
            return 1


        def api(limit: int = LIMIT) -> int:
            helper = 2  # a local of the same name: not the module's
            if limit < 0:
                raise Oops()
            return helper + limit


        def tested() -> int:
            return helper(LIMIT)


        class Box:
            def _peek(self) -> int:
                return 1
        ''',
    "src/kiln/b/__init__.py": "",
    "src/kiln/b/n.py": """
        from kiln.a import m
        from kiln.a.m import Box, api

        __all__ = ["use"]  # the package's surface: stays public
        _FIELD = "BY_NAME"


        def use() -> int:
            return api() + Box()._peek() + getattr(m, _FIELD)
        """,
    "tests/test_m.py": """
        from kiln.a import m


        def test_tested(monkeypatch):
            from kiln.a.m import tested

            monkeypatch.setattr(m, "LIMIT", 4)
            assert tested() == m.LIMIT
        """,
}


def test_the_codemod_renames_deletes_and_publicises_then_has_nothing_left(privatize, tmp_path, capsys):
    _tree(tmp_path, SAMPLE)
    root = ["--root", str(tmp_path)]
    assert privatize.main(["--check", *root]) == 1
    found = set(capsys.readouterr().out.splitlines())
    assert found == {
        "kiln.a.m:LIMIT -> _LIMIT: used only in its module and by tests (tests/test_m.py)",
        "kiln.a.m:T -> _T: used only in its module",
        "kiln.a.m:helper -> _helper: used only in its module",
        "kiln.a.m:tested -> _tested: used only in its module and by tests (tests/test_m.py)",
        "kiln.a.m:unused: used nowhere; delete it",
        "(attribute):_peek -> peek: a private method read from another package (src/kiln/b/n.py)",
    }
    assert privatize.main(["--write", *root]) == 0
    assert "changed 3 files" in capsys.readouterr().out
    module = (tmp_path / "src/kiln/a/m.py").read_text()
    for expected in (
        '"""A sample: `_helper` is only this module\'s."""',
        '_T = TypeVar("_T")',
        "_LIMIT = 3  # what `_helper` allows",
        "BY_NAME = 1",
        "class Oops(Exception):",
        "def _helper(x: _T) -> _T:",
        "def api(limit: int = _LIMIT) -> int:",
        "    helper = 2  # a local",
        "    return helper + limit",
        "def _tested() -> int:",
        "    return _helper(_LIMIT)",
        "    def peek(self) -> int:",
    ):
        assert expected in module, expected
    assert "unused" not in module and "\n\n\n\n" not in module
    assert "Box().peek() + getattr(m, _FIELD)" in (tmp_path / "src/kiln/b/n.py").read_text()
    test = (tmp_path / "tests/test_m.py").read_text()
    for expected in (
        "from kiln.a.m import _tested",
        'monkeypatch.setattr(m, "_LIMIT", 4)',
        "assert _tested() == m._LIMIT",
    ):
        assert expected in test, expected
    assert privatize.main(["--check", *root]) == 0
    assert privatize.main(["--write", *root]) == 0  # idempotent
    assert "changed 0 files" in capsys.readouterr().out
