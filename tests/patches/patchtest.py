"""Helpers for the patch-tooling tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

from pathlib import Path


def add_feature(root: Path, feature: str, override_yaml: str, files: dict[str, bytes]) -> Path:
    """experimental/<feature>/ in the copied tiny-moe recipe, switched on."""
    recipe = root / "recipes" / "tiny-moe"
    fdir = recipe / "experimental" / feature
    fdir.mkdir(parents=True)
    (fdir / "override.yaml").write_text(override_yaml)
    for rel, data in files.items():
        (fdir / rel).parent.mkdir(parents=True, exist_ok=True)
        (fdir / rel).write_bytes(data)
    text = (recipe / "recipe.yaml").read_text()
    if "\nexperimental:" not in text:
        text = text.replace("\nsmoke:", f"\nexperimental: [{feature}]\nsmoke:", 1)
    (recipe / "recipe.yaml").write_text(text)
    return fdir
