"""Dead rows must not poison live rows: a toy two-layer MoE model over one request.

The experts never write the rows the router skipped, so their routed output is
whatever the buffer held; here that is NaN or Inf on purpose. Dead draft rows keep
their KV slots, and attention masks their scores but still multiplies their values,
as paged attention does over a whole block, so 0 * NaN would reach live rows. The
routed output goes through the ``_zero_dead_rows`` hook of the patched vLLM
MoE runner (0007), which calls kiln's ``zero_dead_rows``.
"""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest
import torch
from dt_patched import apply_series, imports_draft_trunc, run, statements, stub_vllm

# vLLM's sources from kiln's wheel cache: a fresh machine downloads the wheels (conftest vllm_src)
pytestmark = [pytest.mark.network, pytest.mark.kernels]

RUNNER = "vllm/model_executor/layers/fused_moe/runner/moe_runner.py"
HIDDEN, EXPERTS, TOP_K, LAYERS = 16, 4, 2, 2


@pytest.fixture(scope="module")
def zero_hook(vllm_src, vllm_version, tmp_path_factory):
    """The patched runner's ``_zero_dead_rows``, reading ``is_padding`` from a forward context."""
    if shutil.which("patch") is None:
        pytest.skip("GNU patch not installed")
    tree = apply_series(vllm_src, tmp_path_factory.mktemp("patched"), vllm_version)
    nodes = [n for n in statements(tree / RUNNER, imports_draft_trunc) if n.name == "_zero_dead_rows"]
    assert len(nodes) == 1, "0007 adds _zero_dead_rows to the MoE runner"
    context = SimpleNamespace(is_padding=None)
    ns = run(nodes, {"get_forward_context": lambda: context})
    return tree, context, ns["_zero_dead_rows"]


def _weights(seed=0):
    g = torch.Generator().manual_seed(seed)

    def w(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64) / shape[-1] ** 0.5

    return [
        SimpleNamespace(
            q=w(HIDDEN, HIDDEN), k=w(HIDDEN, HIDDEN), v=w(HIDDEN, HIDDEN),
            gate=w(EXPERTS, HIDDEN), experts=w(EXPERTS, HIDDEN, HIDDEN),
        )
        for _ in range(LAYERS)
    ]  # fmt: skip


def _moe(layer, h, is_padding, garbage, hook):
    # Skip-padding routing as the patched router does (topk id -1 for padding rows);
    # rows no expert writes keep the buffer's old contents, here ``garbage``.
    out = torch.full_like(h, garbage)
    weights, ids = torch.softmax(h @ layer.gate.T, -1).topk(TOP_K, -1)
    for row in (~is_padding).nonzero().flatten().tolist():
        out[row] = sum(weights[row, s] * (layer.experts[ids[row, s]] @ h[row]) for s in range(TOP_K))
    return hook(out)


def _attention(layer, h, prefix_kv):
    # Scores of later rows are masked to -inf, but P @ V still runs over every row.
    q, k, v = h @ layer.q.T, h @ layer.k.T, h @ layer.v.T
    k, v = torch.cat([prefix_kv[0], k]), torch.cat([prefix_kv[1], v])
    rows, cols = q.shape[0], k.shape[0]
    causal = torch.ones(rows, cols, dtype=torch.bool).tril(cols - rows)
    p = torch.softmax((q @ k.T).masked_fill(~causal, float("-inf")), -1)
    return p @ v


def _forward(layers, h, is_padding, garbage, hook, prefix):
    for layer, kv in zip(layers, prefix, strict=True):
        h = h + _attention(layer, h, kv)
        h = h + _moe(layer, h, is_padding, garbage, hook)
    return h


@pytest.mark.parametrize("garbage", [float("nan"), float("inf"), float("-inf")])
def test_dead_rows_do_not_change_live_rows(zero_hook, draft_trunc, garbage):
    tree, context, hook = zero_hook
    layers = _weights()
    g = torch.Generator().manual_seed(1)
    prefix = [(torch.randn(5, HIDDEN, generator=g, dtype=torch.float64),) * 2 for _ in layers]
    # one verifying request: [t0, d1..d4], kept j = 1 draft, d2..d4 dead
    h = torch.randn(5, HIDDEN, generator=g, dtype=torch.float64)
    is_padding = torch.tensor([False, False, True, True, True])
    context.is_padding = is_padding

    with stub_vllm(tree, draft_trunc()):  # the plugin's alias, draft_trunc on
        full = _forward(layers, h, is_padding, garbage, hook, prefix)
        live = is_padding.logical_not().sum()
        context.is_padding = is_padding[:live]
        truncated = _forward(layers, h[:live], is_padding[:live], garbage, hook, prefix)

    assert torch.isfinite(full).all(), "dead rows must stay finite"
    torch.testing.assert_close(full[:live], truncated, rtol=1e-12, atol=1e-12)


def test_without_the_hook_dead_rows_poison_live_rows(zero_hook, draft_trunc):
    # The model above is sensitive: without zeroing, live rows turn NaN.
    draft_trunc()
    layers = _weights()
    g = torch.Generator().manual_seed(1)
    prefix = [(torch.randn(5, HIDDEN, generator=g, dtype=torch.float64),) * 2 for _ in layers]
    h = torch.randn(5, HIDDEN, generator=g, dtype=torch.float64)
    is_padding = torch.tensor([False, False, True, True, True])
    out = _forward(layers, h, is_padding, float("nan"), lambda x: x, prefix)
    assert torch.isnan(out[:2]).all()


def test_hook_is_inert_when_off_or_without_kiln_engine(zero_hook, draft_trunc):
    tree, context, hook = zero_hook
    context.is_padding = torch.tensor([False, True])
    routed = torch.full((2, 3), float("nan"))
    import kiln_engine.draft_trunc as dt

    with stub_vllm(tree, dt):
        dt.reload({})  # off: untouched (upstream's tail padding needs no zeroing)
        assert hook(routed) is routed and torch.isnan(routed).all()
    with stub_vllm(tree):  # kiln-engine absent
        assert hook(routed) is routed and torch.isnan(routed).all()
    with stub_vllm(tree, draft_trunc()):
        assert hook(routed) is routed  # in place
    assert torch.isnan(routed[0]).all() and (routed[1] == 0).all()
