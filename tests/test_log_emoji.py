"""Line numbers survive the console: rich would turn `recipe.yaml:100:` into an emoji
(`:100:` is its shortcode for 💯), and a recipe's 100th line is where errors point."""

from __future__ import annotations

from kiln.basics import log


def test_error_lines_keep_their_line_numbers():
    for console in (log.errors, log.console, log.out):
        with console.capture() as captured:
            console.print("recipes/x/recipe.yaml:100: name: bad :thumbs_up:", markup=False)
        text = captured.get()
        assert "recipe.yaml:100: name" in text and ":thumbs_up:" in text, text
