"""`kiln override rebase`'s 3-way merge runs `git merge-file` through infra/git.py: a
missing git, one that hangs and one that fails each end in one UsageError line (exit 64),
never a traceback or a merge taken from half an answer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kiln.basics.errors import UsageError
from kiln.domain.patching import text_diff as D
from kiln.infra import git

LABELS = ("override", "vllm 0.31.0", "vllm 0.32.0")


def _fake_git(tmp_path: Path, body: str) -> str:
    """A PATH whose only `git` is this shell script."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "git"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(bindir)


def _merge_fails(monkeypatch: pytest.MonkeyPatch, path: str) -> UsageError:
    monkeypatch.setenv("PATH", path)
    with pytest.raises(UsageError) as raised:
        D.merge3(b"a\n", b"b\n", b"c\n", LABELS)
    err = raised.value
    assert err.exit_code == 64 and "\n" not in err.message
    return err


def test_the_real_git_merges(monkeypatch: pytest.MonkeyPatch) -> None:
    merged = D.merge3(b"a\nb\nc\n", b"A\nb\nc\n", b"a\nb\nC\n", LABELS)
    assert merged.data == b"A\nb\nC\n" and merged.conflicts == []


def test_no_git_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    err = _merge_fails(monkeypatch, str(empty))
    assert err.message.startswith("`git` is not installed")


def test_a_hanging_git_is_stopped_at_the_timeout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(git, "_TIMEOUT_S", 0.5)
    err = _merge_fails(monkeypatch, _fake_git(tmp_path, "exec /bin/sleep 30"))
    assert err.message == "git merge-file: no answer in 0.5 s"


def test_a_failing_git_names_its_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    err = _merge_fails(monkeypatch, _fake_git(tmp_path, "echo 'error: could not read base' >&2; exit 255"))
    assert err.message == "git merge-file failed: error: could not read base"
    assert os.environ["PATH"].endswith("bin")  # the fake, not the real git, answered
