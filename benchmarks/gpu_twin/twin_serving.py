"""A configuration's `vllm serve` on the lent device and what the twins ask of it: the
GPU twin's greedy and seeded sets, and tokens/s from steady windows for both twins
(runner.py, scale_runner.py). Standard library only until the parts are assembled.

A timed load keeps `load` requests in flight, waits until each is past its prefill, then
reads the server's own `vllm:generation_tokens_total` over `passes` windows of at least
`seconds` each: the median and range of those are the load's figure, and the raw
/metrics text around them carries the counters (analyse.py, model_check.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

START_TIMEOUT_S = 420
LOADS = (1, 4, 8, 32)  # concurrent requests
SECONDS, PASSES = 10.0, 3  # each timed window, and how many
SETTLE_S = 4.0  # every request in flight and past its prefill before the first window
MAX_TOKENS = 512  # each request's decode, ignore_eos: windows see decoding, not prefill


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One configuration's `vllm serve` (the plan's argv and env), logging to a file."""

    def __init__(self, name: str, config: dict, logs: Path, site: Path) -> None:
        self.name, self.config = name, config
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = logs / f"{name}.log"
        argv = [str(self.port) if a == "PORT" else a for a in config["argv"]]
        self.model = argv[argv.index("--served-model-name") + 1] if "--served-model-name" in argv else argv[1]
        env = {
            **os.environ,
            **config["env"],
            "PYTHONPATH": str(site),
            "CUDA_VISIBLE_DEVICES": "0",
            "PROMETHEUS_MULTIPROC_DIR": tempfile.mkdtemp(prefix=f"kiln-prom-{name}-"),
        }
        self.started = time.monotonic()
        self.startup_s: float | None = None
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from vllm.entrypoints.cli.main import main; main()", *argv],
            env=env,
            stdout=self.log_path.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def log_tail(self, lines: int = 40) -> list[str]:
        return self.log_path.read_text(errors="replace").splitlines()[-lines:]

    def wait_healthy(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name}: vllm serve exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                    if resp.status == 200:
                        self.startup_s = time.monotonic() - self.started
                        return
            except OSError:
                pass
            time.sleep(1)
        raise RuntimeError(f"{self.name}: not healthy after {START_TIMEOUT_S} s")

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        return "\n".join(
            ln for ln in text.splitlines() if ln.startswith(("vllm:spec_decode", "kiln_")) and not ln.startswith("#")
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)


def _completions(done: list) -> list[dict]:
    return [{"prompt": c.prompt, "token_ids": c.token_ids, "top": c.top, "seconds": c.seconds} for c in done]


def greedy_set(server: Server) -> dict:
    """16 greedy requests with top-2 logprobs (for the numeric-tie rule), one at a time."""
    from kiln_testkit.requestsets import prompts, run_set

    greedy = run_set(server.url, server.model, prompts(16, seed=0), max_tokens=32, temperature=0.0, logprobs=2)
    return {"completions": _completions(greedy), "metrics_after": server.metrics()}


def seeded_sets(server: Server) -> dict:
    """48 seeded requests at temperature 1, twice, one at a time. Last: on the twin's flat
    random distributions a sampled request accepts almost no greedy draft, and the
    acceptance estimator, shared by every request, learns that (docs/draft-trunc.md)."""
    from kiln_testkit.requestsets import prompts, run_set

    sampled, seeds = prompts(48, seed=1), list(range(1000, 1048))
    runs = [run_set(server.url, server.model, sampled, max_tokens=24, temperature=1.0, seeds=seeds) for _ in range(2)]
    return {"runs": [_completions(r) for r in runs], "metrics_after": server.metrics()}


def timed_loads(server: Server) -> list[dict]:
    """tokens/s at each load from steady windows (PASSES of at least SECONDS, LOAD requests
    always in flight) with the other servers idle, and the counters around them."""
    rows = []
    for load in LOADS:
        row = steady(server.url, server.model, load, SECONDS, PASSES)
        rows.append({**row, "tokens_per_s": row["median"]})
    return rows


# -- steady windows -------------------------------------------------------------------------
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfa]+)$")
_DELTAS = {
    "tokens": "vllm:generation_tokens_total",
    "drafts": "vllm:spec_decode_num_drafts_total",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "accepted": "vllm:spec_decode_num_accepted_tokens_total",
    "dt_proposed": "kiln_draft_trunc_proposed_total",
    "dt_kept": "kiln_draft_trunc_kept_total",
    "dt_accepted": "kiln_draft_trunc_accepted_total",
}


def metrics_text(url: str) -> str:
    """The server's /metrics page."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        return resp.read().decode()


def parse_counters(text: str) -> dict[str, float]:
    """Every vllm: and kiln_ sample of a Prometheus text page, summed over its labels."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1).startswith(("vllm:", "kiln_")):
            out[match.group(1)] = out.get(match.group(1), 0.0) + float(match.group(3))
    return out


def complete(url: str, body: dict, timeout: float = 600) -> dict:
    """One /v1/completions request."""
    request = urllib.request.Request(
        f"{url}/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        return json.loads(resp.read())


def window_row(before: str, after: str, wall: float) -> dict[str, float]:
    """tokens/s and per-step speculation over one window, from the /metrics around it."""
    first, last = parse_counters(before), parse_counters(after)
    delta = {key: last.get(name, 0.0) - first.get(name, 0.0) for key, name in _DELTAS.items()}
    row = {"seconds": round(wall, 3), "tokens_per_s": delta["tokens"] / wall, **delta}
    if delta["drafts"]:
        row["verified_per_step"] = delta["draft_tokens"] / delta["drafts"]
        row["accepted_per_step"] = delta["accepted"] / delta["drafts"]
    if delta["dt_proposed"]:
        row["kept_share"] = delta["dt_kept"] / delta["dt_proposed"]
    return row


def steady(url: str, model: str, load: int, seconds: float, passes: int, prompt=None) -> dict:
    """`passes` windows of `seconds` with `load` requests always in flight."""
    stop, errors = threading.Event(), []
    make = prompt or (lambda n: f"def f{n}(x):")

    def worker(n: int) -> None:
        k = 0
        while not stop.is_set():
            body = {"model": model, "prompt": make(n * 1000 + k), "max_tokens": MAX_TOKENS, "ignore_eos": True}
            try:
                complete(url, {**body, "temperature": 0.0})
            except OSError as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                return
            k += 1

    threads = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(load)]
    for thread in threads:
        thread.start()
    time.sleep(SETTLE_S)
    texts, windows = [metrics_text(url)], []
    for _ in range(passes):
        t0 = time.monotonic()
        time.sleep(seconds)
        texts.append(metrics_text(url))
        windows.append(window_row(texts[-2], texts[-1], time.monotonic() - t0))
    stop.set()
    for thread in threads:
        thread.join(timeout=120)
    rates = sorted(w["tokens_per_s"] for w in windows)
    return {
        "load": load,
        "passes": windows,
        "median": rates[len(rates) // 2],
        "range": [rates[0], rates[-1]],
        "metrics_before": texts[0],
        "metrics_after": texts[-1],
        "errors": errors[:3],
    }
