"""Every Docker daemon endpoint kiln uses, failed in turn, against the real daemon.

A proxy (tests/dockerproxy.py) sits between the `kiln` process and the daemon's socket
(`DOCKER_HOST`); for one endpoint at a time it answers HTTP 500 with a daemon-style
message (`status`) or closes the connection after part of the answer (`cut`), and
passes everything else through. For each case the real command runs (`kiln build`,
`run`, `stop`, `ps`, `logs`, `smoke`, `publish`, `prune`) and the test checks: no
traceback and no "internal error"; the documented exit code (docs/reliability.md, "The
Docker daemon's faults", which CASES must match row for row); one `kiln: error:` line
naming what was being done; and nothing left half-done: no new tag after a failed build,
no kiln container left after a run, stop or smoke that failed, no digest or channel tag
in the registry after a failed publish. An endpoint the commands used that the proxy's
table does not know fails the case too: a new daemon call needs its row.

The recipe is kiln-test-mini renamed, on the small stand-in engine, with a stand-in for
vLLM (tests/fixtures/faultserver) that is healthy in a second, so no case serves a model.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from dockerproxy import ENDPOINTS, DockerFaultProxy
from kilntest import (
    FIXTURES,
    REPO,
    kiln_containers_on,
    passing_smoke_record,
    remove_images,
    renamed_mini,
    run_kiln,
)
from publish.localregistry import LocalRegistry, available

NAME = "kiln-test-faults"
REPOSITORY = "kiln-test/faults"
DOCS = REPO / "docs" / "reliability.md"
STAND_IN_ENGINE = "kiln/engine-cpu:vllm-0.0.1.dev0"
# the endpoints no case here reaches, and where each one's mapping is tested instead
NOT_REACHED = {
    "image create": "pull of a registry base, and `kiln base build`'s import: tests/test_daemon_errors.py",
    "network create": "multi-node smoke only (real vLLM): tests/test_daemon_errors.py",
    "network inspect": "not used: the network is removed by name",
    "network remove": "multi-node smoke only (real vLLM): tests/test_daemon_errors.py",
}


@dataclass(frozen=True)
class Case:
    command: str  # the scenario: build, run, serve (foreground, then Ctrl-C), stop, ps, logs, smoke, publish, prune
    endpoint: str  # a key of dockerproxy.ENDPOINTS
    mode: str  # status: HTTP 500; cut: the connection closed after `after` bytes of the answer
    exit: int  # the documented exit code
    says: str = ""  # in the one error (or warning) line
    after: int = 64
    skip: int = 0  # matching requests passed on before the fault starts

    @property
    def id(self) -> str:
        return f"{self.command}-{self.endpoint.replace(' ', '-')}-{self.mode}"


CASES = [
    Case("ps", "ping", "status", 3, "cannot reach the Docker daemon"),
    Case("ps", "version", "status", 3, "cannot reach the Docker daemon"),
    Case("ps", "container list", "status", 34, "listing the containers labelled ai.kiln.run.recipe"),
    Case("ps", "container list", "cut", 34, "the connection to the Docker daemon broke", after=8),
    Case("ps", "container inspect", "status", 34, "listing the containers labelled"),
    Case("build", "image inspect", "status", 34, "looking up image kiln/kiln-test-faults:"),
    # the disk preflight of an engine build (--force-engine): nothing has started yet
    Case("build-engine", "info", "status", 34, "asking the Docker daemon where it keeps its data"),
    Case("build-engine", "info", "cut", 34, "the connection to the Docker daemon broke", after=8),
    Case("build", "build", "status", 5, "kiln-test-faults: (before the first step): the Docker daemon answered 500"),
    Case("build", "build", "cut", 34, "kiln-test-faults: the build's stream broke (at Step "),
    Case("build", "image save", "status", 5, "docker save of sha256:"),
    Case("build", "image save", "cut", 5, "docker save of sha256:", after=1 << 20),
    Case("build", "image load", "status", 5, "docker load failed: the Docker daemon answered 500"),
    Case("build", "image load", "cut", 5, "docker load failed: the connection to the Docker daemon broke", after=8),
    # the first tag is the reused engine's alias: the fault hits the new recipe image's
    Case("build", "image tag", "status", 34, "as kiln/kiln-test-faults:", skip=1),
    Case("run", "container create", "status", 13, "creating container kiln-kiln-test-faults-"),
    Case("run", "container start", "status", 13, "starting container kiln-kiln-test-faults-"),
    Case("run", "container inspect", "status", 13, "creating container kiln-kiln-test-faults-"),
    Case("run", "container inspect", "cut", 13, "the connection to the Docker daemon broke", after=8),
    Case("run", "container wait", "status", 0),
    Case("serve", "container logs", "status", 34, "following the log of container kiln-kiln-test-faults-"),
    Case("serve", "container logs", "cut", 34, "ended the log stream while the container still runs", after=200),
    Case("serve", "container stop", "status", 34, "kiln removed the container with force instead"),
    Case("serve", "container remove", "status", 130),
    Case("stop", "container stop", "status", 34, "kiln removed the container with force instead"),
    Case("stop", "container remove", "status", 0),
    Case("logs", "container logs", "status", 34, "reading the log of container kiln-kiln-test-faults-"),
    Case("logs", "container logs", "cut", 34, "the connection to the Docker daemon broke", after=200),
    Case("smoke", "exec create", "status", 34, "in container kiln-kiln-test-faults-"),
    Case("smoke", "exec start", "cut", 34, "in container kiln-kiln-test-faults-", after=50),
    Case("smoke", "exec inspect", "status", 34, "in container kiln-kiln-test-faults-"),
    Case("publish", "image tag", "status", 34, "tagging sha256:"),
    Case("publish", "image push", "status", 9, "push of 127.0.0.1:"),
    Case("publish", "image push", "cut", 9, "the connection to the Docker daemon broke", after=200),
    Case("publish", "image remove", "status", 0, "is left behind: `docker rmi 127.0.0.1:"),
    Case("prune", "image list", "status", 34, "listing images labelled ai.kiln.input-digest"),
    Case("prune", "image remove", "status", 34, "removing image kiln/kiln-test-faults:stale"),
]


# -- the documentation's table is these cases -----------------------------------------
DOCS_COMMAND = {"serve": "run", "build-engine": "build"}  # scenarios the table lists under another command


def test_cases_cover_every_endpoint_and_match_the_docs_table():
    """Unit level (no daemon): every endpoint of the proxy's table has a case or a reason
    it has none, and docs/reliability.md lists exactly these cases with these codes."""
    covered = {c.endpoint for c in CASES}
    assert covered | set(NOT_REACHED) == set(ENDPOINTS), set(ENDPOINTS) ^ (covered | set(NOT_REACHED))
    assert not covered & set(NOT_REACHED)
    rows = set()
    for line in DOCS.read_text().splitlines():
        m = re.match(
            r"^\| `kiln (\w+)[^|]*\| (\w+ /[\w{}./-]*) \((\w[\w ]*)\) \| (500|cut) \| .* \| (\d+) \| .* \|$", line
        )
        if m:
            rows.add((m.group(1), m.group(3), "status" if m.group(4) == "500" else "cut", int(m.group(5))))
    assert rows == {(DOCS_COMMAND.get(c.command, c.command), c.endpoint, c.mode, c.exit) for c in CASES}, (
        "docs/reliability.md's daemon-fault table and CASES differ"
    )


# -- the world the cases run in ----------------------------------------------------------
@dataclass
class World:
    root: Path
    results: Path
    docker_config: Path
    proxy: DockerFaultProxy
    image_id: str  # kiln/kiln-test-faults:latest, built from the current inputs

    def env(self, through_proxy: bool = True, **extra: str) -> dict[str, str]:
        env = {
            "KILN_ROOT": str(self.root),
            "KILN_RESULTS_DIR": str(self.results),
            "DOCKER_CONFIG": str(self.docker_config),
            "KILN_REGISTRY_USER": "",
            "KILN_REGISTRY_PASSWORD": "",
        }
        if through_proxy:
            env["DOCKER_HOST"] = self.proxy.docker_host
        return {**env, **extra}

    def kiln(self, *args: str, through_proxy: bool = True, **extra: str) -> subprocess.CompletedProcess[str]:
        return run_kiln(*args, env=self.env(through_proxy, **extra), cwd=self.root)


@pytest.fixture(scope="module")
def world(tmp_path_factory, base_image, docker_daemon):
    tmp = tmp_path_factory.mktemp("daemonfaults")
    root = renamed_mini(tmp / "tree", NAME, f"publish:\n  repository: {REPOSITORY}\n")
    for name in ("Dockerfile", "health.py"):
        shutil.copy(FIXTURES / "faultserver" / name, root / "recipes" / NAME / name)
    (tmp / "docker-config").mkdir()
    proxy = DockerFaultProxy(tmp / "docker.sock").start()
    w = World(root, tmp / "results", tmp / "docker-config", proxy, "")
    try:
        built = w.kiln("build", NAME, through_proxy=False)
        assert built.returncode == 0, built.stderr[-3000:]
        w.image_id = docker_daemon.image(f"kiln/{NAME}:latest").id
        yield w
    finally:
        proxy.stop()
        for box in docker_daemon.client.containers.list(all=True, filters={"label": f"ai.kiln.run.recipe={NAME}"}):
            box.remove(force=True)
        remove_images(docker_daemon, f"kiln/{NAME}")
        # what the failed builds made and left untagged (their layer cache stays, as for any build)
        for img in docker_daemon.client.images.list(filters={"dangling": True, "label": f"ai.kiln.recipe={NAME}"}):
            docker_daemon.remove_image(img.id)


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    why = available()
    if why:
        pytest.skip(why)
    reg = LocalRegistry(tmp_path_factory.mktemp("faults-registry")).start()
    yield reg
    reg.stop()


def _resident(world: World, docker_daemon) -> str:
    """The name of a running kiln container of the recipe, started (through the real
    socket) when there is none."""
    running = docker_daemon.client.containers.list(filters={"label": f"ai.kiln.run.recipe={NAME}"})
    if running:
        return running[0].name
    from kiln.domain.serving.serving_container import free_port

    started = world.kiln("run", NAME, "--detach", "--port", str(free_port()), through_proxy=False)
    assert started.returncode == 0, started.stderr[-3000:]
    return docker_daemon.client.containers.list(filters={"label": f"ai.kiln.run.recipe={NAME}"})[0].name


def _ours(docker_daemon) -> set[str]:
    """Names of the kiln containers of the recipe, in any state."""
    return {
        c.name for c in docker_daemon.client.containers.list(all=True, filters={"label": f"ai.kiln.run.recipe={NAME}"})
    }


def _settled(check, timeout_s: float = 15.0):
    """`check()` once it is truthy (AutoRemove and a cancelled build finish a moment after
    kiln exits), else its last value."""
    deadline = time.monotonic() + timeout_s
    while not (value := check()) and time.monotonic() < deadline:
        time.sleep(0.25)
    return value


# -- the scenarios: run the command, check what is left ----------------------------------
def _build(world: World, case: Case, docker_daemon, *flags: str) -> subprocess.CompletedProcess[str]:
    """A fresh build of the recipe (new inputs, the engine reused); a failed one moves no tag."""
    payload = world.root / "recipes" / NAME / "payload.txt"
    before = {t for img in docker_daemon.client.images.list(name=f"kiln/{NAME}") for t in img.tags}
    boxes = {c.id for c in docker_daemon.client.containers.list(all=True, filters={"ancestor": STAND_IN_ENGINE})}
    original = payload.read_text()
    payload.write_text(f"payload for {case.id}\n")
    try:
        result = world.kiln("build", NAME, *flags)
    finally:
        payload.write_text(original)
    after = {t for img in docker_daemon.client.images.list(name=f"kiln/{NAME}") for t in img.tags}
    assert after == before, f"tags moved by a failed build: {sorted(after ^ before)}"
    assert docker_daemon.image(f"kiln/{NAME}:latest").id == world.image_id
    # the build's own containers (intermediate ones, a probe) are gone too
    assert _settled(
        lambda: (
            not {c.id for c in docker_daemon.client.containers.list(all=True, filters={"ancestor": STAND_IN_ENGINE})}
            - boxes
        )
    ), "a container of the failed build is left"
    return result


def _build_engine(world: World, case: Case, docker_daemon) -> subprocess.CompletedProcess[str]:
    """`kiln build --force-engine`: the engine build ahead is counted against the daemon's
    disk first; a fault there moves no tag of the recipe or of the engine."""
    engine_tags = {t for img in docker_daemon.client.images.list(name="kiln/engine-cpu") for t in img.tags}
    result = _build(world, case, docker_daemon, "--force-engine")
    assert {t for img in docker_daemon.client.images.list(name="kiln/engine-cpu") for t in img.tags} == engine_tags
    return result


def _run(world: World, case: Case, docker_daemon) -> subprocess.CompletedProcess[str]:
    from kiln.domain.serving.serving_container import free_port

    port = free_port()
    result = world.kiln("run", NAME, "--detach", "--port", str(port))
    if result.returncode == 0:  # a detached server was asked for: it serves, and is ours to remove
        left = kiln_containers_on(docker_daemon, port)
        assert [c.status for c in left] == ["running"], left
        for box in left:
            box.remove(force=True)
    else:
        assert _settled(lambda: not kiln_containers_on(docker_daemon, port)), (
            f"a failed run left {[c.name for c in kiln_containers_on(docker_daemon, port)]}"
        )
    return result


def _serve(world: World, case: Case, docker_daemon) -> subprocess.CompletedProcess[str]:
    """A foreground `kiln run`; Ctrl-C once it serves (unless the fault ends it first)."""
    from kiln.domain.serving.serving_container import free_port, health_ok

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiln", "run", NAME, "--port", str(port)],
        cwd=world.root,
        env={**os.environ, "COLUMNS": "300", **world.env()},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and not health_ok(f"http://127.0.0.1:{port}") and time.monotonic() < deadline:
            time.sleep(0.2)
        if proc.poll() is None and case.endpoint != "container logs":
            time.sleep(0.5)  # serving and streaming its log
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert _settled(lambda: not kiln_containers_on(docker_daemon, port)), "a container is left after the run ended"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _stop(world: World, case: Case, docker_daemon) -> subprocess.CompletedProcess[str]:
    name = _resident(world, docker_daemon)
    result = world.kiln("stop", name)
    assert _settled(lambda: name not in _ours(docker_daemon)), f"{name} is left after kiln stop"
    return result


def _ps(world: World, case: Case, docker_daemon) -> subprocess.CompletedProcess[str]:
    _resident(world, docker_daemon)  # something to list (and to inspect)
    return world.kiln("ps")


def _logs(world: World, case: Case, docker_daemon) -> subprocess.CompletedProcess[str]:
    name = _resident(world, docker_daemon)
    result = world.kiln("logs", name)
    assert name in _ours(docker_daemon)  # reading a log changes nothing
    return result


def _smoke(world: World, case: Case, docker_daemon) -> subprocess.CompletedProcess[str]:
    """The stand-in fails smoke's HTTP checks (exit 8 without a fault); a daemon fault
    stops the smoke instead: no verdict, no record, the container removed."""
    from kiln.infra.records import record_path

    ours = _ours(docker_daemon)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KILN_RESULTS_DIR", str(world.results))
        record = record_path(world.image_id)
    record.unlink(missing_ok=True)
    result = world.kiln("smoke", NAME)
    assert not record.exists(), "a smoke stopped by a daemon fault wrote a record"
    assert _settled(lambda: _ours(docker_daemon) <= ours), f"smoke left {_ours(docker_daemon) - ours}"
    return result


def _publish(world: World, case: Case, docker_daemon, registry) -> subprocess.CompletedProcess[str]:
    """A publish to a namespace of its own (so that every case pushes); a failed one
    writes neither the channel nor the input-digest tag."""
    from kiln.infra.records import write_smoke_record

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KILN_RESULTS_DIR", str(world.results))
        write_smoke_record(passing_smoke_record(world.image_id, NAME, note="written by tests/test_daemon_faults.py"))
    namespace = case.id.replace("-", "")
    result = world.kiln("publish", NAME, "--registry", f"{registry.host}/{namespace}", **registry.env())
    tags = registry.tags(f"{namespace}/{REPOSITORY}")
    short = docker_daemon.image(world.image_id).labels["ai.kiln.input-digest"].split(":")[1][:12]
    if result.returncode != 0:
        assert short not in tags and "experimental" not in tags, tags
    local = [t for img in docker_daemon.client.images.list() for t in img.tags if t.startswith(registry.host)]
    for tag in local:  # the push tag, which only the image-remove fault leaves (and says so)
        assert case.endpoint == "image remove", local
        docker_daemon.remove_image(tag)
    return result


def _prune(world: World, case: Case, docker_daemon) -> subprocess.CompletedProcess[str]:
    """`kiln prune NAME` with one stale image of the recipe (other input digest)."""
    stale = f"kiln/{NAME}:stale"
    _image, _ = docker_daemon.client.images.build(
        fileobj=io.BytesIO(f"FROM kiln/{NAME}:latest\nLABEL ai.kiln.input-digest=sha256:{'0' * 64}\n".encode()),
        tag=stale,
        rm=True,
    )
    try:
        result = world.kiln("prune", NAME)
        if result.returncode != 0:  # nothing removed that was not named
            assert docker_daemon.image(f"kiln/{NAME}:latest").id == world.image_id
    finally:
        docker_daemon.remove_image(stale)
    return result


SCENARIOS = {
    "build": _build,
    "build-engine": _build_engine,
    "run": _run,
    "serve": _serve,
    "stop": _stop,
    "ps": _ps,
    "logs": _logs,
    "smoke": _smoke,
    "prune": _prune,
}


@pytest.mark.docker
@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c.id, marks=[pytest.mark.registry] if c.command == "publish" else []) for c in CASES]
)
def test_daemon_fault(case: Case, world: World, docker_daemon, request):
    fault = world.proxy.arm(
        case.endpoint,
        case.mode,
        after=case.after,
        skip=case.skip,
        message=f"injected by the test: {case.endpoint} failed",
    )
    try:
        if case.command == "publish":
            result = _publish(world, case, docker_daemon, request.getfixturevalue("registry"))
        else:
            result = SCENARIOS[case.command](world, case, docker_daemon)
    finally:
        world.proxy.disarm()
    out = result.stdout + result.stderr
    assert fault.hits >= 1, f"the fault never fired ({case.endpoint} not reached): {out[-2000:]}"
    unknown = sorted(e for e in world.proxy.endpoints_seen() if e not in ENDPOINTS)
    assert not unknown, f"kiln used endpoints the proxy's table lacks (add a row and a case): {unknown}"
    assert "Traceback" not in out and "internal error" not in out, out[-3000:]
    assert result.returncode == case.exit, out[-3000:]
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("kiln: error:")]
    if case.exit in (0, 130):
        assert errors == [], errors
        if case.says:
            assert case.says in result.stderr, result.stderr[-3000:]
    else:
        assert len(errors) == 1, result.stderr[-3000:]
        assert case.says in errors[0], errors[0]
        if case.exit == 34:  # the daemon's own words reach the user
            assert "injected by the test" in errors[0] or case.mode == "cut", errors[0]
    warnings = [ln for ln in result.stderr.splitlines() if ln.startswith("warning:")]
    print(json.dumps({"case": case.id, "exit": result.returncode, "line": (errors or warnings or [""])[0]}))
