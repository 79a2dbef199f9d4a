"""The hook lines, as patched into each vLLM version, with and without kiln-engine."""

from __future__ import annotations

import ast
import shutil
from types import SimpleNamespace as NS

import pytest
from dt_patched import apply_series, imports_draft_trunc, run, statements, stub_vllm

# vLLM's sources from kiln's wheel cache: a fresh machine downloads the wheels (conftest vllm_src)
pytestmark = [pytest.mark.network, pytest.mark.kernels]

MR = "vllm/v1/worker/gpu/model_runner.py"
SPEC = "vllm/v1/worker/gpu/spec_decode/speculator.py"
LAYER = "vllm/model_executor/layers/fused_moe/layer.py"
RUNNER = "vllm/model_executor/layers/fused_moe/runner/moe_runner.py"
V1 = "vllm/v1/worker/gpu_model_runner.py"  # 0.32.0/0.33.0 (0008); 0.34.0 has no V1 runner
SAMPLER = "vllm/v1/worker/gpu/spec_decode/rejection_sampler.py"  # 0.34.0's verify hook (0003)


def _patched(tree, rel):
    """Skip a check of a file this version's series does not patch (apply_series copies
    only the files the series touches)."""
    if not (tree / rel).is_file():
        pytest.skip(f"{rel}: not patched on this engine version")


@pytest.fixture(scope="module")
def tree(vllm_src, vllm_version, tmp_path_factory):
    if shutil.which("patch") is None:
        pytest.skip("GNU patch not installed")
    return apply_series(vllm_src, tmp_path_factory.mktemp("patched"), vllm_version)


def _import_hooks(tree, rel):
    nodes = statements(tree / rel, imports_draft_trunc)
    assert nodes, f"{rel}: no draft_trunc import found"
    return nodes


@pytest.mark.parametrize("rel", [MR, SPEC])
def test_runner_imports_start_without_kiln_engine(tree, rel, monkeypatch):
    # The patched modules must import in a plain vLLM (no kiln plugin, feature off).
    monkeypatch.delenv("KILN_DRAFT_TRUNC", raising=False)
    with stub_vllm(tree):
        ns = run(_import_hooks(tree, rel), {})
    dt = ns["draft_trunc"]
    assert dt.ENABLED is False and dt.LOG is False
    assert dt.check_config(object()) is None


@pytest.mark.parametrize("rel", [MR, SPEC])
def test_runner_imports_refuse_a_requested_feature_without_kiln_engine(tree, rel, monkeypatch):
    monkeypatch.setenv("KILN_DRAFT_TRUNC", "1")
    with stub_vllm(tree), pytest.raises(ImportError, match="draft_trunc"):
        run(_import_hooks(tree, rel), {})


@pytest.mark.parametrize("rel", [MR, SPEC])
def test_runner_imports_bind_the_kiln_module_when_the_plugin_ran(tree, rel, draft_trunc):
    dt = draft_trunc()
    with stub_vllm(tree, dt):
        ns = run(_import_hooks(tree, rel), {})
    assert ns["draft_trunc"] is dt


@pytest.mark.parametrize(
    "rel,helper,args,off",
    [
        (LAYER, "_draft_trunc_on", (), False),
        (RUNNER, "_zero_dead_rows", ("routed",), "routed"),
        (V1, "_draft_trunc", (), None),
        (SAMPLER, "_draft_trunc_verify", ("ids", None, None), "ids"),
    ],
)
def test_helpers_are_off_without_kiln_engine(tree, rel, helper, args, off):
    _patched(tree, rel)
    nodes = [n for n in statements(tree / rel, imports_draft_trunc) if getattr(n, "name", "") == helper]
    assert len(nodes) == 1, f"{rel}: {helper} not found"
    with stub_vllm(tree):
        ns = run(nodes, {})
        assert ns[helper](*args) == off


def _v1_hook(tree):
    helper = [n for n in statements(tree / V1, imports_draft_trunc) if n.name == "_draft_trunc"]
    hook = statements(tree / V1, lambda n, s: isinstance(n, ast.If) and "refuse_runner" in s)
    assert len(hook) == 1, "V1 runner: no refuse_runner hook"
    return helper + hook


def test_v1_runner_refuses_draft_trunc_at_start(tree, draft_trunc):
    _patched(tree, V1)
    nodes = _v1_hook(tree)
    with stub_vllm(tree, draft_trunc()), pytest.raises(RuntimeError, match="V1 model runner"):
        run(nodes, {})
    with stub_vllm(tree, draft_trunc()):
        import kiln_engine.draft_trunc as dt

        dt.reload({})  # feature off: V1 starts
        run(nodes, {})
    with stub_vllm(tree):  # no kiln plugin: V1 starts
        run(nodes, {})


def test_moe_runner_zeroes_dead_rows_right_after_the_modular_experts(tree):
    # The routed output of the experts (not the monolithic path, whose router
    # ignores is_padding) goes through _zero_dead_rows before anything reads it.
    methods = statements(
        tree / RUNNER,
        lambda n, s: isinstance(n, ast.FunctionDef) and n.name == "_apply_quant_method",
    )
    assert len(methods) == 1
    src = ast.unparse(methods[0])
    modular = src.index("self.routed_experts.forward_modular(")
    hook = src.index("fused_out = _zero_dead_rows(fused_out)")
    assert modular < hook < src.index("if shared_experts_overlapping:")
    assert src.count("_zero_dead_rows(") == 1


def _note_hook(tree):
    """GPUModelRunner.add_requests: the If of patch 0012, and the If holding it."""
    methods = statements(tree / MR, lambda n, s: isinstance(n, ast.FunctionDef) and n.name == "add_requests")
    assert len(methods) == 1, "add_requests not found"
    hooks = [
        n
        for n in ast.walk(methods[0])
        if isinstance(n, ast.If)
        and ast.unparse(n.test) == "draft_trunc.ENABLED"
        and "draft_trunc.note_request(" in ast.unparse(n)
    ]
    assert len(hooks) == 1, "add_requests: no note_request hook"
    (parent,) = [n for n in ast.walk(methods[0]) if isinstance(n, ast.If) and hooks[0] in n.body]
    return hooks[0], parent


def test_add_requests_notes_each_requests_sampling_after_the_sampler(tree, draft_trunc):
    hook, parent = _note_hook(tree)
    calls = [ast.unparse(n) for n in parent.body]
    added = calls.index("self.sampler.add_request(req_index, new_req_data.sampling_params)")
    assert calls.index(ast.unparse(hook)) == added + 1
    penalised = NS(repetition_penalty=1.3, temperature=0.0)
    request = {"req_index": 5, "new_req_data": NS(sampling_params=penalised)}
    dt = draft_trunc()
    with stub_vllm(tree, dt):
        run([*_import_hooks(tree, MR), hook], dict(request))
    assert dt.snapshot().target_only == {5}
    with stub_vllm(tree):  # no kiln plugin: the stub is off and has no note_request
        run([*_import_hooks(tree, MR), hook], dict(request))
