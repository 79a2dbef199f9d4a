"""Draft truncation on a second model family (Qwen3-MoE, recipes/qwen3-30b-a3b): its
router drops padding rows without a `skip_padding` attribute, so the MoE runner must
zero the dead rows whatever the router (patch 0009, 0.33.0 series)."""

from __future__ import annotations

import ast
import re
import shutil

import pytest
from dt_patched import apply_series

pytestmark = [pytest.mark.network, pytest.mark.kernels]  # vLLM's sources (conftest vllm_src)

RUNNER = "vllm/model_executor/layers/fused_moe/runner/moe_runner.py"
ROUTER = "vllm/model_executor/layers/fused_moe/router/fused_topk_router.py"


def _calls_of(tree: ast.AST, name: str) -> list[tuple[ast.Call, list[ast.If]]]:
    """Each call of `name` with the `if` statements around it."""
    found = []

    def walk(node, guards):
        for child in ast.iter_child_nodes(node):
            inner = [*guards, child] if isinstance(child, ast.If) else guards
            if isinstance(child, ast.Call) and getattr(child.func, "id", None) == name:
                found.append((child, guards))
            walk(child, inner)

    walk(tree, [])
    return found


def test_dead_rows_are_zeroed_for_every_router(vllm_src, vllm_version, tmp_path):
    if vllm_version == "0.32.0":
        pytest.skip("the CPU recipes (0.32.0) route with CPURouter, which never skips rows")
    if shutil.which("patch") is None:
        pytest.skip("GNU patch not installed")
    tree = apply_series(vllm_src, tmp_path / "patched", vllm_version)
    calls = _calls_of(ast.parse((tree / RUNNER).read_text()), "_zero_dead_rows")
    assert calls, "0007 calls _zero_dead_rows in the MoE runner"
    for _, guards in calls:
        conditions = " ".join(ast.unparse(g.test) for g in guards)
        assert "skip_padding" not in conditions, f"still gated on the router: if {conditions}"


def test_qwen3s_router_drops_padding_rows_in_its_top_k_kernel(vllm_src, vllm_version):
    """The premise: FusedTopKRouter's softmax/sigmoid top-k pass is_padding to the kernel
    (so dead draft rows get expert id -1 and are never written by the experts)."""
    if vllm_version == "0.32.0":
        pytest.skip("0.33.0 and later only")
    source = (vllm_src / ROUTER).read_text()
    tree = ast.parse(source)
    for fn in ("vllm_topk_softmax", "vllm_topk_sigmoid"):
        [node] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == fn]
        # 0.34.0 renamed the helper get_moe_padding_mask (same forward-context mask)
        assert re.search(r"is_padding=_?get_(moe_)?padding_mask\(", ast.unparse(node)), fn
    qwen3 = (vllm_src / "vllm/model_executor/models/qwen3_moe.py").read_text()
    assert "use_grouped_topk" not in qwen3  # Qwen3-MoE falls through to the plain top-k router
