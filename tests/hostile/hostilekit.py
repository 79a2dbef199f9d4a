"""Shared by the hostile-input tests: a throwaway kiln tree, the real CLI run in-process
or as the `kiln` console script, and the shapes an error line may take."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from kilntest import REPO, link_served_records

# what a recipe problem looks like: `kiln: error: FILE:LINE: FIELD: MESSAGE`, FILE inside recipes/
RECIPE_LINE = re.compile(r"^kiln: error: (?P<file>recipes/\S+?):(?P<line>[1-9]\d*): (?P<field>\S.*?): (?P<msg>\S.*)$")
# an unknown or unusable recipe name
NAME_LINE = re.compile(r"^kiln: error: (no recipe named '.*'|'.*' is not a recipe name) in recipes/ \(known: .+\)$")
HINT_LINE = re.compile(r"^  hint: \S.*$")
OK_LINE = re.compile(r"^ok [a-z0-9-]+$")

TIME_LIMIT_S = 2.0
MEMORY_LIMIT_MB = 200


def wall_limit_s() -> float:
    """TIME_LIMIT_S on an idle machine; on one already running more than a job per core
    (parallel CI, other test sessions) wall time stretches with the load, CPU time does
    not: the CPU-time limit stays TIME_LIMIT_S."""
    return TIME_LIMIT_S * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


def make_root(dest: Path) -> Path:
    """A kiln checkout with copies of the real recipes and engine sources, so cases can
    break recipes freely."""
    for part in ("recipes", "docker-images", "engine", "patches"):
        shutil.copytree(
            REPO / part, dest / part, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "tests"), symlinks=True
        )
    link_served_records(dest)
    return dest


def hermetic_env(root: Path) -> dict[str, str]:
    """No Docker (check only validates), caches and results inside the tree."""
    return {
        "KILN_ROOT": str(root),
        "KILN_CACHE_DIR": str(root / ".cache"),
        "KILN_RESULTS_DIR": str(root / "results"),
        "DOCKER_HOST": f"unix://{root}/no-docker.sock",
        "COLUMNS": "300",
    }


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str
    seconds: float
    peak_mb: float
    cpu_seconds: float = 0.0

    def time_problems(self) -> list[str]:
        out = []
        if self.cpu_seconds >= TIME_LIMIT_S:
            out.append(f"{self.cpu_seconds:.2f} s of CPU")
        if self.seconds >= wall_limit_s():
            out.append(f"{self.seconds:.2f} s wall (limit {wall_limit_s():.1f} s at this load)")
        if self.peak_mb >= MEMORY_LIMIT_MB:
            out.append(f"{self.peak_mb:.0f} MB peak")
        return out


def _peak_kb() -> int:
    with open("/proc/self/status") as fh:
        return int(re.search(r"VmHWM:\s+(\d+)", fh.read()).group(1))


def _rss_kb() -> int:
    with open("/proc/self/status") as fh:
        return int(re.search(r"VmRSS:\s+(\d+)", fh.read()).group(1))


@contextlib.contextmanager
def _in_tree(root: Path):
    from kiln.basics import log, paths

    saved_env = {k: os.environ.get(k) for k in hermetic_env(root)}
    saved_cwd, saved_debug = os.getcwd(), log.DEBUG
    os.environ.update(hermetic_env(root))
    os.chdir(root)
    paths.repo_root.cache_clear()
    try:
        yield
    finally:
        os.chdir(saved_cwd)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        paths.repo_root.cache_clear()
        log.set_debug(saved_debug)


def run_inprocess(root: Path, argv: list[str]) -> Outcome:
    """`kiln.cli.main(argv)` in this process, as the console script would run it; peak
    memory is the growth of this process's high-water mark (reset first)."""
    from kiln import cli

    out, err = io.StringIO(), io.StringIO()
    with _in_tree(root), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")  # resets VmHWM to the current RSS
            base = _rss_kb()
        except OSError:  # no reset: only growth of the old high-water mark shows
            base = _peak_kb()
        t0, c0 = time.perf_counter(), time.process_time()
        code = cli.main(list(argv))
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        peak = _peak_kb() - base
    return Outcome(code, out.getvalue(), err.getvalue(), seconds, peak / 1024, cpu)


def error_lines(outcome: Outcome) -> list[str]:
    return [ln for ln in outcome.stderr.splitlines() if ln.startswith("kiln: error:")]


def shape_problems(outcome: Outcome, shape: str = "recipe") -> list[str]:
    """Everything wrong with how kiln reported: no traceback, exit 0 or 2, and at exit 2
    every error line one `file:line: field: message` (or name) line, plus hints."""
    bad = []
    text = outcome.stdout + outcome.stderr
    if "Traceback" in text or "internal error" in text:
        bad.append("traceback / internal error")
    if outcome.code not in (0, 2):
        bad.append(f"exit {outcome.code}")
    if outcome.code == 2:
        pattern = NAME_LINE if shape == "name" else RECIPE_LINE
        lines = [ln for ln in outcome.stderr.splitlines() if ln.strip()]
        if shape == "all":  # `kiln check --all` also reports the recipes that are fine
            lines = [ln for ln in lines if not OK_LINE.match(ln)]
        if not error_lines(outcome):
            bad.append("exit 2 without an error line")
        for ln in lines:
            if not (pattern.match(ln) or HINT_LINE.match(ln)):
                bad.append(f"not a one-line error: {ln!r}")
    return bad
