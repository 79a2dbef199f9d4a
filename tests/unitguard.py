"""The unit tier as a pytest plugin: `pytest --unit` (what `nox -s unit` runs).

`--unit` deselects every test that carries a tier marker (docker, registry, network,
e2e, gpu, disruptive) and switches on the guard (tests/unitguard_site/kiln_unit_guard.py)
in this process and in every Python process a test starts. A test that still reaches
the Docker daemon, any TCP/UDP peer, a DNS name, or starts docker/dockerd/
docker-registry/debootstrap/apt-get/`pip install|download` FAILS, with what it touched
and the marker it needs. The tier also runs on an empty kiln cache (KILN_CACHE_DIR),
as on a fresh machine, so a test that only passes because engine wheels were
downloaded earlier fails here too; and DOCKER_HOST points at a socket that cannot exist.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

SITE_DIR = Path(__file__).resolve().parent / "unitguard_site"
if str(SITE_DIR) not in sys.path:
    sys.path.insert(0, str(SITE_DIR))

import kiln_unit_guard as guard  # noqa: E402  (lives in SITE_DIR, which children import it from)

TIER_MARKERS = ("docker", "registry", "network", "e2e", "gpu", "disruptive", "kernels", "full")
HINTS = {
    "Docker daemon connection": "docker",
    "TCP connection": "registry / network / e2e (whatever listens there)",
    "UDP connection": "network",
    "DNS lookup": "network",
    "program": "docker / registry / network",
}
_LOGS = pytest.StashKey[Path]()
_SEEN = pytest.StashKey[int]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--unit",
        action="store_true",
        default=False,
        help="the unit tier: deselect tests marked "
        + "/".join(TIER_MARKERS)
        + ", and fail any test that reaches Docker, the network or a registry (tests/unitguard.py)",
    )


def active(config: pytest.Config) -> bool:
    return bool(config.getoption("unit", default=False))


def pytest_configure(config: pytest.Config) -> None:
    if not active(config):
        return
    logs = Path(tempfile.mkdtemp(prefix="kiln-unit-guard-"))
    config.stash[_LOGS] = logs
    cache = logs / "empty-kiln-cache"
    cache.mkdir()
    os.environ["KILN_CACHE_DIR"] = str(cache)  # a fresh machine's: no engine wheels
    guard.set_log(str(logs / "collection.jsonl"))
    guard.install(host_docker=os.environ.get("DOCKER_HOST"))
    os.environ["DOCKER_HOST"] = guard.UNUSABLE_DOCKER_HOST


def pytest_unconfigure(config: pytest.Config) -> None:
    logs = config.stash.get(_LOGS, None)
    if logs is not None:
        guard.set_log(None)
        shutil.rmtree(logs, ignore_errors=True)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not active(config):
        return
    found = guard.read_log(str(config.stash[_LOGS] / "collection.jsonl"))
    if found:
        raise pytest.UsageError(
            "unit tier: importing the tests touched what the unit tier may not:\n"
            + "\n".join(_describe(v) for v in found)
        )
    strays = [item.nodeid for item in items if not _has_a_session(item)]
    if strays:
        raise pytest.UsageError("unit tier: no nox session runs these tests (noxfile.py): " + ", ".join(strays[:10]))
    keep, drop = [], []
    for item in items:
        (drop if any(item.get_closest_marker(m) for m in TIER_MARKERS) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _has_a_session(item: pytest.Item) -> bool:
    """Whether one of noxfile.py's sessions selects `item`: integration ignores
    tests/draft_trunc, and the kernels tier (`nox -s kernels`, and e2e's second worker)
    runs only tests/draft_trunc's `kernels` tests, so a draft_trunc test needing the
    daemon or a registry, one marked `network` without `kernels`, or a `kernels` test
    elsewhere, would run nowhere."""
    marks = {m.name for m in item.iter_markers()} & set(TIER_MARKERS)
    in_draft_trunc = "tests/draft_trunc/" in item.nodeid.replace("\\", "/")
    if in_draft_trunc:
        return not marks & {"docker", "registry", "e2e"} and ("network" not in marks or "kernels" in marks)
    return "kernels" not in marks


@pytest.hookimpl(hookwrapper=True)
# pluggy hookwrapper
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):  # type: ignore[no-untyped-def]
    if active(item.config):
        log = item.config.stash[_LOGS] / f"test-{id(item)}.jsonl"
        item.stash[_SEEN] = 0
        guard.set_log(str(log))
    yield
    if active(item.config):
        guard.set_log(str(item.config.stash[_LOGS] / "between-tests.jsonl"))


@pytest.hookimpl(hookwrapper=True)
# pluggy hookwrapper
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]):  # type: ignore[no-untyped-def]
    outcome = yield
    if not active(item.config):
        return
    report: pytest.TestReport = outcome.get_result()
    found = guard.read_log(str(item.config.stash[_LOGS] / f"test-{id(item)}.jsonl"))
    new = found[item.stash.get(_SEEN, 0) :]
    item.stash[_SEEN] = len(found)
    if not new:
        return
    lines = [f"unit tier: {item.nodeid} touched what the unit tier may not ({report.when}):"]
    lines += [_describe(v) for v in new]
    lines.append("mark the test (pytestmark = pytest.mark.<marker>) or make it pure")
    report.outcome = "failed"
    report.longrepr = "\n".join(lines)


def _describe(violation: dict[str, Any]) -> str:
    where = (
        "this process"
        if violation.get("pid") == os.getpid()
        else f"child pid {violation.get('pid')} {violation.get('argv')}"
    )
    hint = HINTS.get(violation.get("kind", ""), "?")
    return f"  - {violation.get('kind')}: {violation.get('detail')}  [{where}; marker: {hint}]"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Anything touched outside a test (a fixture's finaliser run at session end) fails the run."""
    if not active(session.config):
        return
    found = guard.read_log(str(session.config.stash[_LOGS] / "between-tests.jsonl"))
    if found:
        sys.stderr.write("unit tier: touched outside any test:\n" + "\n".join(_describe(v) for v in found) + "\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
