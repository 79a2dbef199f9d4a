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
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    input: str | None = None,  # as subprocess.run names it  # noqa: A002
) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess (exit codes and output exactly as a user sees them)."""
    full_env = {**os.environ, "COLUMNS": "300", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "kiln", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd or REPO,
        input=input,
        timeout=1800,
        check=False,
    )


def make_tree(dest: Path) -> Path:
    """A kiln checkout in `dest`: the mini fixture plus the real shared sources."""
    shutil.copytree(FIXTURES / "minitree", dest)
    shutil.copytree(REPO / "docker-images" / "common", dest / "docker-images" / "common")
    # what recipes copied into the tree name in build.shared
    shutil.copytree(REPO / "recipes" / "_shared", dest / "recipes" / "_shared")
    shutil.copytree(
        REPO / "engine", dest / "engine", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "tests")
    )
    link_served_records(dest)
    return dest


def link_served_records(dest: Path) -> None:
    """The served runs' records the real recipes name (`served:`, which `kiln check` finds
    or refuses), linked into a checkout that copies recipes but not benchmarks/."""
    records = Path("benchmarks") / "gpu_twin" / "results"
    (dest / records).parent.mkdir(parents=True, exist_ok=True)
    (dest / records).symlink_to(REPO / records)


def renamed_mini(dest: Path, name: str, extra_yaml: str = "", replace: dict[str, str] | None = None) -> Path:
    """`make_tree(dest)` with its kiln-test-mini recipe renamed to `name`, lines of its
    recipe.yaml replaced (each must be there) and `extra_yaml` appended: the tree of
    tests that publish or build a recipe of their own. Returns the tree."""
    root = make_tree(dest)
    recipe_dir = root / "recipes" / name
    (root / "recipes" / "kiln-test-mini").rename(recipe_dir)
    recipe = recipe_dir / "recipe.yaml"
    text = recipe.read_text().replace("name: kiln-test-mini\n", f"name: {name}\n", 1)
    for old, new in (replace or {}).items():
        if old not in text:
            raise ValueError(f"{recipe}: no {old!r} to replace")
        text = text.replace(old, new, 1)
    recipe.write_text(text + extra_yaml)
    return root


def write_recipe(root: Path, text: str, name: str = "tiny-moe") -> Path:
    """recipes/NAME under `root` holding `text` as its recipe.yaml, a one-line FROM
    Dockerfile and the shared files recipes name in build.shared: enough to load it."""
    d = root / "recipes" / name
    d.mkdir(parents=True)
    (d / "recipe.yaml").write_text(text)
    (d / "Dockerfile").write_text("ARG KILN_ENGINE_IMAGE\nFROM ${KILN_ENGINE_IMAGE}\n")
    shutil.copytree(REPO / "recipes" / "_shared", d.parent / "_shared", dirs_exist_ok=True)
    return d
