"""Where two images differ: the first layer and file, or config field, that differ.

The first layer whose digest differs, and in it the first file (in the layers' sorted
order) whose type, mode, owner, size, link target, mtime or bytes differ; or, when every
layer is equal, the first config field that differs.

Layers are read by streaming `docker save`: nothing is held in memory but the index."""

from __future__ import annotations

import hashlib
import json
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO, Any

from kiln.domain.reproducible.save_archive import CHUNK, ChunkReader

_FileFacts = tuple[str, int, int, int, int, str, int, str]  # type, mode, uid, gid, size, link, mtime, sha256


@dataclass(frozen=True)
class Difference:
    """The first place two builds of an image differ: a layer and file, or the config."""

    layer: int | None  # index into the layers; None: the layers agree, the configs do not
    layer_a: str | None
    layer_b: str | None
    path: str | None  # the first file that differs (None: only a layer count, or config)
    what: str  # how it differs, one line

    def line(self) -> str:
        """The difference as one line of a report."""
        if self.layer is None:
            return f"config: {self.what}"
        where = f"layer {self.layer + 1} ({(self.layer_a or 'none')[:19]} vs {(self.layer_b or 'none')[:19]})"
        return f"{where}: {self.path}: {self.what}" if self.path else f"{where}: {self.what}"


class _HashingReader:
    def __init__(self, fh: IO[bytes]) -> None:
        self.fh = fh
        self.hash = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.fh.read(size)
        self.hash.update(data)
        return data


def _index_layer(fh: IO[bytes]) -> tuple[str, dict[str, _FileFacts]]:
    """(diff id, path -> facts) of one layer tar read as a stream."""
    reader = _HashingReader(fh)
    index: dict[str, _FileFacts] = {}
    with tarfile.open(fileobj=reader, mode="r|") as tar:  # type: ignore[call-overload]
        for m in tar:
            sha = ""
            if m.isreg():
                h = hashlib.sha256()
                body = tar.extractfile(m)
                assert body is not None  # for mypy: set above  # noqa: S101
                while chunk := body.read(CHUNK):
                    h.update(chunk)
                sha = h.hexdigest()
            kind = m.type.decode() if isinstance(m.type, bytes) else str(m.type)
            index[m.name.removeprefix("./").rstrip("/")] = (
                kind,
                m.mode,
                m.uid,
                m.gid,
                m.size if m.isreg() else 0,
                m.linkname,
                int(m.mtime),
                sha,
            )
    while reader.read(CHUNK):  # the tar's end padding is part of the digest
        pass
    return "sha256:" + reader.hash.hexdigest(), index


def _layer_indexes(chunks: Iterable[bytes], wanted: set[str]) -> dict[str, dict[str, _FileFacts]]:
    """The file index of every layer of a `docker save` stream whose diff id is in `wanted`."""
    out: dict[str, dict[str, _FileFacts]] = {}
    with tarfile.open(fileobj=ChunkReader(chunks), mode="r|") as tar:  # type: ignore[call-overload]
        for m in tar:
            if not (m.isreg() and m.name.endswith("/layer.tar")):
                continue
            body = tar.extractfile(m)
            assert body is not None  # for mypy: set above  # noqa: S101
            diff, index = _index_layer(body)
            if diff in wanted:
                out[diff] = index
    return out


_FACTS = ("type", "mode", "uid", "gid", "size", "link target", "mtime", "content (sha256)")


def _first_file_difference(left: dict[str, _FileFacts], right: dict[str, _FileFacts]) -> tuple[str, str] | None:
    for path in sorted(set(left) | set(right), key=lambda p: tuple(p.split("/"))):
        fa, fb = left.get(path), right.get(path)
        if fa == fb:
            continue
        if fa is None or fb is None:
            return path, "only in the " + ("second" if fa is None else "first") + " image"
        i = next(i for i in range(len(fa)) if fa[i] != fb[i])
        va, vb = fa[i], fb[i]
        shown = f"{va!s:.16} vs {vb!s:.16}" if i == 7 else f"{va!r} vs {vb!r}"
        return path, f"{_FACTS[i]} differs: {shown}"
    return None


def _first_config_difference(left: dict[str, Any], right: dict[str, Any], prefix: str = "") -> str | None:
    for key in sorted(set(left) | set(right)):
        va, vb = left.get(key), right.get(key)
        if va == vb:
            continue
        if isinstance(va, dict) and isinstance(vb, dict):
            return _first_config_difference(va, vb, f"{prefix}{key}.")
        return f"{prefix}{key}: {json.dumps(va)[:120]} vs {json.dumps(vb)[:120]}"
    return None


def compare(
    layers_a: list[str],
    layers_b: list[str],
    config_a: dict[str, Any],
    config_b: dict[str, Any],
    save_a: Any,
    save_b: Any,
) -> Difference | None:
    """None when layers and config agree; `save_x()` streams image x (called only when
    a layer differs)."""
    for i in range(max(len(layers_a), len(layers_b))):
        la = layers_a[i] if i < len(layers_a) else None
        lb = layers_b[i] if i < len(layers_b) else None
        if la == lb:
            continue
        if la is None or lb is None:
            return Difference(i, la, lb, None, "only one image has this layer")
        ia = _layer_indexes(save_a(), {la}).get(la, {})
        ib = _layer_indexes(save_b(), {lb}).get(lb, {})
        found = _first_file_difference(ia, ib)
        if found is None:
            return Difference(i, la, lb, None, "the same files, other tar bytes (order or headers)")
        return Difference(i, la, lb, found[0], found[1])
    what = _first_config_difference(config_a, config_b)
    return Difference(None, None, None, None, what) if what else None
