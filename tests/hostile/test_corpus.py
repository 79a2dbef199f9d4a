"""Hostile recipe files through the real CLI: exit 2 with one-line `file:line: field:
message` errors (0 where the input is harmless), never a traceback, in under 2 s and
200 MB each."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from cases import CASES
from hostilekit import (
    Outcome,
    error_lines,
    hermetic_env,
    make_root,
    run_inprocess,
    shape_problems,
)
from recipe_edits import Case


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    return make_root(tmp_path_factory.mktemp("template") / "tree")


@pytest.fixture
def tree(template, tmp_path):
    return shutil.copytree(template, tmp_path / "tree", symlinks=True)


def _check(case: Case, outcome) -> None:
    assert shape_problems(outcome, case.shape) == [], outcome.stderr[-3000:]
    assert outcome.code == case.code, outcome.stderr[-3000:]
    if case.code == 2:
        first = error_lines(outcome)[0]
        assert re.search(case.expect, outcome.stderr), outcome.stderr[-3000:]
        if case.line is not None:
            assert re.match(rf"kiln: error: \S+?:{case.line}: ", first), first


def test_corpus_is_large_and_unique():
    assert len(CASES) >= 50
    assert len({c.id for c in CASES}) == len(CASES)


def _listing(root) -> set[str]:
    return {os.path.join(d, n) for d, dirs, files in os.walk(root) for n in dirs + files}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_case(case: Case, tree):
    case.setup(tree)
    before = _listing(tree)
    outcome = run_inprocess(tree, list(case.argv))
    _check(case, outcome)
    assert _listing(tree) == before, "kiln left files behind"
    assert outcome.time_problems() == []


# -- the installed console script, one process per case: wall time and peak RSS as a
# user's CI sees them; the address-space cap turns a blowup into a quick, clear failure
SUBPROCESS_CASES = [
    "alias-bomb-9x9",
    "deep-flow-nesting-10000",
    "huge-file-10mb",
    "sparse-file-4gb",
    "non-utf8-byte",
    "nul-byte",
    "build-unknown-name",
    "build-dotdot-name",
    "credentials-symlink",
    "recipe-yaml-is-fifo",
    "overlay-patches-dotdot",
    "bom-is-accepted",
]
BY_ID = {c.id: c for c in CASES}


# Run by a small launcher, not forked from pytest: Linux counts the RSS a child had before
# exec in its ru_maxrss, and a child forked from this (torch-sized) process would report
# pytest's size. The launcher caps the address space, reaps the child with wait4 and
# writes its peak RSS, CPU and wall time as JSON.
_LAUNCHER = """
import json, os, resource, subprocess, sys, time
def cap():
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
t0 = time.perf_counter()
proc = subprocess.Popen(sys.argv[2:], preexec_fn=cap)
deadline = t0 + 30
while True:
    pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
    if pid:
        break
    if time.perf_counter() > deadline:
        proc.kill()
    time.sleep(0.01)
with open(sys.argv[1], "w") as fh:
    json.dump({"code": os.waitstatus_to_exitcode(status), "seconds": time.perf_counter() - t0,
               "peak_mb": usage.ru_maxrss / 1024, "cpu_s": usage.ru_utime + usage.ru_stime}, fh)
"""


def _run_console_script(argv, cwd, env) -> Outcome:
    kiln = shutil.which("kiln")
    assert kiln, "the kiln console script is not installed (pip install -e .)"
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        proc = subprocess.run(
            [sys.executable, "-c", _LAUNCHER, str(report), kiln, *argv],
            cwd=cwd,
            env=env,
            capture_output=True,
            timeout=120,
            check=False,
        )
        got = json.loads(report.read_text())
    return Outcome(
        got["code"],
        proc.stdout.decode(errors="replace"),
        proc.stderr.decode(errors="replace"),
        got["seconds"],
        got["peak_mb"],
        got["cpu_s"],
    )


@pytest.mark.parametrize("case_id", SUBPROCESS_CASES)
def test_hostile_case_console_script(case_id: str, tree):
    case = BY_ID[case_id]
    case.setup(tree)
    outcome = _run_console_script(case.argv, tree, {**os.environ, **hermetic_env(tree)})
    _check(case, outcome)
    assert outcome.time_problems() == []
