r"""A Hugging Face hub cache, read without the hub client: is one repo's snapshot at one
revision complete enough to serve offline?

The layout is the one `huggingface_hub` writes and documents ("Understand caching",
huggingface.co/docs/huggingface_hub/guides/manage-cache):

    <cache>/models--ORG--NAME/
        refs/main                      the commit a branch pointed at when last downloaded
        blobs/<etag>                   file contents, named by the file's git hash (sha1
                                       of "blob <size>\0" + bytes) or, for LFS files, sha256
        snapshots/<commit>/<path>      relative symlinks into ../../blobs/
    (an interrupted download leaves blobs/<etag>.incomplete and no symlink)

This module runs in two places: in kiln (`kiln run`/`kiln smoke` check the host cache
before a container starts) and inside every engine image, copied to
/opt/kiln/lib/kiln_hfcache.py, where the entrypoint checks the mounted cache before it
starts vLLM (`docker run` without kiln). So it imports nothing of kiln and nothing
outside the standard library. Its answer is one line naming the repo, the revision and
the missing file, where the hub client in offline mode would end in a stack trace.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

# the container path the cache volume is mounted at; HF_HUB_CACHE points here
CONTAINER_CACHE = "/hf-cache"
_CONFIG = "config.json"
_WEIGHTS_INDEX = "model.safetensors.index.json"
# any one of these makes a tokenizer vLLM can load (fast, sentencepiece, byte-level BPE)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")
# files the hub stores in git LFS whatever their size (their etag is a sha256)
_LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".model", ".msgpack", ".h5")
_LFS_MIN_BYTES = 10 * 1024 * 1024  # the hub's default threshold for LFS


class _HfModelNames(TypedDict):
    role: str
    repo: str
    revision: str


class HfModelJson(_HfModelNames, total=False):
    """One model as launch.json's `hf_models` lists it (and this file's argv takes them)."""

    tokenizer: bool  # absent: True


@dataclass(frozen=True)
class HfModel:
    """One model a recipe reads from the cache."""

    role: str  # "target" or "draft"
    repo: str
    revision: str
    tokenizer: bool = True  # the target's tokenizer is loaded; a draft model's is not

    def to_json(self) -> HfModelJson:
        """The model as the image's hf-models file writes it."""
        return {"role": self.role, "repo": self.repo, "revision": self.revision, "tokenizer": self.tokenizer}

    @classmethod
    def from_json(cls, data: HfModelJson) -> HfModel:
        """A model from the image's hf-models file (tokenizer defaults to true)."""
        return cls(
            role=data["role"], repo=data["repo"], revision=data["revision"], tokenizer=bool(data.get("tokenizer", True))
        )


@dataclass(frozen=True)
class _Missing:
    """Why a snapshot cannot be served: the first file missing, and what is wrong with it."""

    model: HfModel
    file: str
    why: str
    cache: str

    @property
    def line(self) -> str:
        return (
            f"{self.model.role} model {self.model.repo} at revision {self.model.revision}: "
            f"{self.file} {self.why} in the Hugging Face cache {self.cache}"
        )


def _repo_folder(repo: str) -> str:
    """`models--ORG--NAME`, the hub client's folder name for a model repo."""
    return "models--" + repo.replace("/", "--")


def snapshot_dir(cache: Path, repo: str, revision: str) -> Path:
    """The snapshot folder of a model revision in a Hugging Face cache."""
    return cache / _repo_folder(repo) / "snapshots" / revision


def _state(path: Path) -> str | None:
    """None when `path` is a readable file; else why not ("is missing", "is a broken
    link (its blob is missing)", ...)."""
    if path.is_symlink() and not path.exists():
        return "is a broken link (its blob is missing: the download did not finish)"
    if not path.exists():
        return "is missing"
    if not path.is_file():
        return "is not a file"
    if not os.access(path, os.R_OK):
        return "is not readable by this user"
    return None


def _incomplete(cache: Path, repo: str) -> list[str]:
    blobs = cache / _repo_folder(repo) / "blobs"
    try:
        return sorted(p.name for p in blobs.iterdir() if p.name.endswith(".incomplete"))
    except OSError:
        return []


def check(cache: Path, model: HfModel) -> _Missing | None:
    """The first reason the snapshot of `model` cannot be served from `cache`, or None.

    Required: config.json; the weights (every shard the safetensors index names, else at
    least one *.safetensors); for a target, a tokenizer file. Files are opened through
    their links, so a snapshot whose blobs were deleted or never finished is refused."""
    shown = str(cache)
    snap = snapshot_dir(cache, model.repo, model.revision)
    if not snap.is_dir():
        have = []
        snaps = cache / _repo_folder(model.repo) / "snapshots"
        if snaps.is_dir():
            have = sorted(p.name[:12] for p in snaps.iterdir())
        absent = f"is missing (cached revisions: {', '.join(have)})" if have else "is missing"
        return _Missing(model, f"snapshots/{model.revision}/", absent + " (`kiln fetch` downloads it)", shown)
    partial = _incomplete(cache, model.repo)

    def missing(name: str, reason: str) -> _Missing:
        if partial:
            reason += f"; {len(partial)} unfinished download(s) in blobs/"
        return _Missing(model, name, reason, shown)

    why: str | None = _state(snap / _CONFIG)
    if why:
        return missing(_CONFIG, why)
    index = snap / _WEIGHTS_INDEX
    if index.exists() or index.is_symlink():
        why = _state(index)
        if why:
            return missing(_WEIGHTS_INDEX, why)
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return missing(_WEIGHTS_INDEX, "is not a safetensors index (no weight_map)")
        for shard in shards:
            if "/" in shard or shard.startswith("."):
                return missing(_WEIGHTS_INDEX, f"names a shard outside the snapshot: {shard!r}")
            why = _state(snap / shard)
            if why:
                return missing(shard, why + f" (one of the {len(shards)} shards {_WEIGHTS_INDEX} lists)")
    else:
        weights = sorted(p.name for p in snap.glob("*.safetensors"))
        if not weights:
            return missing("model.safetensors", "is missing (no *.safetensors in the snapshot)")
        for name in weights:
            why = _state(snap / name)
            if why:
                return missing(name, why)
    if model.tokenizer:
        present = [n for n in _TOKENIZER_FILES if (snap / n).exists() or (snap / n).is_symlink()]
        if not present:
            return missing(_TOKENIZER_FILES[0], f"is missing (no tokenizer: none of {', '.join(_TOKENIZER_FILES)})")
        for name in present:
            why = _state(snap / name)
            if why:
                return missing(name, why)
    return None


def check_all(cache: Path, models: list[HfModel]) -> list[_Missing]:
    """For each model the cache cannot serve, the first reason why."""
    return [m for m in (check(cache, model) for model in models) if m is not None]


# -- writing a snapshot the way the hub client does (seeding a cache from a local copy) ---
def _git_blob_sha1(data_path: Path) -> str:
    # git's object id (the hub's etag of a non-LFS file): sha1 over a header, then the bytes
    header = b"blob %d\0" % data_path.stat().st_size
    with data_path.open("rb") as fh:
        return hashlib.file_digest(
            fh,
            lambda: hashlib.sha1(header),  # git blob ids are SHA-1: an address, not a secret  # noqa: S324
        ).hexdigest()


def _sha256(data_path: Path) -> str:
    with data_path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _is_lfs(path: Path) -> bool:
    return path.suffix in _LFS_SUFFIXES or path.stat().st_size >= _LFS_MIN_BYTES


def _etag(path: Path) -> str:
    """The blob name the hub gives this file: sha256 for LFS files, the git blob sha1 otherwise."""
    return _sha256(path) if _is_lfs(path) else _git_blob_sha1(path)


def seed(source: Path, cache: Path, repo: str, revision: str, *, branch: str = "main") -> Path:
    """Copy the files of the folder `source` into `cache` as the snapshot of `repo` at
    `revision`: blobs by etag, snapshot entries as relative links into ../../blobs,
    refs/<branch> holding the revision. Returns the snapshot folder."""
    root = cache / _repo_folder(repo)
    blobs, snap = root / "blobs", snapshot_dir(cache, repo, revision)
    blobs.mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        rel = path.relative_to(source)
        blob = blobs / _etag(path)
        if not blob.exists():
            tmp = blob.with_name(blob.name + ".incomplete")
            shutil.copyfile(path, tmp)
            os.chmod(tmp, 0o644)
            tmp.replace(blob)
        link = snap / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(blob, link.parent))
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / branch).write_text(revision)
    return snap


# -- in the image: the entrypoint's check -------------------------------------------------
def _read_models(text: str) -> list[HfModel]:
    """MODELS_JSON as kiln passes it (a list of HfModelJson), with plain checks (no pydantic
    here); SystemExit naming the field, one line, when it is not one."""
    try:
        raw: Any = json.loads(text)
    except ValueError as exc:
        raise SystemExit(f"kiln-serve: MODELS_JSON: not JSON ({exc})") from None
    if not isinstance(raw, list):
        raise SystemExit("kiln-serve: MODELS_JSON: must be a JSON list")
    for i, model in enumerate(raw):
        if not isinstance(model, dict):
            raise SystemExit(f"kiln-serve: MODELS_JSON[{i}]: must be a JSON object")
        for key in ("role", "repo", "revision"):
            if not isinstance(model.get(key), str):
                raise SystemExit(f"kiln-serve: MODELS_JSON[{i}].{key}: must be a string")
        if not isinstance(model.get("tokenizer", True), bool):
            raise SystemExit(f"kiln-serve: MODELS_JSON[{i}].tokenizer: must be true or false")
    return [HfModel.from_json(m) for m in raw]


def main(argv: list[str]) -> int:
    """`python kiln_hfcache.py CACHE MODELS_JSON`: exit 0 when every snapshot is complete,
    else print one line per problem to stderr and exit 93 (kiln's HfSnapshotMissing)."""
    cache, models = Path(argv[0]), _read_models(argv[1])
    problems = check_all(cache, models)
    for problem in problems:
        print(f"kiln-serve: {problem.line}", file=sys.stderr)
    return 93 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
