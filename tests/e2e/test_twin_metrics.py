"""draft-trunc's counters are on a fresh server's /metrics from the first scrape.

tiny-kindling served as shipped (the recipe's own knobs: statistics every 1000 steps),
scraped before any request: every `kiln_draft_trunc_*_total` series the feature
registry declares is there, at 0 (Prometheus convention: a counter exists from the
start, so dashboards, `rate()` and absence alerts work), and the log names the flush
interval once. A short run after it (far fewer steps than one interval) keeps every
series on /metrics: before, they appeared only at the first flush.
"""

from __future__ import annotations

import pytest
from kiln_testkit.twinserve import counters, prompts, run_set, serving

# with test_tiny_kindling.py, beside the daemon group (tests/kilntest.py)
pytestmark = [pytest.mark.e2e, pytest.mark.docker, pytest.mark.xdist_group("tiny-kindling")]


@pytest.fixture(scope="module")
def fresh(tiny_kindling, docker_daemon):
    """A fresh tiny-kindling server: its first /metrics, then what a short run leaves."""
    from kiln.domain.recipes.feature_registry import engine_features
    from kiln.domain.serving.launch_command import launch_document

    loaded, img = tiny_kindling.loaded, tiny_kindling.image
    (feature,) = engine_features(loaded.recipe.features)
    interval = launch_document(loaded)["env"][f"{feature.env}_LOG_INTERVAL"]  # the override's
    with serving(docker_daemon, loaded, img.id) as box:
        first = counters(box.url, feature.metrics)  # before any request
        run_set(box.url, loaded.recipe.launch.served_model_name, prompts(4, seed=3), max_tokens=16)
        after = counters(box.url, feature.metrics)
        logs = box.logs(tail=100000)
    print(f"\nfirst scrape: {first}\nafter 4 requests: {after}")
    return {"feature": feature, "first": first, "after": after, "logs": logs, "interval": interval}


def test_every_series_is_on_the_first_scrape_at_zero(fresh):
    assert fresh["first"] == dict.fromkeys(fresh["feature"].metrics, 0.0)


def test_the_start_log_names_the_flush_interval_once(fresh):
    lines = [ln for ln in fresh["logs"].splitlines() if "draft_trunc statistics:" in ln]
    assert len(lines) == 1, lines  # once per server: the reporting rank only
    n = fresh["interval"]
    assert n == "1000"  # as shipped: the short run below stays far below one interval
    assert f"every {n} steps (KILN_DRAFT_TRUNC_LOG_INTERVAL={n})" in lines[0], lines[0]
    assert "on /metrics from the start, at 0 until the first flush" in lines[0], lines[0]
    assert "PROMETHEUS_MULTIPROC_DIR is unset" not in fresh["logs"]  # kiln-serve sets it


def test_a_short_run_keeps_every_series_on_metrics(fresh):
    after = fresh["after"]
    assert all(value is not None for value in after.values()), after
    # far fewer steps than the interval: nothing flushed yet, and no summary line
    assert fresh["feature"].log_lines[-1] not in fresh["logs"]
    assert after == dict.fromkeys(fresh["feature"].metrics, 0.0)
