"""docs/architecture.md matches the code: every module it names exists, every module under
src/kiln is named there, every command module is wired into cli.py's COMMANDS, and each
command module's row lists exactly the commands that module registers."""

from __future__ import annotations

import argparse
import importlib
import re

from kilntest import REPO

from kiln import cli

SRC = REPO / "src"
KILN = SRC / "kiln"
DOC = REPO / "docs" / "architecture.md"
LAYER_DIRS = {"commands", "domain", "infra", "basics"}
# `kiln/domain/patching/`, `kiln/cli.py`; and the data flow's short `commands/images/build.py`
FULL_NAME = re.compile(r"`(kiln/[\w/]*?(?:\.py|/))`")
SHORT_NAME = re.compile(r"(?<![\w/])((?:commands|domain|infra|basics)/[\w/]+\.py)\b")
# a command module's row; its name relative to kiln/commands/, e.g. `images/build`
COMMAND_ROW = re.compile(r"^\| `kiln/commands/([\w/]+)\.py` \| ([^|]*) \|", re.MULTILINE)


def _doc() -> str:
    return DOC.read_text()


def _named(text: str) -> set[str]:
    """Paths relative to src/ the text names (a folder ends with /)."""
    return set(FULL_NAME.findall(text)) | {f"kiln/{m}" for m in SHORT_NAME.findall(text)}


def _modules() -> list[str]:
    """Every module file under src/kiln, relative to src/; a package is its folder (its
    __init__.py is the package itself, named by the folder)."""
    found = []
    for path in sorted(KILN.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if path.name == "__init__.py":
            if path.parent == KILN or (path.parent.name in LAYER_DIRS and path.parent.parent == KILN):
                continue  # kiln/ and the layer folders are the table's rows, not modules
            rel = path.parent.relative_to(SRC).as_posix() + "/"
        found.append(rel)
    return found


def _covered(module: str, named: set[str]) -> bool:
    """Named itself, or inside a sub-package (below a layer folder) that is named and whose
    modules the document leaves to the package's own docstring: a package has a row for
    every module of its own, or for none."""
    if module in named:
        return True
    parts = module.rstrip("/").split("/")
    # kiln/domain/patching/series.py is covered by kiln/domain/patching/, not by kiln/domain/
    for i in range(3, len(parts)):
        package = "/".join(parts[:i]) + "/"
        if package in named and not any(n.startswith(package) and n != package for n in named):
            return True
    return False


def test_every_module_the_document_names_exists():
    missing = sorted(name for name in _named(_doc()) if not (SRC / name).exists())
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def test_every_module_is_named_in_the_document():
    named = _named(_doc())
    unnamed = [m for m in _modules() if not _covered(m, named)]
    assert not unnamed, f"modules docs/architecture.md does not name (add a row): {unnamed}"


def _command_modules() -> list[str]:
    """Command modules as dotted names below kiln.commands (`images.build`), sub-packages included."""
    commands = KILN / "commands"
    return sorted(
        ".".join(p.relative_to(commands).with_suffix("").parts)
        for p in commands.rglob("*.py")
        if p.name != "__init__.py"
    )


def test_every_command_module_is_in_cli_commands_and_nothing_else_is():
    registering = {
        name for name in _command_modules() if hasattr(importlib.import_module(f"kiln.commands.{name}"), "register")
    }
    wired = {m.__name__.removeprefix("kiln.commands.") for m in cli.COMMANDS}
    assert registering == wired, (
        f"modules with register() but not in cli.COMMANDS: {sorted(registering - wired)}; "
        f"in COMMANDS without register(): {sorted(wired - registering)}"
    )
    assert len(cli.COMMANDS) == len(set(cli.COMMANDS)), "a module is listed twice in cli.COMMANDS"


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps its subparsers nowhere public
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _leaves(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, argparse.ArgumentParser]]:
    children = _subparsers(parser)
    if not children:
        return [(path, parser)]
    return [leaf for name, child in children.items() for leaf in _leaves(child, f"{path} {name}")]


def _registered() -> dict[str, set[str]]:
    """Command module name -> the top-level commands whose handlers it defines."""
    by_module: dict[str, set[str]] = {}
    for top, parser in _subparsers(cli._build_parser()).items():
        for path, leaf in _leaves(parser, top):
            func = leaf.get_default("func")
            assert callable(func), f"`kiln {path}` sets no func"
            module = func.__module__
            assert module.startswith("kiln.commands."), (
                f"`kiln {path}` runs {module}.{func.__name__}, not a command module"
            )
            by_module.setdefault(module.removeprefix("kiln.commands.").replace(".", "/"), set()).add(top)
    return by_module


def test_every_registered_command_has_its_module_and_its_row():
    documented = {
        module: {c.strip().strip("`") for c in cell.split(",") if c.strip()}
        for module, cell in COMMAND_ROW.findall(_doc())
    }
    registered = _registered()
    for module, commands in registered.items():
        assert documented.get(module) == commands, (
            f"docs/architecture.md's row for kiln/commands/{module}.py lists {sorted(documented.get(module, ()))}, "
            f"the module registers {sorted(commands)}"
        )
    extra = {m: c for m, c in documented.items() if c and m not in registered}
    assert not extra, f"rows list commands their modules do not register: {extra}"


def test_the_checks_can_fail():
    """A row removed and a module renamed in the text are both caught; a layer folder
    covers none of its modules, a named sub-package covers its own."""
    text = _doc()
    row = next(line for line in text.splitlines() if line.startswith("| `kiln/domain/serving/k8s.py`"))
    named = _named(text.replace(row + "\n", "").replace("domain/serving/k8s.py", "domain/k9s.py"))
    assert "kiln/domain/k9s.py" in named and not (SRC / "kiln/domain/k9s.py").exists()
    assert not _covered("kiln/domain/serving/k8s.py", named)
    assert _covered("kiln/domain/patching/series.py", named)
    assert not _covered("kiln/domain/images/definitions.py", {"kiln/domain/"})
