"""Rebuilding an image from the sources its labels name and comparing (`kiln rebuild
--verify REF`). REF is a local image (tag or id) or a registry reference (pulled first).

The image's labels say what to rebuild: `ai.kiln.recipe` (the recipe),
`org.opencontainers.image.revision` (the commit of its newest input) and `ai.kiln.lock`
(the engine lock, shown for the record: it is in that commit). kiln checks the commit
out into a temporary git worktree, runs that revision's own kiln there (`--force
--no-cache`, the engine too unless `--reuse-engine`), tagged in a namespace of its own
(`kiln-verify/`, so no kiln tag moves), and compares image ids and layer digests. On a
difference it prints the first layer and the first file in it that differ, and exits 31.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple, TypedDict

from kiln.basics.documents import Shape
from kiln.basics.errors import BuildFailed, ImageNotBuilt, RebuildSourceMissing
from kiln.basics.paths import repo_root
from kiln.domain.images.image_naming import LABEL_NS
from kiln.domain.reproducible import image_diff
from kiln.infra import credentials, git
from kiln.infra.docker import DockerDaemon, Image, id_of
from kiln.usecases import progress

_NAMESPACE = "kiln-verify"
_REVISION = "org.opencontainers.image.revision"


# What a rebuild reads of the `--json` documents of the recorded revision's own kiln
# (kiln show: ShowDocument, kiln build: BuildDocument, as that revision types them): only
# the keys every revision since `kiln rebuild` writes, so an older revision's is read too.
class _ShownImage(TypedDict):
    tag: str
    input_digest: str


class _Shown(TypedDict):
    engine_image: _ShownImage


class _Built(TypedDict):
    image_id: str


_SHOWN = Shape(_Shown)
_BUILT = Shape(_Built)


def _image(docker: DockerDaemon, ref: str) -> Image:
    img = docker.image(ref)
    if img is not None:
        return img
    first = ref.split("/", 1)[0]
    if "/" in ref and ("." in first or ":" in first or first == "localhost"):  # a registry host
        return docker.ensure_base(ref, pull=True, auth=credentials.pull_auth)
    raise ImageNotBuilt(f"{ref}: no such local image (a registry reference is pulled: HOST/REPO:TAG)")


def _what_to_rebuild(img: Image, ref: str) -> tuple[str, str]:
    labels = img.labels or {}
    recipe, revision = labels.get(f"{LABEL_NS}.recipe"), labels.get(_REVISION, "")
    if not recipe:
        raise RebuildSourceMissing(f"{ref}: no {LABEL_NS}.recipe label: not a kiln recipe image")
    if not revision or revision == "unknown":
        raise RebuildSourceMissing(f"{ref}: {_REVISION} is {revision or 'missing'}: built outside a git checkout")
    if revision.endswith("-dirty"):
        raise RebuildSourceMissing(
            f"{ref}: built from uncommitted changes ({_REVISION}={revision}): no commit holds its inputs"
        )
    return recipe, revision


def _kiln(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """That revision's own kiln, on its own tree, tagging in the verify namespace."""
    path = os.pathsep.join(str(tree / p) for p in ("src", "engine", "testkit"))
    env = {
        **os.environ,
        "KILN_ROOT": str(tree),
        "KILN_IMAGE_NAMESPACE": _NAMESPACE,
        "PYTHONPATH": path + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""),
    }
    return subprocess.run(
        [sys.executable, "-m", "kiln", *args], cwd=tree, env=env, text=True, stdout=subprocess.PIPE, check=False
    )


def _reuse_local(docker: DockerDaemon, tree: Path, recipe: str) -> None:
    """--reuse-engine: tag this daemon's base and engine image for those inputs into the
    verify namespace (trusting them), so that only the recipe's own layers are rebuilt."""
    show_run = _kiln(tree, "show", recipe, "--json")
    if show_run.returncode != 0:
        raise BuildFailed(f"kiln show {recipe} at that revision failed (exit {show_run.returncode})")
    engine = _SHOWN.parse(show_run.stdout, source=f"kiln show {recipe} --json at that revision", error=BuildFailed)[
        "engine_image"
    ]
    canonical = "kiln/" + engine["tag"].split("/", 1)[1]
    img = docker.image(canonical)
    if img is None or (img.labels or {}).get(f"{LABEL_NS}.input-digest") != engine["input_digest"]:
        progress.warn(f"no local {canonical} for these inputs: the engine is rebuilt too")
        return
    docker.tag(id_of(img), engine["tag"])
    base = docker.image("kiln/base:bookworm")
    if base is not None:
        docker.tag(id_of(base), f"{_NAMESPACE}/base:bookworm")


class Rebuilt(NamedTuple):
    """A rebuild compared: the image id given, the image id rebuilt, and the first
    difference (None: the same image, or no layer or file tells them apart)."""

    given_id: str
    rebuilt_id: str
    difference: image_diff.Difference | None


def rebuild(ref: str, *, reuse_engine: bool = False, keep: bool = False, docker: DockerDaemon | None = None) -> Rebuilt:
    """Rebuild the image under `ref` from the commit its labels name, in a git worktree,
    with that revision's own kiln, and compare it with the one given."""
    docker = docker or DockerDaemon()
    img = _image(docker, ref)
    recipe, revision = _what_to_rebuild(img, ref)
    root = repo_root()
    if git.run(root, "cat-file", "-e", f"{revision}^{{commit}}").returncode != 0:
        raise RebuildSourceMissing(f"{ref}: revision {revision[:12]} is not in the checkout at {root}")
    progress.step(f"rebuilding {recipe} at {revision[:12]} (lock {(img.labels or {}).get(f'{LABEL_NS}.lock', 'none')})")
    with tempfile.TemporaryDirectory(prefix="kiln-rebuild-") as tmp:
        tree = Path(tmp) / "tree"
        added = git.run(root, "worktree", "add", "--detach", str(tree), revision)
        if added.returncode != 0:
            raise RebuildSourceMissing(f"git worktree add {revision[:12]} failed: {added.stderr.strip()[-200:]}")
        try:
            if reuse_engine:
                _reuse_local(docker, tree, recipe)
            else:
                base = _kiln(tree, "base", "build")
                if base.returncode != 0:
                    raise BuildFailed(f"kiln base build at {revision[:12]} failed (exit {base.returncode})")
            args = ["build", recipe, "--force", "--no-cache", "--json"]
            if not reuse_engine:
                args.append("--force-engine")
            built = _kiln(tree, *args)
            if built.returncode != 0:
                raise BuildFailed(f"kiln build {recipe} at {revision[:12]} failed (exit {built.returncode})")
            new_id = _BUILT.parse(
                built.stdout, source=f"kiln build {recipe} --json at {revision[:12]}", error=BuildFailed
            )["image_id"]
        finally:
            git.run(root, "worktree", "remove", "--force", str(tree))
    new = docker.require_image(new_id)
    old_id = id_of(img)
    diff = None
    if new_id != old_id:
        diff = image_diff.compare(
            img.attrs["RootFS"]["Layers"],
            new.attrs["RootFS"]["Layers"],
            dict(_comparable(img.attrs)),
            dict(_comparable(new.attrs)),
            lambda: docker.save(old_id),
            lambda: docker.save(new_id),
        )
    if not keep:  # every kiln-verify/ tag (the rebuild's, and what --reuse-engine lent it)
        for other in docker.images():
            for tag in other.tags:
                if tag.startswith(f"{_NAMESPACE}/"):
                    docker.remove_image(tag)
    return Rebuilt(old_id, new_id, diff)


def _comparable(attrs: Mapping[str, object]) -> _ComparableConfig:
    """The parts of an image's config that a rebuild must reproduce (the daemon's values)."""
    return _ComparableConfig(
        Config=attrs.get("Config"),
        Created=attrs.get("Created"),
        Architecture=attrs.get("Architecture"),
        Os=attrs.get("Os"),
        Author=attrs.get("Author"),
        Comment=attrs.get("Comment"),
    )


class _ComparableConfig(TypedDict):
    Config: object
    Created: object
    Architecture: object
    Os: object
    Author: object
    Comment: object


# the use-case's surface: what a command, or a caller in Python, imports from here
__all__ = ["Rebuilt", "rebuild"]
