"""vLLM's spec-decode counters as the e2e test and benchmarks read them from /metrics."""

from __future__ import annotations

import pytest
from kiln_testkit.twinserve import parse_spec_decode

# the shape of vLLM 0.32.0's /metrics (two engines' label sets, to check they are summed)
METRICS = """\
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 60.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 40.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 400.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 200.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 50.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 60.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="0"} 20.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 40.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="3"} 30.0
"""


def test_per_position_counters_are_summed_and_ordered():
    stats = parse_spec_decode(METRICS)
    assert stats.drafts == 100 and stats.draft_tokens == 400 and stats.accepted == 200
    assert stats.accepted_per_pos == [80, 50, 40, 30]
    assert stats.acceptance == 0.5
    assert stats.per_position == [0.8, 0.5, 0.4, 0.3]
    assert stats.conditional == pytest.approx([0.8, 0.625, 0.8, 0.75])


def test_the_difference_of_two_snapshots_is_what_happened_between():
    later = parse_spec_decode(METRICS.replace("200.0", "260.0").replace(" 30.0", " 50.0"))
    delta = later - parse_spec_decode(METRICS)
    assert delta.accepted == 60 and delta.accepted_per_pos == [0, 0, 0, 20] and delta.drafts == 0


def test_no_speculation_no_stats():
    assert parse_spec_decode('vllm:num_requests_running{engine="0"} 0.0\n') is None


class _GoneBox:
    """A server that died mid-set: the daemon no longer knows it (AutoRemove), its
    watcher kept the exit code, its captured log remains."""

    class spec:  # noqa: N801 - stands in for a RunSpec
        name = "kiln-tiny-kindling-1"

    exit_code = 137

    def status(self):
        raise RuntimeError("No such container")

    def logs(self, tail):
        return "INFO starting\nERROR EngineCore died\n"


def test_a_dead_servers_report_names_it_its_exit_code_and_its_last_lines():
    from kiln_testkit.twinserve import server_report

    report = server_report("tau", _GoneBox())
    first, *rest = report.splitlines()
    assert "'tau'" in first and "kiln-tiny-kindling-1" in first
    assert "gone (RuntimeError)" in first and "exit code 137" in first
    assert rest == ["INFO starting", "ERROR EngineCore died"]
