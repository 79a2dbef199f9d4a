"""Exit codes are part of the CLI contract: one per error class, each with a hint."""

from __future__ import annotations

import inspect

from kiln.basics import errors


def test_every_error_class_has_its_own_exit_code_and_a_hint():
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass)
               if issubclass(c, errors.KilnError) and c is not errors.KilnError]
    codes = [c.exit_code for c in classes]
    assert len(codes) == len(set(codes)), sorted(codes)
    assert all(c.exit_code not in (0, 1) for c in classes)
    assert all(c.hint for c in classes), [c.__name__ for c in classes if not c.hint]


def test_recipe_errors_print_one_line_each_then_the_hint():
    exc = errors.RecipeInvalid(["a.yaml:1: x: bad", "a.yaml:2: y: bad"])
    assert exc.lines() == ["a.yaml:1: x: bad", "a.yaml:2: y: bad", f"hint: {exc.hint}"]
