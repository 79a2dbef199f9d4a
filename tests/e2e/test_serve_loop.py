"""The serve loop against a real vLLM: `kiln run` in the foreground and detached,
`kiln ps/logs/stop`, `-e`, and the hardened container flags. Two vLLM starts in all."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from kiln_testkit.health import wait_for_health
from kilntest import REPO, kiln_containers_on, run_kiln

from kiln.domain.serving.serving_container import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.docker]

NAME = "tiny-moe"
# under `nox -s e2e` the other xdist worker runs tiny-kindling's three servers and the
# kernels tier meanwhile: this whole test took 164 s there (2026-12-04), 28 s alone
STARTUP_S = 600


@pytest.fixture(scope="module")
def image(tiny_moe):
    return tiny_moe.image


def _complete(port: int) -> str:
    body = json.dumps({"model": NAME, "prompt": "def fibonacci(n):", "max_tokens": 8, "temperature": 0}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.load(resp)["choices"][0]["text"]


def _ctrl_c_default() -> None:
    """In the child: SIGINT back to its default. A test run started in the background
    (`nox ... &` from a script: no job control) inherits SIGINT ignored, Python then keeps
    it ignored, as a background job should, and the Ctrl-C below would never arrive (seen
    2026-12-02: the server ran on and three later tests found it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def port(docker_daemon):
    """A free port; after the test (its own checks included), any kiln server still on it
    is removed, so that a failed test leaves no vLLM behind for the next ones."""
    port = free_port()
    yield port
    for box in kiln_containers_on(docker_daemon, port):
        box.remove(force=True)


def test_foreground_run_is_hardened_streams_logs_and_ctrl_c_removes_it(image, docker_daemon, port):
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiln", "run", NAME, "--port", str(port), "-e", "KILN_E2E_MARK=on"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "300"},
        preexec_fn=_ctrl_c_default,
    )
    try:
        wait_for_health(f"http://127.0.0.1:{port}", STARTUP_S)
        [box] = kiln_containers_on(docker_daemon, port)
        host = box.attrs["HostConfig"]
        assert host["ReadonlyRootfs"] is True
        assert host["CapDrop"] == ["ALL"] and host["CapAdd"] == ["SYS_NICE"]
        assert host["SecurityOpt"] == ["no-new-privileges"]
        assert host["AutoRemove"] is True
        assert "KILN_E2E_MARK=on" in box.attrs["Config"]["Env"]
        assert _complete(port).strip()  # serves while hardened

        listed = run_kiln("ps")
        assert listed.returncode == 0 and box.name in listed.stdout and NAME in listed.stdout
        logs = run_kiln("logs", box.name, "--tail", "400")
        assert logs.returncode == 0 and "kiln-serve: tiny-moe" in logs.stdout + logs.stderr

        # a second run on the same port names the kiln container that holds it
        clash = run_kiln("run", NAME, "--port", str(port), "--detach")
        assert clash.returncode == 14, clash.stderr
        assert box.name in clash.stderr and f"kiln stop {box.name}" in clash.stderr

        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, out[-3000:]
    assert "kiln-serve: tiny-moe" in out  # the container log reached the terminal
    assert "internal error" not in out
    assert kiln_containers_on(docker_daemon, port) == []


def test_detached_run_then_ps_logs_stop_leave_nothing(image, docker_daemon, port):
    started = run_kiln("run", NAME, "--port", str(port), "--detach")
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        [box] = kiln_containers_on(docker_daemon, port)
        assert box.attrs["HostConfig"]["AutoRemove"] is True  # `docker stop` removes it too
        assert f"kiln stop {box.name}" in started.stderr
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as r:
            assert json.load(r)["data"][0]["id"] == NAME
        listed = run_kiln("ps")
        assert box.name in listed.stdout and f"http://127.0.0.1:{port}" in listed.stdout
        t0 = time.monotonic()
        stopped = run_kiln("stop", box.name)
        assert stopped.returncode == 0, stopped.stderr
        assert time.monotonic() - t0 < 40
        assert kiln_containers_on(docker_daemon, port) == []
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        again = run_kiln("stop", box.name)
        assert again.returncode == 50 and box.name in again.stderr
        gone = run_kiln("logs", box.name)
        assert gone.returncode == 50
    finally:
        for c in kiln_containers_on(docker_daemon, port):
            c.remove(force=True)
