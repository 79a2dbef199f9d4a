"""The source date and revision of an image: taken from its inputs, never from the clock.

An image's `org.opencontainers.image.created` is the committer time of the newest git
commit that touched one of its inputs (the files and folders its build context is made
of), and `org.opencontainers.image.revision` is that commit, not HEAD: a commit that
changes only the README (or any file that is no input) moves neither, so the image id
does not move either. Inputs with uncommitted changes give `<commit>-dirty` (the date
stays that commit's: two builds of the same dirty tree still agree). Outside a git
checkout (or when git is missing) the date is `$SOURCE_DATE_EPOCH`, else 0, and the
revision is "unknown".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from kiln.basics.paths import repo_root
from kiln.infra import git


@dataclass(frozen=True)
class SourceDate:
    """The commit time builds stamp (SOURCE_DATE_EPOCH) and the revision it came from."""

    epoch: int
    revision: str  # the commit (40 hex), "<commit>-dirty", or "unknown"

    @property
    def commit(self) -> str | None:
        """The commit the revision names; None when it is unknown."""
        rev = self.revision.removesuffix("-dirty")
        return None if rev == "unknown" else rev


def rfc3339(epoch: int) -> str:
    """The source date as docker writes `created` (UTC, seconds)."""
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pathspecs(sources: Mapping[Path, tuple[str, ...]], root: Path) -> list[str]:
    """git pathspecs (relative to `root`) for the inputs inside the checkout, with each
    folder's excluded subpaths as `:(exclude)` specs; inputs outside it are skipped. git
    applies an exclude to every spec, so one that would hide another input (a recipe's
    Dockerfile, a feature folder under experimental/) is left out."""
    rels: dict[str, tuple[str, ...]] = {}
    for path, excludes in sorted(sources.items()):
        try:
            rels[path.resolve().relative_to(root.resolve()).as_posix()] = excludes
        except ValueError:
            continue
    specs: list[str] = []
    excluded: list[str] = []
    for rel, excludes in rels.items():
        specs.append(f":(top,literal){rel}" if rel != "." else ":(top)")
        for ex in excludes:
            full = f"{rel}/{ex}"
            if not any(other == full or other.startswith(full + "/") for other in rels):
                excluded.append(f":(top,exclude){full}")
    return specs + excluded


def _fallback() -> SourceDate:
    raw = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    return SourceDate(int(raw) if raw.isdigit() else 0, "unknown")


def of(sources: Mapping[Path, tuple[str, ...]], root: Path | None = None) -> SourceDate:
    """The source date of the inputs `sources` (BuildContext.sources)."""
    root = root or repo_root()
    specs = _pathspecs(sources, root)
    if not specs or git.output(root, "rev-parse", "--is-inside-work-tree") != "true":
        return _fallback()
    line = git.output(root, "log", "-1", "--format=%H %ct", "--", *specs)
    if not line:  # inputs never committed
        return _fallback()
    commit, ct = line.split()
    dirty = git.output(root, "status", "--porcelain", "--", *specs)
    return SourceDate(int(ct), commit + ("-dirty" if dirty else ""))
