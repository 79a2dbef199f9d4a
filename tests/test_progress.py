"""Long work shows live progress on a terminal and plain, rate-limited heartbeat lines
in CI or a log file (no daemon needed: the display logic alone)."""

from __future__ import annotations

import time

from kiln.basics import log
from kiln.basics.progress import Activity, _live


def test_heartbeat_lines_are_rate_limited_and_say_how_far(capsys, monkeypatch):
    monkeypatch.setenv("CI", "1")
    with Activity("pulling debian", unit_bytes=True, heartbeat_s=0.2) as act:
        for i in range(60):
            act.update(f"layer {i}", done=i * 1e6, total=60e6)
            time.sleep(0.01)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "pulling debian" in ln]
    assert 1 <= len(lines) <= 4, lines  # ~0.6 s of updates, one line per 0.2 s at most
    assert "MB / 60.00 MB" in lines[0] and "layer" in lines[0]


def test_silent_activity_prints_nothing(capsys, monkeypatch):
    monkeypatch.setenv("CI", "1")
    with Activity("probe", heartbeat_s=0.0, silent=True) as act:
        act.update("anything")
    assert capsys.readouterr().err == ""


def test_live_only_on_a_terminal_outside_ci_and_not_quiet(monkeypatch):
    monkeypatch.setattr(log.console, "_force_terminal", True)
    monkeypatch.delenv("CI", raising=False)
    assert _live()
    monkeypatch.setenv("CI", "true")
    assert not _live()
    monkeypatch.delenv("CI")
    monkeypatch.setattr(log.console, "quiet", True)
    assert not _live()
    monkeypatch.setattr(log.console, "quiet", False)
    monkeypatch.setattr(log.console, "_force_terminal", False)
    assert not _live()
