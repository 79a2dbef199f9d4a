"""kiln-engine's vLLM plugin, at unit level (the e2e smoke test proves it loads in vLLM)."""

from __future__ import annotations

import importlib.metadata as md
import sys

import pytest
from kiln_engine import features, plugin


def test_entry_point_is_registered_for_vllm():
    eps = md.entry_points(group="vllm.general_plugins")
    assert "kiln_engine.plugin:register" in {ep.value for ep in eps if ep.name == "kiln"}


def test_features_are_off_by_default_and_switch_on_by_env():
    assert features.states({}) == {"draft-trunc": False}
    assert features.states({"KILN_DRAFT_TRUNC": "1"}) == {"draft-trunc": True}
    assert features.states({"KILN_DRAFT_TRUNC": "0"}) == {"draft-trunc": False}


def test_unsafe_combination_is_refused_with_a_clear_message():
    with pytest.raises(features.UnsafeConfiguration, match="needs VLLM_MOE_SKIP_PADDING=1"):
        features.check_environment({"KILN_DRAFT_TRUNC": "1", "VLLM_MOE_SKIP_PADDING": "0"})
    features.check_environment({"KILN_DRAFT_TRUNC": "1"})  # padding skip defaults on in vLLM
    features.check_environment({"VLLM_MOE_SKIP_PADDING": "0"})  # feature off: nothing to refuse


def test_v1_runner_chosen_by_env_is_refused_at_plugin_load():
    # The hooks live in Model Runner V2 only; under V1 the feature would do nothing.
    with pytest.raises(features.UnsafeConfiguration, match="VLLM_USE_V2_MODEL_RUNNER=0"):
        features.check_environment({"KILN_DRAFT_TRUNC": "1", "VLLM_USE_V2_MODEL_RUNNER": "0"})
    features.check_environment({"KILN_DRAFT_TRUNC": "1", "VLLM_USE_V2_MODEL_RUNNER": "1"})
    features.check_environment({"VLLM_USE_V2_MODEL_RUNNER": "0"})  # feature off


def test_register_aliases_our_module_where_patched_vllm_imports_it(monkeypatch, capsys):
    target = "vllm.v1.worker.gpu.spec_decode.draft_trunc"
    monkeypatch.delitem(sys.modules, target, raising=False)
    import logging

    ours = logging.getLogger("kiln_engine")  # register() routes it: restore it afterwards
    monkeypatch.setattr(ours, "handlers", [])
    monkeypatch.setattr(ours, "propagate", True)
    monkeypatch.setattr(plugin, "_done", False)
    monkeypatch.delenv("KILN_DRAFT_TRUNC", raising=False)
    plugin.register()
    import kiln_engine.draft_trunc as ours

    assert sys.modules[target] is ours
    assert ours.ENABLED is False
    assert "kiln-engine 0.1.0 loaded" in plugin.status_line() and "draft-trunc=off" in plugin.status_line()


def test_feature_logs_reach_vllms_handler(monkeypatch):
    """In vLLM's processes only the `vllm` logger has a handler; without routing, every
    `kiln_engine.draft_trunc` line (start line, summaries) was dropped."""
    import io
    import logging

    ours = logging.getLogger("kiln_engine")
    monkeypatch.setattr(ours, "handlers", [])
    monkeypatch.setattr(ours, "propagate", True)
    monkeypatch.setattr(ours, "level", logging.NOTSET)
    stream = io.StringIO()
    vllm_handler = logging.StreamHandler(stream)
    monkeypatch.setattr(logging.getLogger("vllm"), "handlers", [vllm_handler])
    monkeypatch.setattr(plugin, "_done", False)
    monkeypatch.delenv("KILN_DRAFT_TRUNC", raising=False)
    plugin.register()
    logging.getLogger("kiln_engine.draft_trunc").info("draft_trunc on: test")
    assert stream.getvalue().count("draft_trunc on: test") == 1
    assert ours.handlers == [vllm_handler]
