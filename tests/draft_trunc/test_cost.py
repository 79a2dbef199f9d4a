"""The verify-step cost model: its fit to the H200 table, the experts-touched
formula against sampled routing, and the layer shape read from a model config."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from types import SimpleNamespace as NS

import numpy as np
import pytest
from kiln_engine.draft_trunc import _cost
from kiln_engine.draft_trunc._config_check import moe_layer
from kiln_testkit import dt_cost
from kiln_testkit.scripts import load_script

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "draft_trunc"
ROWS = json.loads((BENCH / "results-2026-11-30-h200.json").read_text())["moe"]


def test_constants_are_the_fit_of_the_table():
    fresh = dt_cost.fit_routed_cost(ROWS, _cost.MoELayer())
    for name, value in vars(fresh).items():
        assert getattr(_cost.H200_FIT, name) == pytest.approx(value, rel=1e-3, abs=1e-9), name
    fit_cost = load_script("benchmarks/draft_trunc/fit_cost.py")
    assert fit_cost.main(["--check"]) == 0


def test_fit_error_is_small_against_every_point():
    layer = _cost.MoELayer()
    measured_u = dt_cost.fit_errors(ROWS, layer, _cost.H200_FIT, expected=False)
    model_u = dt_cost.fit_errors(ROWS, layer, _cost.H200_FIT, expected=True)
    assert max(abs(e) for e in measured_u) < 0.02
    # With U from the uniform-routing formula the single random routing draw of
    # the benchmark adds its own scatter (e.g. 128 experts touched vs 120 expected).
    assert max(abs(e) for e in model_u) < 0.07


@pytest.mark.parametrize("live", [1, 5, 20, 40, 160])
def test_uniform_touched_matches_sampled_routing(live):
    rng = np.random.default_rng(live)
    layer = _cost.MoELayer(experts=256, top_k=8)
    counts = []
    for _ in range(400):
        picks = np.argsort(rng.random((live, 256)), axis=1)[:, :8]  # 8 distinct experts per token
        counts.append(len(np.unique(picks)))
    assert _cost.experts_touched(layer, live) == pytest.approx(np.mean(counts), rel=0.02)


def test_skew_touches_fewer_experts_and_is_monotone():
    uniform, skewed = _cost.MoELayer(), _cost.MoELayer(skew=1.0)
    assert _cost.experts_touched(_cost.MoELayer(skew=0.0), 40) == _cost.experts_touched(uniform, 40)
    for live in (5, 40, 160):
        assert _cost.experts_touched(skewed, live) < _cost.experts_touched(uniform, live)
    table = _cost.live_table(skewed, _cost.H200_FIT, 600)
    assert all(b >= a for a, b in itertools.pairwise(table))
    assert table[0] == 0.0


def _vllm_config(ep=False, quant=None):
    hf = NS(n_routed_experts=256, num_experts_per_tok=8, hidden_size=6144, moe_intermediate_size=2048)
    return NS(
        model_config=NS(hf_text_config=hf, dtype=NS(itemsize=2), quantization=quant),
        parallel_config=NS(enable_expert_parallel=ep, tensor_parallel_size=8, data_parallel_size=1),
    )


def test_layer_shape_from_model_config():
    layer = moe_layer(_vllm_config())
    assert (layer.experts, layer.top_k) == (256, 8)
    assert layer.expert_bytes == pytest.approx(_cost.MoELayer().expert_bytes)
    assert moe_layer(_vllm_config(quant="fp8")).expert_bytes == pytest.approx(layer.expert_bytes / 2)
    assert moe_layer(_vllm_config(ep=True)).expert_bytes == pytest.approx(layer.expert_bytes / 8)
    assert moe_layer(NS(model_config=NS(hf_text_config=NS(hidden_size=8)))) is None


def test_moe_layer_knob_overrides_the_model_config(draft_trunc):
    """The CPU twin prices its steps as its GPU sibling: the knob's layer wins over
    the tiny model's, and without the knob the model's config is priced."""
    tiny = _vllm_config()
    tiny.model_config.hf_text_config = NS(
        num_experts=8, num_experts_per_tok=2, hidden_size=64, moe_intermediate_size=32
    )
    tiny.parallel_config.tensor_parallel_size = 1
    dt = draft_trunc()
    dt.check_config(tiny)
    assert (dt.snapshot().layer.experts, dt.snapshot().layer.top_k) == (8, 2)
    dt = draft_trunc(moe_layer="256, 8, 75497472")
    dt.check_config(tiny)
    assert dt.snapshot().layer == _cost.MoELayer(experts=256, top_k=8, expert_bytes=75497472.0)


@pytest.mark.parametrize(
    "raw",
    [
        "256,8",
        "256,8,1e6,2",
        "a,8,1e6",
        "8,256,1e6",
        "256,0,1e6",
        "256,8,0",
        "256,8,nan",
        "256,8,1e30",
        "4194304,8,1e6",
        "256,8,inf",
        "256,8," + "9" * 5000,
    ],
)
def test_moe_layer_knob_refuses_bad_shapes(raw):
    from kiln_engine.draft_trunc._env import read_knobs

    with pytest.raises(ValueError, match=r"^KILN_DRAFT_TRUNC_MOE_LAYER=.*EXPERTS,TOP_K,EXPERT_BYTES"):
        read_knobs({"KILN_DRAFT_TRUNC_MOE_LAYER": raw})
    assert read_knobs({}).moe_layer is None
