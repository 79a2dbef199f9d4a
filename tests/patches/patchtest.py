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


# Series left out of the copied checkout: these tests replay the 0.32.0 -> 0.33.0 move
# and check every series the copy holds against its wheel's sources; 0.34.0's wheel
# (CUDA only, ~340 MB) is not in CI's cache. `kiln patches check --engine vllm==0.34.0
# --flavour cuda` checks that series, and tests/draft_trunc takes it when named in
# KILN_DT_VLLM_VERSIONS.
LEFT_OUT = ("0.34.0",)


def left_out(folder: str, names: list[str]) -> list[str]:
    """shutil.copytree's ignore: the LEFT_OUT version folders."""
    return [n for n in names if n in LEFT_OUT]
