"""git, run the one way kiln runs it: in a named checkout, output captured, bounded in time.

Every git command kiln runs is local (rev-parse, log, status, cat-file, worktree), so a
minute is generous even for `worktree add` of a large tree on a slow disk; a git that
hangs (a lock held by another process, a credential prompt) must not hang a build.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from kiln.basics.errors import UsageError

_TIMEOUT_S = 60


def run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`git -C root ARGS`; a git that is missing or runs past TIMEOUT_S answers 127 / 124
    with the reason on stderr, as a shell would, instead of raising."""
    cmd = ["git", "-C", str(root), *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    except OSError as exc:
        return subprocess.CompletedProcess(cmd, 127, "", f"git: {exc}")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"git {args[0] if args else ''}: no answer in {_TIMEOUT_S} s")


def output(root: Path, *args: str) -> str | None:
    """The command's stdout, stripped, or None when it failed (not a checkout, no git)."""
    done = run(root, *args)
    return done.stdout.strip() if done.returncode == 0 else None


def merge_file(ours: bytes, base: bytes, theirs: bytes, labels: tuple[str, str, str]) -> tuple[int, bytes, str]:
    """`git merge-file -p --diff3` of three texts (labels = ours, base, theirs), bounded by
    TIMEOUT_S like every git kiln runs: (exit status, merged bytes, stderr). The status is
    the number of conflicts (git caps it at 127), negative when git failed."""
    with tempfile.TemporaryDirectory(prefix="kiln-merge-") as tmp:
        files = []
        for name, data in (("ours", ours), ("base", base), ("theirs", theirs)):
            path = Path(tmp) / name
            path.write_bytes(data)
            files.append(str(path))
        cmd = ["git", "merge-file", "-p", "--diff3"]
        for label in labels:
            cmd += ["-L", label]
        try:
            proc = subprocess.run([*cmd, *files], capture_output=True, timeout=_TIMEOUT_S, check=False)
        except OSError:
            raise UsageError(
                "`git` is not installed; `kiln override rebase` merges with `git merge-file`",
                hint="install git (apt-get install git)",
            ) from None
        except subprocess.TimeoutExpired:
            raise UsageError(f"git merge-file: no answer in {_TIMEOUT_S} s") from None
    return proc.returncode, proc.stdout, proc.stderr.decode(errors="replace").strip()
