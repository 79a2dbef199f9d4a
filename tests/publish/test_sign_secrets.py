"""No signing secret in any process's argv, the registry's log, kiln's records or its output
during a signed publish against a real registry on 127.0.0.1."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from pubtest import NAME
from signing import SIGNING_PASSWORD, signing_env

pytestmark = [pytest.mark.docker, pytest.mark.registry]


# -- secrets ------------------------------------------------------------------------------------------------
def _argv_of_tree(pid: int) -> list[str]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            out.append(Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return out


def test_no_secret_in_argv_registry_log_records_or_output(mini, reg, signed, signing_keys):
    """A signed publish watched from outside: the argv of kiln and of every process it
    starts, then the registry's request log and storage, kiln's records and output."""
    ours, _ = signing_keys
    mini.pass_smoke()
    env = {**os.environ, "COLUMNS": "300", **mini.env(reg), **signing_env()}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiln", "publish", NAME, "--registry", f"{reg.host}/argv", "--sign", str(ours.private)],
        cwd=mini.root,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    seen: list[str] = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            seen.extend(_argv_of_tree(proc.pid))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    out, err = proc.communicate(timeout=900)
    stop.set()
    watcher.join()
    assert proc.returncode == 0, err[-3000:]
    assert any("--sign" in argv for argv in seen)  # the watcher did see the process
    private_pem = ours.private.read_text()
    body_lines = [ln for ln in private_pem.splitlines() if ln and not ln.startswith("-----")]
    from kiln.domain.signing import keys

    key = keys.load_private_key(ours.private, SIGNING_PASSWORD.encode())
    raw = key.pkcs8()
    leaks = [SIGNING_PASSWORD, *body_lines, base64.b64encode(raw).decode(), raw.hex()]
    for argv in seen:
        assert not any(s in argv for s in leaks), argv
    assert not any(s in out + err for s in leaks)
    for run in mini.outputs:
        assert not any(s in run.stdout + run.stderr for s in leaks), run.args
    log = reg.log_text()
    assert not any(s in log for s in leaks)
    for path, data in reg.stored_bytes():
        for s in leaks:
            assert s.encode() not in data, f"secret in registry file {path}"
        assert raw not in data, f"private key bytes in registry file {path}"
    records = list((mini.results / "publish").glob("*.json"))
    signed_records = [json.loads(p.read_text()) for p in records if json.loads(p.read_text()).get("signature")]
    assert signed_records and all(r["signature"]["key_fingerprint"] == ours.fingerprint for r in signed_records)
    for p in records:
        text = p.read_text()
        assert not any(s in text for s in leaks), p
        assert "PRIVATE KEY" not in text and "PUBLIC KEY" not in text  # the fingerprint only
