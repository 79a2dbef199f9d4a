"""Every shell block in README.md, docs/*.md and recipes/*/README.md runs as written.

Each fenced block whose info string is empty or a shell (sh, bash, shell, console)
must be preceded by a tag comment saying how this test treats it:

    <!-- kiln-doc: run -->             cheap: a unit test (`nox -s unit`), with no Docker daemon
    <!-- kiln-doc: network -->         downloads from PyPI the first time (marker `network`)
    <!-- kiln-doc: e2e -->             needs the built tiny-moe image or a server (marker `e2e`)
    <!-- kiln-doc: skip: REASON -->    never run here (GPU, remote registry, ...); REASON is required
    <!-- kiln-doc: network; exit=6 --> the block is expected to end with that exit code
                                       (a command whose documented outcome is a failure)

Blocks that are not commands say so with their info string (text, yaml, json, diff).
A new untagged shell block fails `test_every_shell_block_is_tagged`.

Blocks run with bash -eo pipefail, in document order, one fresh copy of the checkout
per document (a git repository, as a clone is; commands may edit it), with the copy as
the working directory and no KILN_ROOT: exactly what a user who cloned the repository
types. Records go to a private $KILN_STATE_DIR; engine wheels come from the user's cache.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from kilntest import REPO

TAG = re.compile(r"^<!--\s*kiln-doc:\s*(run|network|e2e|skip:\s*(?P<reason>\S.*?))(?:;\s*exit=(?P<exit>\d+))?\s*-->$")
SHELL = {"", "sh", "bash", "shell", "console"}
NOT_COMMANDS = {"text", "yaml", "json", "diff", "python", "toml", "dockerfile"}
TIMEOUT = {"run": 300, "network": 900, "e2e": 1800}
IGNORED = shutil.ignore_patterns(
    ".git",
    ".venv",
    "__pycache__",
    "*.egg-info",
    ".nox",
    ".pytest_cache",
    ".ruff_cache",
    ".mypy_cache",
    "results",
    "build",
    ".whl",
    ".gl",
    ".vllm-carry",
    ".kiln-cache",
)


@dataclass
class Block:
    doc: str
    line: int
    info: str
    tag: str | None
    body: str

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted(REPO.glob("recipes/*/README.md"))]


def blocks(path: Path) -> list[Block]:
    found, lines = [], path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^```(.*)$", lines[i])
        if not m:
            i += 1
            continue
        start, info = i, m.group(1).strip()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), len(lines))
        prev = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        tag = prev if TAG.match(prev) else None
        found.append(Block(str(path.relative_to(REPO)), start + 1, info, tag, "\n".join(lines[start + 1 : end])))
        i = end + 1
    return found


ALL = [b for d in documents() for b in blocks(d)]


def test_every_shell_block_is_tagged():
    problems = []
    for b in ALL:
        if b.info in NOT_COMMANDS:
            continue
        if b.info not in SHELL:
            problems.append(f"{b.id}: info string {b.info!r}: use sh (tagged) or one of {sorted(NOT_COMMANDS)}")
        elif b.tag is None:
            problems.append(f"{b.id}: shell block without a `<!-- kiln-doc: ... -->` tag line before it")
    assert not problems, "\n".join(problems)
    assert len([b for b in ALL if b.tag]) >= 10  # the parser found the docs' blocks


def _kind(tag: str) -> str:
    m = TAG.match(tag)
    return "skip" if m.group("reason") else m.group(1)


def _params():
    for b in ALL:
        if not b.tag:
            continue
        kind = _kind(b.tag)
        marks = {"network": [pytest.mark.network], "e2e": [pytest.mark.e2e, pytest.mark.docker]}.get(kind, [])
        if kind == "skip":
            marks = [pytest.mark.skip(reason=TAG.match(b.tag).group("reason"))]
        yield pytest.param(b, id=b.id, marks=marks)


@pytest.fixture(scope="session")
def doc_env(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A `kiln` on PATH that is this tree's code, private state, the shared wheel cache."""
    base = tmp_path_factory.mktemp("docs")
    shim = base / "bin"
    shim.mkdir()
    (shim / "kiln").write_text(f'#!/bin/sh\nexec {sys.executable} -m kiln "$@"\n')
    (shim / "kiln").chmod(0o755)
    from kiln.basics.paths import cache_dir

    real, cache = cache_dir(), base / "cache"
    cache.mkdir()
    for sub in ("wheels", "sources"):  # the (large) downloads are shared; scratch trees are not
        (real / sub).mkdir(exist_ok=True)
        (cache / sub).symlink_to(real / sub)
    env = {k: v for k, v in os.environ.items() if k not in ("KILN_ROOT", "KILN_RESULTS_DIR")}
    env.update(
        PATH=f"{shim}{os.pathsep}{env.get('PATH', '')}",
        KILN_STATE_DIR=str(base / "state"),
        KILN_CACHE_DIR=str(cache),
        EDITOR="true",
        COLUMNS="200",
        PYTHONPATH=os.pathsep.join(
            [str(REPO / "src"), str(REPO / "engine"), str(REPO / "testkit"), env.get("PYTHONPATH", "")]
        ),
    )
    return base, env


_CHECKOUTS: dict[str, Path] = {}


def _checkout(base: Path, doc: str, env: dict[str, str]) -> Path:
    """One fresh copy of the repository per document, committed like a clone."""
    if doc not in _CHECKOUTS:
        dest = base / re.sub(r"\W", "_", doc)
        shutil.copytree(REPO, dest, ignore=IGNORED, symlinks=True)
        # the served runs' records that recipes name (`served:`, checked to exist), left
        # out with every `results` folder above: a clone has them
        records = Path("benchmarks") / "gpu_twin" / "results"
        (dest / records).symlink_to(REPO / records)
        git = ["git", "-c", "user.name=kiln-doc", "-c", "user.email=kiln-doc@localhost"]
        for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "fresh clone"]):
            subprocess.run([*git, *cmd], cwd=dest, check=True, capture_output=True, env=env)
        _CHECKOUTS[doc] = dest
    return _CHECKOUTS[doc]


@pytest.mark.parametrize("block", list(_params()))
def test_doc_block_runs(block: Block, doc_env, request):
    base, env = doc_env
    if _kind(block.tag) == "e2e":  # the built tiny-moe these blocks serve
        request.getfixturevalue("tiny_moe")
    cwd = _checkout(base, block.doc, env)
    kind = _kind(block.tag)
    if kind == "run":  # unit tests: daemon-optional commands (check, render, run --print) see no daemon
        env = {**env, "DOCKER_HOST": f"unix://{base}/no-docker.sock"}
    proc = subprocess.run(
        ["bash", "-eo", "pipefail", "-c", block.body],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT[kind],
        check=False,
    )
    expected = int(TAG.match(block.tag).group("exit") or 0)
    assert proc.returncode == expected, (
        f"{block.id} exited {proc.returncode}, expected {expected}:\n{block.body}\n--- stdout ---\n"
        f"{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-3000:]}"
    )
