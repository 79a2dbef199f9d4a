"""The checkout the helpers belong to, throwaway kiln trees, and the real CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

# the kiln checkout this testkit lives in (testkit/kiln_testkit/tree.py)
REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"


def run_kiln(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess (exit codes and output exactly as a user sees them)."""
    full_env = {**os.environ, "COLUMNS": "300", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "kiln", *args], capture_output=True, text=True,
        env=full_env, cwd=cwd or REPO, input=input, timeout=1800,
    )


def make_tree(dest: Path) -> Path:
    """A kiln checkout in `dest`: the mini fixture plus the real shared sources."""
    shutil.copytree(FIXTURES / "minitree", dest)
    shutil.copytree(REPO / "docker-images" / "common", dest / "docker-images" / "common")
    # what recipes copied into the tree name in build.shared
    shutil.copytree(REPO / "recipes" / "_shared", dest / "recipes" / "_shared")
    shutil.copytree(REPO / "engine", dest / "engine",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "tests"))
    return dest
