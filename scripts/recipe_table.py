#!/usr/bin/env python3
"""Regenerate README.md's recipe table from the recipes (`--write`), or fail when it is
out of date (`--check`, the default; tests/test_recipe_table.py runs the same check)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kiln.domain.catalogue.readme_table import replace_in

README = Path(__file__).resolve().parents[1] / "README.md"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="rewrite README.md in place")
    args = p.parse_args()
    text = README.read_text()
    fresh = replace_in(text)
    if args.write:
        README.write_text(fresh)
        print(f"{README}: recipe table regenerated")
        return 0
    if fresh != text:
        print(f"{README}: the recipe table is out of date; run scripts/recipe_table.py --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
