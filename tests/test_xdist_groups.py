"""kilntest.assign_xdist_groups (tests/conftest.py's hook): what may run beside what under `nox -s integration`
and `nox -s e2e`, and in which order the groups start."""

from __future__ import annotations

from pathlib import Path

import pytest
from kilntest import DAEMON_GROUP, assign_xdist_groups


class _Item:
    def __init__(self, path: str, *marks: pytest.MarkDecorator):
        self.path = Path("/repo") / path
        self.marks = [m.mark for m in marks]

    def get_closest_marker(self, name):
        return next((m for m in self.marks if m.name == name), None)

    def add_marker(self, marker):
        self.marks.append(marker.mark)

    @property
    def group(self) -> str:
        (mark,) = [m for m in self.marks if m.name == "xdist_group"]
        return mark.args[0]


def test_daemon_tests_share_one_group_and_a_module_never_splits_or_loses_its_own():
    items = [
        _Item("tests/test_build_docker.py", pytest.mark.docker),
        _Item("tests/publish/test_publish.py", pytest.mark.docker, pytest.mark.registry),
        _Item("tests/publish/test_registry_faults.py", pytest.mark.registry),
        _Item("tests/test_docs.py", pytest.mark.network),
        _Item("tests/test_docs.py", pytest.mark.network),
        _Item("tests/cuda/test_argcheck_docker.py", pytest.mark.docker, pytest.mark.xdist_group("argcheck")),
    ]
    assign_xdist_groups(Path("/repo"), items)
    assert [i.group for i in items] == [DAEMON_GROUP] * 3 + ["tests/test_docs.py"] * 2 + ["argcheck"]


def test_groups_start_daemon_first_then_tiny_kindling_then_the_hub_cache_then_the_rest_each_in_its_own_order():
    items = [
        _Item("tests/cuda/test_build_cuda_e2e.py", pytest.mark.docker),
        _Item("tests/draft_trunc/test_any_router.py", pytest.mark.kernels),
        _Item("tests/draft_trunc/test_dead_rows.py", pytest.mark.kernels),
        _Item("tests/e2e/test_hf_cache.py", pytest.mark.docker, pytest.mark.xdist_group("tiny-moe-hf")),
        _Item("tests/e2e/test_plan_cpu.py", pytest.mark.docker),
        _Item("tests/e2e/test_tiny_kindling.py", pytest.mark.docker, pytest.mark.xdist_group("tiny-kindling")),
        _Item("tests/e2e/test_twin_metrics.py", pytest.mark.docker, pytest.mark.xdist_group("tiny-kindling")),
        _Item("tests/test_docs.py", pytest.mark.docker),
    ]
    assign_xdist_groups(Path("/repo"), items)
    assert [str(i.path.relative_to("/repo")) for i in items] == [
        "tests/cuda/test_build_cuda_e2e.py",
        "tests/e2e/test_plan_cpu.py",
        "tests/test_docs.py",
        "tests/e2e/test_tiny_kindling.py",
        "tests/e2e/test_twin_metrics.py",
        "tests/e2e/test_hf_cache.py",
        "tests/draft_trunc/test_any_router.py",
        "tests/draft_trunc/test_dead_rows.py",
    ]
    assert [i.group for i in items][:3] == [DAEMON_GROUP] * 3


class _Marked:
    def __init__(self, nodeid: str, *names: str):
        self.nodeid = nodeid
        self.names = names

    def iter_markers(self):
        return [getattr(pytest.mark, n).mark for n in self.names]


def test_every_tiered_test_has_a_session_that_selects_it():
    """unitguard's stray check, which `pytest --unit` applies to every collected test:
    the kernels tier (nox -s kernels, and e2e's second worker) selects tests/draft_trunc's
    `kernels` tests, integration ignores tests/draft_trunc."""
    from unitguard import _has_a_session

    runs = {
        "tests/draft_trunc/test_exactness.py::t": ("network", "kernels"),
        "tests/draft_trunc/test_policy.py::t": ("kernels",),
        "tests/draft_trunc/test_cost.py::t": (),
        "tests/test_docs.py::t": ("network",),
        "tests/e2e/test_tiny_moe.py::t": ("e2e", "docker"),
    }
    strays = {
        "tests/draft_trunc/test_new.py::t": ("network",),  # kernels would not select it
        "tests/draft_trunc/test_daemon.py::t": ("docker",),
        "tests/test_build_docker.py::t": ("kernels",),
    }
    assert all(_has_a_session(_Marked(n, *m)) for n, m in runs.items())
    assert not any(_has_a_session(_Marked(n, *m)) for n, m in strays.items())


_PROBE_CONFTEST = """
import pytest
from kilntest import assign_xdist_groups


@pytest.hookimpl(tryfirst=True)  # as tests/conftest.py registers it
def pytest_collection_modifyitems(config, items):
    assign_xdist_groups(config.rootpath, items)
"""

_PROBE_TESTS = """
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.docker


@pytest.mark.parametrize("n", range(8))
def test_where(n):
    Path(os.environ["PROBE_OUT"], f"{n}.worker").write_text(os.environ["PYTEST_XDIST_WORKER"])
"""


def test_the_installed_pytest_and_xdist_keep_a_group_on_one_worker(tmp_path):
    """The real pair, not the hook alone: pytest 9.2 stopped reading the node id that
    xdist 3.8's loadgroup writes its group into, and the serial daemon group then ran on
    both workers at once (images removed under each other's feet). Eight daemon tests
    under `-n 2 --dist loadgroup` must all run on one worker."""
    import os
    import subprocess
    import sys

    probe, out = tmp_path / "probe", tmp_path / "out"
    probe.mkdir()
    out.mkdir()
    (probe / "conftest.py").write_text(_PROBE_CONFTEST)
    (probe / "test_probe.py").write_text(_PROBE_TESTS)
    env = {
        **os.environ,
        "PROBE_OUT": str(out),
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",
            "2",
            "--dist",
            "loadgroup",
            "-W",
            "ignore::pytest.PytestUnknownMarkWarning",
            "--rootdir",
            str(probe),
            str(probe),
        ],
        cwd=probe,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    workers = {p.read_text() for p in out.glob("*.worker")}
    assert len(list(out.glob("*.worker"))) == 8
    assert len(workers) == 1, f"one xdist group ran on {sorted(workers)}"


def test_machine_shares_coexist_and_alone_waits_for_every_share(tmp_path):
    """kilntest.machine_share, as tests/e2e/conftest.py uses it across xdist workers
    (here threads, each with its own open file, which flock(2) tells apart as it does
    processes)."""
    import threading

    from kilntest import machine_share

    second_share, alone = threading.Event(), threading.Event()

    def take(event, **how):
        with machine_share(tmp_path, **how):
            event.set()

    with machine_share(tmp_path, alone=False):
        threading.Thread(target=take, args=(second_share,), kwargs={"alone": False}).start()
        assert second_share.wait(5), "a second share waited for the first"
        waiter = threading.Thread(target=take, args=(alone,), kwargs={"alone": True})
        waiter.start()
        assert not alone.wait(0.5), "alone got the machine while a share was held"
    assert alone.wait(5), "alone never got the machine after the share ended"
    waiter.join(5)
