"""Exit codes are part of the CLI contract: one per error class, each with a hint."""

from __future__ import annotations

import importlib.util
import inspect
import re
from collections import Counter

from kilntest import REPO

from kiln.basics import errors


def _classes():
    """Every KilnError subclass of the package's namespace."""
    return [
        c
        for _, c in inspect.getmembers(errors, inspect.isclass)
        if issubclass(c, errors.KilnError) and c is not errors.KilnError
    ]


def test_every_error_class_has_its_own_exit_code_and_a_hint():
    classes = _classes()
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


DOC = REPO / "docs" / "cli-json.md"
ROW = re.compile(r"^\| (\w+) \| (\d+) \| `(\w+)` \|", re.MULTILINE)


def test_the_exit_code_table_is_generated_from_the_errors_package():
    script = _exit_codes_script()
    doc = DOC.read_text()
    assert doc == script.updated(doc), (
        "docs/cli-json.md's exit-code table differs from src/kiln/basics/errors/: run `python scripts/exit_codes.py`"
    )


def _table_problems(doc: str, classes: list[type]) -> list[str]:
    """What is wrong with the table in `doc` for `classes`: a class not listed exactly once,
    or with another code or family; a code on two rows; a row for no class."""
    rows = ROW.findall(doc)
    problems = []
    for cls in classes:
        mine = [(family, int(code)) for family, code, name in rows if name == cls.__name__]
        family = cls.__module__.rpartition(".")[2]
        if mine != [(family, cls.exit_code)]:
            problems.append(f"{cls.__name__} (exit {cls.exit_code}, {family}) is listed as {mine}")
    codes = Counter(int(code) for _, code, _ in rows)
    problems += [f"exit {code} is on {n} rows" for code, n in sorted(codes.items()) if n > 1]
    known = {c.__name__ for c in classes}
    problems += [f"a row for {name}, which is no error class" for _, _, name in rows if name not in known]
    return problems


def test_every_error_class_is_in_the_table_once_with_its_code_and_family():
    assert _table_problems(DOC.read_text(), _classes()) == []


def test_the_table_check_can_fail():
    """A code changed, a row doubled (two classes on one code) and a row removed are each caught."""
    doc = DOC.read_text()
    row = next(line for line in doc.splitlines() if line.startswith("| engine | 36 | `EngineOutdated` |"))
    assert any(
        "EngineOutdated" in p for p in _table_problems(doc.replace(row, row.replace("| 36 |", "| 39 |")), _classes())
    )
    doubled = doc.replace(row, f"{row}\n{row.replace('EngineOutdated', 'EngineAhead')}")
    assert "exit 36 is on 2 rows" in _table_problems(doubled, _classes())
    assert any("EngineOutdated" in p for p in _table_problems(doc.replace(row + "\n", ""), _classes()))


def test_every_error_class_lives_in_a_family_module():
    """`base` holds what every error shares; each class is in the module of its family,
    and each family named in FAMILIES is a module of the package with a class in it."""
    modules = {p.stem for p in (REPO / "src" / "kiln" / "basics" / "errors").glob("*.py")} - {"__init__", "base"}
    assert set(errors.FAMILIES) == modules and len(errors.FAMILIES) == len(modules)
    homes = {c.__module__ for c in _classes()}
    assert homes == {f"kiln.basics.errors.{family}" for family in errors.FAMILIES}


def test_a_new_error_class_changes_the_table():
    """The comparison can fail: a class added to the errors package is a new row in its
    family, with its docstring's first sentence (or its name in words when it has none)."""
    script = _exit_codes_script()
    module = script._load_errors()
    doc = DOC.read_text()

    class RegistryQuotaExceeded(module.KilnError):
        """The registry refused the push: over quota. More detail here."""

        exit_code = 99
        hint = "free space in the repository"

    class NoSBOM(module.KilnError):
        exit_code = 98
        hint = "x"

    for cls, family in ((RegistryQuotaExceeded, "publishing"), (NoSBOM, "supplychain")):
        cls.__module__ = f"kiln.basics.errors.{family}"
        setattr(module, cls.__name__, cls)
    table = script.table(module)
    assert "| publishing | 99 | `RegistryQuotaExceeded` | The registry refused the push: over quota. |" in table
    assert "| supplychain | 98 | `NoSBOM` | no SBOM |" in table
    assert (
        table.index("`ImageNotPublished`") < table.index("`RegistryQuotaExceeded`") < table.index("`SigningKeyInvalid`")
    )
    assert script.updated(doc, module) != doc
