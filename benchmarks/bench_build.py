#!/usr/bin/env python3
"""`nox -s bench_build`: cold build, no-op rebuild and launch-config-only rebuild of a
small recipe (the stand-in engine of the build tests), as ratios from one run.

Goals: no-op rebuild <= 1 s; warm rebuild after a launch-config edit <= 5% of
the cold build. Times are wall-clock of the real `kiln build` CLI (interpreter start-up
included), so they are what a user waits for.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kiln_testkit.tree import make_tree

NAME = "kiln-test-mini"


def kiln(tree: Path, *args: str) -> float:
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "kiln", *args],
        env={**os.environ, "KILN_ROOT": str(tree)},
        cwd=tree,
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"kiln {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return elapsed


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
        tree = make_tree(Path(tmp) / "tree")
        print("bench_build: small recipe on the stand-in engine (kiln/base:bookworm must exist)")
        cold = kiln(tree, "build", NAME, "--force", "--force-engine", "--no-cache")
        noop = kiln(tree, "build", NAME)
        recipe = tree / "recipes" / NAME / "recipe.yaml"
        recipe.write_text(recipe.read_text().replace("max-model-len: 256", "max-model-len: 320"))
        warm = kiln(tree, "build", NAME)
    rows = [
        ("cold build (no layer cache)", cold, None),
        ("no-op rebuild", noop, "goal <= 1 s"),
        ("warm rebuild, launch-config edit", warm, "goal <= 5% of cold"),
    ]
    for label, secs, goal in rows:
        print(f"  {label:34} {secs:7.2f} s   {goal or ''}")
    print(f"  ratio no-op / cold                 {noop / cold:7.3f}   ({'meets' if noop <= 1.0 else 'misses'} <= 1 s)")
    print(
        f"  ratio warm / cold                  {warm / cold:7.3f}   "
        f"({'meets' if warm <= 0.05 * cold else 'misses'} <= 0.05)"
    )


if __name__ == "__main__":
    main()
