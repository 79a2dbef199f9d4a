"""An image's source date and revision come from the newest commit touching its inputs:
a README-only commit moves neither; uncommitted input changes mark the revision dirty;
outside git, SOURCE_DATE_EPOCH (else 0)."""

from __future__ import annotations

import os
import subprocess

from kiln.domain.reproducible import source_date


def _git(root, *args, when: int | None = None):
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@e",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@e",
    }
    if when is not None:
        env["GIT_COMMITTER_DATE"] = env["GIT_AUTHOR_DATE"] = f"@{when} +0000"
    return subprocess.run(
        ["git", "-C", str(root), *args], check=True, capture_output=True, text=True, env=env
    ).stdout.strip()


def test_newest_commit_touching_the_inputs_not_head(tmp_path):
    root = tmp_path / "repo"
    (root / "inputs" / "tests").mkdir(parents=True)
    (root / "inputs" / "a.txt").write_text("a\n")
    (root / "inputs" / "tests" / "t.txt").write_text("t\n")
    (root / "README.md").write_text("readme\n")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "inputs", when=1_000_000)
    inputs_commit = _git(root, "rev-parse", "HEAD")
    sources = {root / "inputs": ("tests",)}

    assert source_date.of(sources, root) == source_date.SourceDate(1_000_000, inputs_commit)
    (root / "README.md").write_text("readme, edited\n")
    (root / "inputs" / "tests" / "t.txt").write_text("an excluded path\n")
    _git(root, "commit", "-qam", "readme and an excluded file", when=2_000_000)
    assert source_date.of(sources, root) == source_date.SourceDate(1_000_000, inputs_commit)

    (root / "inputs" / "a.txt").write_text("b\n")
    dirty = source_date.of(sources, root)
    assert dirty == source_date.SourceDate(1_000_000, inputs_commit + "-dirty") and dirty.commit == inputs_commit
    _git(root, "commit", "-qam", "input", when=3_000_000)
    assert source_date.of(sources, root) == source_date.SourceDate(3_000_000, _git(root, "rev-parse", "HEAD"))


def test_outside_git_the_date_is_source_date_epoch_or_zero(tmp_path, monkeypatch):
    (tmp_path / "inputs").mkdir()
    sources = {tmp_path / "inputs": ()}
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert source_date.of(sources, tmp_path) == source_date.SourceDate(0, "unknown")
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert source_date.of(sources, tmp_path) == source_date.SourceDate(1_700_000_000, "unknown")


def test_a_recipe_image_dates_from_its_dockerfile_too():
    """The recipe Dockerfile enters the context as bytes kiln made (with the harness's
    tail), so it is named as a source on its own."""
    from kiln.domain.images.definitions import resolve

    recipe_image = resolve("tiny-kindling").recipe_image
    sources = recipe_image.input_sources()
    assert recipe_image.loaded.dir / "Dockerfile" in sources
    assert recipe_image.loaded.dir in sources  # recipe.yaml and the rest of the folder
    assert any(p.name == "engine-cpu" for p in sources)  # the engine image's inputs


def test_an_exclude_never_hides_another_input(tmp_path):
    recipe = tmp_path / "recipes" / "r"
    specs = source_date._pathspecs(
        {
            recipe: ("Dockerfile", "experimental", "README.md"),
            recipe / "Dockerfile": (),
            recipe / "experimental" / "f": (),
        },
        tmp_path,
    )
    assert ":(top,exclude)recipes/r/README.md" in specs
    assert not any("exclude)recipes/r/Dockerfile" in s or "exclude)recipes/r/experimental" in s for s in specs)
    assert ":(top,literal)recipes/r/Dockerfile" in specs
