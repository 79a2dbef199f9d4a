"""draft_trunc's counters exist at 0 from the start, in vLLM's multiprocess layout: the
engine process registers them when it starts (check_config), and the API server's
collector finds every series in PROMETHEUS_MULTIPROC_DIR before anything was counted.
Statistics flushes add to them; the start-up log names the flush interval."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from kiln_engine.draft_trunc import _metrics
from kiln_engine.features import DRAFT_TRUNC

prom = pytest.importorskip("prometheus_client")
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.multiprocess import MultiProcessCollector  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

ENGINE = Path(__file__).resolve().parents[2] / "engine"
TOP8 = "NS(model_config=NS(hf_text_config=NS(num_experts_per_tok=8)))"


def samples(registry: CollectorRegistry) -> dict[str, float]:
    """Every sample of the registry as /metrics would show it, by name."""
    text = generate_latest(registry).decode()
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}


def engine_process(tmp_path: Path, code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter with the kiln_engine logger on stdout, as vLLM's
    engine-core process runs the plugin, with PROMETHEUS_MULTIPROC_DIR=tmp_path/prom."""
    (tmp_path / "prom").mkdir(exist_ok=True)
    prelude = textwrap.dedent("""
        import logging, sys
        from types import SimpleNamespace as NS
        logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(message)s")
        import kiln_engine.draft_trunc as dt
    """)
    full_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(ENGINE),
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prom"),
        "KILN_DRAFT_TRUNC": "1",
        **env,
    }
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def api_server_view(tmp_path: Path) -> dict[str, float]:
    """What the API server's /metrics shows: the multiprocess collector over the dir."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path / "prom"))
    return samples(registry)


def test_the_counters_are_the_ones_the_feature_registry_declares():
    assert _metrics.exposed_names() == DRAFT_TRUNC.metrics


def test_registered_at_zero_once_per_registry_and_flushes_add():
    registry = CollectorRegistry()
    counters = _metrics.FeatureCounters.register(registry)
    assert counters is not None
    assert _metrics.FeatureCounters.register(registry) is counters  # no second set, no error
    assert {name: samples(registry).get(name) for name in DRAFT_TRUNC.metrics} == dict.fromkeys(
        DRAFT_TRUNC.metrics, 0.0
    )
    totals = {key: float(i + 1) for i, key in enumerate(_metrics.HELP)}
    counters.add(totals)
    counters.add({**totals, "dead": -3.0})  # a negative total is clamped, never refused
    after = samples(registry)
    for i, key in enumerate(_metrics.HELP):
        want = 2.0 * (i + 1) if key != "dead" else float(i + 1)
        assert after[f"kiln_draft_trunc_{key}_total"] == want, key


def test_a_flush_adds_its_summary_to_the_counters():
    torch = pytest.importorskip("torch")
    from kiln_engine.draft_trunc._stats import StepStats

    registry = CollectorRegistry()
    stats = StepStats(torch.device("cpu"), interval=2, top_k=8, counters=_metrics.FeatureCounters.register(registry))
    cu = torch.tensor([0, 5, 9], dtype=torch.int32)  # two requests: 4 and 3 drafts
    live = torch.tensor([2, 3], dtype=torch.int32)  # kept 2 and 3
    sampled = torch.tensor([3, 2], dtype=torch.int32)  # accepted 2 and 1
    slots = torch.tensor([0, 1])
    for _ in range(2):
        stats.add(cu, sampled, slots, 9, live, torch.zeros(2))
    assert stats.last is not None, "the second step flushes (CPU: no event to wait for)"
    got = samples(registry)
    assert got["kiln_draft_trunc_proposed_total"] == 2 * 7
    assert got["kiln_draft_trunc_kept_total"] == 2 * 5
    assert got["kiln_draft_trunc_accepted_total"] == 2 * 3
    assert got["kiln_draft_trunc_dead_total"] == 2 * 2
    assert got["kiln_draft_trunc_expert_slots_saved_total"] == 2 * 2 * 8
    assert got["kiln_draft_trunc_boundary_total"] == 2 * 1  # request 0: a = j = 2 < n = 4
    assert got["kiln_draft_trunc_tokens_total"] == 2 * 9


def test_engine_start_puts_every_series_on_the_api_servers_metrics_at_zero(tmp_path):
    (tmp_path / "prom").mkdir()
    # control: an API server's view before the engine started holds none of them
    assert not any(name.startswith("kiln_draft_trunc_") for name in api_server_view(tmp_path))
    run = engine_process(tmp_path, f"dt.check_config({TOP8})\n", KILN_DRAFT_TRUNC_LOG_INTERVAL="1000")
    view = api_server_view(tmp_path)
    assert {name: view.get(name) for name in DRAFT_TRUNC.metrics} == dict.fromkeys(DRAFT_TRUNC.metrics, 0.0)
    lines = [ln for ln in run.stdout.splitlines() if "draft_trunc statistics:" in ln]
    assert lines == [
        (
            "INFO draft_trunc statistics: every 1000 steps (KILN_DRAFT_TRUNC_LOG_INTERVAL=1000): "
            "a summary line and the kiln_draft_trunc_* counters (on /metrics from the start, "
            "at 0 until the first flush)"
        )
    ], run.stdout
    assert "PROMETHEUS_MULTIPROC_DIR is unset" not in run.stdout


def test_statistics_off_says_so_and_registers_nothing(tmp_path):
    run = engine_process(tmp_path, f"dt.check_config({TOP8})\n", KILN_DRAFT_TRUNC_LOG_INTERVAL="0")
    assert "INFO draft_trunc statistics: off (KILN_DRAFT_TRUNC_LOG_INTERVAL=0)" in run.stdout
    assert not any(name.startswith("kiln_draft_trunc_") for name in api_server_view(tmp_path))


def test_feature_off_or_other_ranks_register_nothing(tmp_path):
    run = engine_process(
        tmp_path, f"dt.check_config({TOP8})\n", KILN_DRAFT_TRUNC="0", KILN_DRAFT_TRUNC_LOG_INTERVAL="1000"
    )
    assert "draft_trunc" not in run.stdout
    assert not any(name.startswith("kiln_draft_trunc_") for name in api_server_view(tmp_path))
    # a tensor-parallel rank other than 0 sees the same batch and reports nothing
    run = engine_process(
        tmp_path,
        f"""
        from kiln_engine.draft_trunc import _startup
        _startup._is_lead_rank = lambda: False
        dt.check_config({TOP8})
    """,
        KILN_DRAFT_TRUNC_LOG_INTERVAL="1000",
    )
    assert "draft_trunc statistics" not in run.stdout
    assert not any(name.startswith("kiln_draft_trunc_") for name in api_server_view(tmp_path))


@pytest.mark.parametrize(
    "env,warned",
    [
        ({}, True),
        ({"PROMETHEUS_MULTIPROC_DIR": "/tmp/x"}, False),
        ({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, False),  # engine core in the API server's process
        ({"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}, True),
    ],
)
def test_warns_when_the_counters_cannot_reach_metrics(env, warned):
    message = _metrics.served_elsewhere_warning(env)
    assert (message is not None) == warned
    if message is not None:
        assert "PROMETHEUS_MULTIPROC_DIR" in message and "\n" not in message
