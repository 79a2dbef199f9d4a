"""Import cost, knobs and start-up refusals; no torch kernels involved."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace as NS

import pytest
from kiln_engine.draft_trunc._env import Knobs, read_knobs

ENGINE = Path(__file__).resolve().parents[2] / "engine"


def test_import_pulls_neither_torch_nor_vllm():
    code = (
        "import sys, kiln_engine.draft_trunc as d; "
        "assert d.ENABLED is False and d.LOG is False; "
        "bad = [m for m in ('torch', 'triton', 'vllm') if m in sys.modules]; "
        "assert not bad, bad"
    )
    env = {"PYTHONPATH": str(ENGINE), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)


def test_knobs_from_env():
    knobs = read_knobs(
        {
            "KILN_DRAFT_TRUNC": "1",
            "KILN_DRAFT_TRUNC_TAU": "0.4",
            "KILN_DRAFT_TRUNC_MIN_KEEP": "2",
            "KILN_DRAFT_TRUNC_WARMUP": "0",
            "KILN_DRAFT_TRUNC_EXPLORE": "0",
            "KILN_DRAFT_TRUNC_LOG_INTERVAL": "500",
            "KILN_DRAFT_TRUNC_WITH_AV": "true",
        }
    )
    assert knobs == Knobs(True, 0.4, 2, 0, 0.0, 500, True, policy="tau")
    assert read_knobs({}) == Knobs()


@pytest.mark.parametrize(
    "name,value",
    [
        ("KILN_DRAFT_TRUNC", "maybe"),
        ("KILN_DRAFT_TRUNC_TAU", "1.5"),
        ("KILN_DRAFT_TRUNC_TAU", "nan"),
        ("KILN_DRAFT_TRUNC_MIN_KEEP", "-1"),
        ("KILN_DRAFT_TRUNC_EXPLORE", "x"),
    ],
)
def test_bad_knobs_fail_loudly(name, value):
    with pytest.raises(ValueError, match=name):
        read_knobs({name: value})


def _config(**parallel):
    base = dict(
        pipeline_parallel_size=1,
        prefill_context_parallel_size=1,
        data_parallel_size=1,
        all2all_backend="allgather_reducescatter",
    )
    base.update(parallel)
    return NS(
        parallel_config=NS(**base),
        speculative_config=NS(method="mtp", enable_adaptive_verification=False),
        model_config=NS(hf_text_config=NS(num_experts_per_tok=8)),
    )


@pytest.mark.parametrize(
    "parallel,match",
    [
        (dict(pipeline_parallel_size=2), "pipeline"),
        (dict(prefill_context_parallel_size=2), "prefill context"),
        (dict(data_parallel_size=2, all2all_backend="allgather_reducescatter"), "all2all_backend"),
        (dict(data_parallel_size=2, all2all_backend="naive"), "all2all_backend"),
    ],
)
def test_unsafe_configs_refused(draft_trunc, parallel, match):
    dt = draft_trunc()
    with pytest.raises(RuntimeError, match=match):
        dt.check_config(_config(**parallel))


def test_sequence_parallel_moe_refused(draft_trunc):
    # DP=2 x TP=2 with expert parallelism over DeepEP: vLLM shards tokens across TP
    # ranks, and GLM-5's router would read is_padding[:n] of the whole batch.
    dt = draft_trunc()
    cfg = _config(data_parallel_size=2, all2all_backend="deepep_low_latency")
    cfg.parallel_config.use_sequence_parallel_moe = True
    with pytest.raises(RuntimeError, match="sequence-parallel MoE"):
        dt.check_config(cfg)
    cfg.parallel_config.use_sequence_parallel_moe = False
    dt.check_config(cfg)
    assert dt.ENABLED


def test_local_argmax_reduction_refused_before_the_speculator_says_av(draft_trunc):
    dt = draft_trunc()
    cfg = _config()
    cfg.speculative_config.use_local_argmax_reduction = True
    with pytest.raises(RuntimeError, match="use_local_argmax_reduction") as err:
        dt.check_config(cfg)
    assert "daptive verification" not in str(err.value)


def test_safe_configs_pass_and_av_turns_it_off(draft_trunc):
    dt = draft_trunc()
    dt.check_config(_config(data_parallel_size=2, all2all_backend="deepep_low_latency"))
    assert dt.ENABLED and dt.snapshot().top_k == 8
    cfg = _config()
    cfg.speculative_config.method = "extract_hidden_states"
    with pytest.raises(RuntimeError, match="extract_hidden_states"):
        dt.check_config(cfg)
    cfg = _config()
    cfg.speculative_config.enable_adaptive_verification = True
    dt.check_config(cfg)
    assert not dt.ENABLED
    dt = draft_trunc(with_av=1)
    dt.check_config(cfg)
    assert dt.ENABLED


def test_check_config_is_silent_when_off():
    import kiln_engine.draft_trunc as dt

    dt.reload({})
    dt.check_config(_config(pipeline_parallel_size=4))  # off: nothing to refuse
