"""kiln.infra.git: the one way kiln runs git (bounded, never raising)."""

import subprocess

from kiln.infra import git


def test_output_in_a_checkout_and_outside_one(tmp_path):
    assert git.output(tmp_path, "rev-parse", "--is-inside-work-tree") is None
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    assert git.output(tmp_path, "rev-parse", "--is-inside-work-tree") == "true"


def test_a_missing_git_answers_127(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no git on it
    done = git.run(tmp_path, "status")
    assert done.returncode == 127 and done.stderr.startswith("git: ")
    assert git.output(tmp_path, "status") is None


def test_a_hung_git_answers_124(tmp_path, monkeypatch):
    fake = tmp_path / "git"
    fake.write_text("#!/bin/sh\nexec /bin/sleep 30\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(git, "_TIMEOUT_S", 0.5)
    done = git.run(tmp_path, "log")
    assert done.returncode == 124 and "no answer in 0.5 s" in done.stderr
