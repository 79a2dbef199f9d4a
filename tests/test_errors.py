"""Exit codes are part of the CLI contract: one per error class, each with a hint."""

from __future__ import annotations

import importlib.util
import inspect
import re

from kilntest import REPO

from kiln.basics import errors


def test_every_error_class_has_its_own_exit_code_and_a_hint():
    classes = [
        c
        for _, c in inspect.getmembers(errors, inspect.isclass)
        if issubclass(c, errors.KilnError) and c is not errors.KilnError
    ]
    codes = [c.exit_code for c in classes]
    assert len(codes) == len(set(codes)), sorted(codes)
    assert all(c.exit_code not in (0, 1) for c in classes)
    assert all(c.hint for c in classes), [c.__name__ for c in classes if not c.hint]


def test_recipe_errors_print_one_line_each_then_the_hint():
    exc = errors.RecipeInvalid(["a.yaml:1: x: bad", "a.yaml:2: y: bad"])
    assert exc.lines() == ["a.yaml:1: x: bad", "a.yaml:2: y: bad", f"hint: {exc.hint}"]


def _exit_codes_script():
    """scripts/exit_codes.py, imported from its file (scripts/ is no package)."""
    spec = importlib.util.spec_from_file_location("exit_codes", REPO / "scripts" / "exit_codes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_exit_code_table_is_generated_from_errors_py():
    script = _exit_codes_script()
    readme = (REPO / "README.md").read_text()
    assert readme == script.updated(readme), (
        "README.md's exit-code table differs from src/kiln/basics/errors/: run `python scripts/exit_codes.py`"
    )
    listed = {int(m) for m in re.findall(r"^\| (\d+) \| `\w+` \|", readme, re.MULTILINE)}
    classes = {
        c.exit_code
        for _, c in inspect.getmembers(errors, inspect.isclass)
        if issubclass(c, errors.KilnError) and c is not errors.KilnError
    }
    assert listed == classes, sorted(listed ^ classes)


def test_a_new_error_class_changes_the_table():
    """The comparison can fail: a class added to the errors package is a new row, with its
    docstring's first sentence (or its name in words when it has none)."""
    script = _exit_codes_script()
    module = script._load_errors()
    readme = (REPO / "README.md").read_text()

    class RegistryQuotaExceeded(module.KilnError):
        """The registry refused the push: over quota. More detail here."""

        exit_code = 99
        hint = "free space in the repository"

    class NoSBOM(module.KilnError):
        exit_code = 98
        hint = "x"

    for cls in (RegistryQuotaExceeded, NoSBOM):
        cls.__module__ = module.__name__
        setattr(module, cls.__name__, cls)
    table = script.table(module)
    assert "| 99 | `RegistryQuotaExceeded` | The registry refused the push: over quota. |" in table
    assert "| 98 | `NoSBOM` | no SBOM |" in table
    assert script.updated(readme, module) != readme
