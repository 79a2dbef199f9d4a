"""git, run the one way kiln runs it: in a named checkout, output captured, bounded in time.

Every git command kiln runs is local (rev-parse, log, status, cat-file, worktree), so a
minute is generous even for `worktree add` of a large tree on a slow disk; a git that
hangs (a lock held by another process, a credential prompt) must not hang a build.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

TIMEOUT_S = 60


def run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`git -C root ARGS`; a git that is missing or runs past TIMEOUT_S answers 127 / 124
    with the reason on stderr, as a shell would, instead of raising."""
    cmd = ["git", "-C", str(root), *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except OSError as exc:
        return subprocess.CompletedProcess(cmd, 127, "", f"git: {exc}")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"git {args[0] if args else ''}: no answer in {TIMEOUT_S} s")


def output(root: Path, *args: str) -> str | None:
    """The command's stdout, stripped, or None when it failed (not a checkout, no git)."""
    done = run(root, *args)
    return done.stdout.strip() if done.returncode == 0 else None
