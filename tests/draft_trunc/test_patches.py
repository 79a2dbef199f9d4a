"""The hook patches apply cleanly, in series order, to pristine vLLM: each engine
version's series to that version."""

from __future__ import annotations

import py_compile
import re
import shutil
import subprocess

import pytest
from dt_patched import SERIES_ROOT, VLLM_VERSIONS, patch_dir, series

SERIES = [(v, name) for v in VLLM_VERSIONS for name in series(v)]


def _touched(patch_text: str) -> list[str]:
    return re.findall(r"^\+\+\+ b/(\S+)", patch_text, flags=re.MULTILINE)


def test_one_series_per_engine_version():
    assert sorted(p.name for p in SERIES_ROOT.iterdir()) == sorted(VLLM_VERSIONS)
    assert not list(SERIES_ROOT.glob("*.patch")), "patches live in their engine version's folder"


@pytest.mark.parametrize("version", VLLM_VERSIONS)
def test_series_lists_every_patch_once(version):
    names = series(version)
    on_disk = sorted(p.name for p in patch_dir(version).glob("*.patch"))
    assert sorted(names) == on_disk and len(set(names)) == len(names)
    assert all(re.match(r"^\d{4}-[a-z0-9-]+\.patch$", name) for name in names)


@pytest.mark.parametrize("version, name", SERIES)
def test_patch_header(version, name):
    text = (patch_dir(version) / name).read_text()
    header = text.split("\n--- a/", 1)[0]
    assert re.search(r"^Why: \S", header, flags=re.MULTILINE), "needs a 'Why:' line"
    assert re.search(r"^Upstream: (yes|no|maybe) - \S", header, flags=re.MULTILINE)
    for path in _touched(text):
        assert path.startswith("vllm/")
        assert f"--- a/{path}" in text


@pytest.mark.network
@pytest.mark.kernels  # vLLM's sources (conftest vllm_src)
def test_series_applies_cleanly_and_compiles(vllm_src, vllm_version, tmp_path):
    if shutil.which("patch") is None:
        pytest.skip("GNU patch not installed")
    tree = tmp_path / "site-packages"
    names = series(vllm_version)
    folder = patch_dir(vllm_version)
    for name in names:
        for rel in _touched((folder / name).read_text()):
            dest = tree / rel
            if not dest.exists():
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(vllm_src / rel, dest)
    for name in names:
        for dry in (True, False):
            cmd = ["patch", "-p1", "--forward", "--batch", "-i", str(folder / name)]
            out = subprocess.run(
                cmd + (["--dry-run"] if dry else []), cwd=tree, capture_output=True, text=True, check=False
            )
            assert out.returncode == 0, f"{name}: {out.stdout}{out.stderr}"
            assert "offset" not in out.stdout and "fuzz" not in out.stdout, out.stdout
    runner = tree / "vllm/v1/worker/gpu/model_runner.py"
    text = runner.read_text()
    # 0.34.0 dropped the rejection sampler's invalid_drafts: the verify hook moved into it
    moved = vllm_version not in ("0.32.0", "0.33.0")
    for hook in (
        "draft_trunc.check_config(",
        "draft_trunc.mark_dead(",
        *(() if moved else ("draft_trunc.verify_mask(",)),
        "draft_trunc.graded(",
        "draft_trunc.log_step(",
        "draft_trunc.av_confidences(",
        "draft_trunc.note_request(",
    ):
        assert text.count(hook) == 1, hook
    if moved:
        sampler = (tree / "vllm/v1/worker/gpu/spec_decode/rejection_sampler.py").read_text()
        assert sampler.count("draft_trunc.verify_drafts(") == 1
        assert "verify_draft_sampled," in sampler
    for path in tree.rglob("*.py"):
        py_compile.compile(str(path), doraise=True)
