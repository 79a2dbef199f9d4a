"""Waiting for a server that a test started itself to answer /health."""

from __future__ import annotations

import time

from kiln.domain.serving.serving_container import health_ok


def wait_for_health(base_url: str, timeout_s: float) -> float:
    """Seconds until /health answered 200 (plain polling, for callers that started the
    container themselves); TimeoutError after `timeout_s`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if health_ok(base_url):
            return time.monotonic() - t0
        time.sleep(0.25)
    raise TimeoutError(f"no 200 from {base_url}/health after {timeout_s:.0f} s")
