"""The hook patches apply cleanly, in series order, to pristine vLLM 0.32.0."""

from __future__ import annotations

import py_compile
import re
import shutil
import subprocess
from pathlib import Path

import pytest

PATCH_DIR = (
    Path(__file__).resolve().parents[2] / "recipes/glm53-kindling/experimental/draft-trunc/patches"
)
SERIES = [line.strip() for line in (PATCH_DIR / "series").read_text().splitlines() if line.strip()]


def _touched(patch_text: str) -> list[str]:
    return re.findall(r"^\+\+\+ b/(\S+)", patch_text, flags=re.M)


def test_series_lists_every_patch_once():
    on_disk = sorted(p.name for p in PATCH_DIR.glob("*.patch"))
    assert sorted(SERIES) == on_disk and len(set(SERIES)) == len(SERIES)
    assert all(re.match(r"^\d{4}-[a-z0-9-]+\.patch$", name) for name in SERIES)


@pytest.mark.parametrize("name", SERIES)
def test_patch_header(name):
    text = (PATCH_DIR / name).read_text()
    header = text.split("\n--- a/", 1)[0]
    assert re.search(r"^Why: \S", header, flags=re.M), "needs a 'Why:' line"
    assert re.search(r"^Upstream: (yes|no|maybe) - \S", header, flags=re.M)
    for path in _touched(text):
        assert path.startswith("vllm/")
        assert f"--- a/{path}" in text


def test_series_applies_cleanly_and_compiles(vllm_src, tmp_path):
    if shutil.which("patch") is None:
        pytest.skip("GNU patch not installed")
    tree = tmp_path / "site-packages"
    for name in SERIES:
        for rel in _touched((PATCH_DIR / name).read_text()):
            dest = tree / rel
            if not dest.exists():
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(vllm_src / rel, dest)
    for name in SERIES:
        for dry in (True, False):
            cmd = ["patch", "-p1", "--forward", "--batch", "-i", str(PATCH_DIR / name)]
            out = subprocess.run(
                cmd + (["--dry-run"] if dry else []), cwd=tree, capture_output=True, text=True
            )
            assert out.returncode == 0, f"{name}: {out.stdout}{out.stderr}"
            assert "offset" not in out.stdout and "fuzz" not in out.stdout, out.stdout
    runner = tree / "vllm/v1/worker/gpu/model_runner.py"
    text = runner.read_text()
    for hook in (
        "draft_trunc.check_config(",
        "draft_trunc.mark_dead(",
        "draft_trunc.verify_mask(",
        "draft_trunc.graded(",
        "draft_trunc.log_step(",
    ):
        assert text.count(hook) == 1, hook
    for path in tree.rglob("*.py"):
        py_compile.compile(str(path), doraise=True)
