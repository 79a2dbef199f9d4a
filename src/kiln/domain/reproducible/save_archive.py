"""Reproducible images from the legacy builder: rewrite a `docker save` archive so that
the same filesystem content and the same source date always give the same bytes.

The legacy builder (no BuildKit, no SOURCE_DATE_EPOCH) stamps the wall clock into the
image config (`created`, every `history[].created`), names the build container in it
(`container`, `container_config.Hostname`) and writes the build time into the mtime of
every file a RUN step makes. This module fixes all of that after the build and before
anything is tagged:

- every layer tar: entries in a fixed order (sorted by path components, so a directory
  comes before what it holds; hard links after the files they name), mtimes clamped to
  the source date, uname/gname dropped, pax atime/ctime dropped, numeric owners and
  modes, xattrs and link targets kept;
- the config: `created` and `history[].created` = the source date; the build container's
  id, its config, the daemon's version and the parent id dropped; `rootfs.diff_ids` the
  sha256 of the rewritten layers.

The layers the image shares with the image it was built FROM (`keep`: the parent's
diff ids, a prefix of the image's own) are kept byte for byte and left out of the archive
loaded back: the daemon already has them (docker load skips a layer whose chain it
holds), the parent is content-addressed, so every machine keeps the same ones, and an
image keeps sharing layers with its base. A recipe image then costs the rewrite of what
its recipe added, not of its ~2.6 GB engine again.

The image id is then the sha256 of the config bytes written here. Work is streamed
through files in a scratch folder: no layer is held in memory.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NotRequired, TypedDict

from kiln.basics.documents import Shape, read_document
from kiln.basics.errors import BuildFailed
from kiln.domain.reproducible.source_date import rfc3339

CHUNK = 1 << 20
_DROP_PAX = ("atime", "ctime", "mtime", "uname", "gname", "uid", "gid", "size")
# config keys only the build machine's run of the build put there
_DROP_CONFIG = ("container", "container_config", "docker_version", "parent", "id")


class _SavedImage(TypedDict):
    """One image of a `docker save` archive, as its manifest.json lists it."""

    Config: str  # the config's file in the archive
    RepoTags: NotRequired[list[str] | None]
    Layers: list[str]  # each layer's tar in the archive, base first


class _RootFs(TypedDict, total=False):
    diff_ids: list[str] | None


class _ConfigParts(TypedDict, total=False):
    """What normalising reads of an image config; every other key is kept as it is."""

    rootfs: _RootFs
    history: list[dict[str, Any]] | None
    config: dict[str, Any] | None


_SAVE_MANIFEST = Shape(list[_SavedImage])
_IMAGE_CONFIG = Shape(dict[str, Any])  # the whole config: normalised, then hashed into the image id
_CONFIG_PARTS = Shape(_ConfigParts)


def _name(member: tarfile.TarInfo) -> str:
    name = member.name
    while name.startswith("./"):
        name = name[2:]
    return name.strip("/") or "."


def _order(name: str) -> tuple[str, ...]:
    return tuple(name.split("/"))


def _normalise_member(member: tarfile.TarInfo, epoch: int) -> tarfile.TarInfo:
    """A copy of the header with no build-time facts left in it."""
    out = tarfile.TarInfo(_name(member) + ("/" if member.isdir() else ""))
    out.type = member.type
    out.mode = member.mode
    out.uid, out.gid = member.uid, member.gid
    out.uname = out.gname = ""
    out.mtime = min(int(member.mtime), epoch)
    out.size = member.size if member.isreg() else 0
    out.linkname = _name(tarfile.TarInfo(member.linkname)) if member.islnk() else member.linkname
    out.devmajor, out.devminor = member.devmajor, member.devminor
    # keep what carries meaning (xattrs, long names/links come back from the fields)
    out.pax_headers = {
        k: v for k, v in sorted(member.pax_headers.items()) if k not in _DROP_PAX and k not in ("path", "linkpath")
    }
    return out


def _normalise_layer(src: IO[bytes], dst: IO[bytes], epoch: int) -> str:
    """Rewrite the layer tar `src` (seekable) into `dst`; returns `sha256:<hex>` of what
    was written (the layer's diff id)."""
    hashing = _Hashing(dst)
    with tarfile.open(fileobj=src, mode="r:") as tin:
        members = tin.getmembers()
        # the last entry of a path wins when a tar repeats one (as extraction does)
        by_name: dict[str, tarfile.TarInfo] = {}
        for m in members:
            by_name[_name(m)] = m
        names = sorted(by_name, key=_order)
        plain = [n for n in names if not by_name[n].islnk()]
        links = [n for n in names if by_name[n].islnk()]
        with tarfile.open(fileobj=hashing, mode="w", format=tarfile.PAX_FORMAT) as tout:  # type: ignore[call-overload]
            for n in (*plain, *links):
                m = by_name[n]
                info = _normalise_member(m, epoch)
                if m.isreg():
                    fh = tin.extractfile(m)
                    tout.addfile(info, fh)
                else:
                    tout.addfile(info)
    return "sha256:" + hashing.hash.hexdigest()


def _normalise_config(config: dict[str, Any], epoch: int, diff_ids: list[str]) -> bytes:
    """The image config with the source date and the rewritten layers, as canonical bytes."""
    cfg = {k: v for k, v in config.items() if k not in _DROP_CONFIG}
    when = rfc3339(epoch)
    cfg["created"] = when
    cfg["history"] = [{**h, "created": when} for h in cfg.get("history") or []]
    inner = dict(cfg.get("config") or {})
    inner["Hostname"] = ""
    inner["Image"] = ""  # the id of the builder's last step, which no one else can have
    inner.pop("Domainname", None)
    cfg["config"] = inner
    cfg["rootfs"] = {"type": "layers", "diff_ids": list(diff_ids)}
    return json.dumps(cfg, sort_keys=True, separators=(",", ":")).encode()


def _image_id(config_bytes: bytes) -> str:
    return "sha256:" + hashlib.sha256(config_bytes).hexdigest()


@dataclass
class _Normalised:
    image_id: str
    diff_ids: list[str]
    config: bytes
    layer_files: list[Path]  # the rewritten layers, each once, in the scratch folder
    manifest: bytes
    kept: int  # how many first layers are the parent's, as they were

    def archive(self) -> Iterator[bytes]:
        """The `docker load`-able tar, streamed: the config, the rewritten layers (each
        file removed once sent) and the manifest. Nothing is written twice: the layers go
        from the scratch folder straight to the daemon. (docker load unpacks the whole
        upload before it reads manifest.json, so the order is free.)"""
        yield from _member(f"{self.image_id.split(':')[1]}.json", [self.config], len(self.config))
        for f in self.layer_files:
            yield from _member(f.name, _chunks(f), f.stat().st_size)
            f.unlink()
        yield from _member("manifest.json", [self.manifest], len(self.manifest))
        yield bytes(2 * tarfile.BLOCKSIZE)  # end of archive


def _chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            yield chunk


def _member(name: str, chunks: Iterable[bytes], size: int) -> Iterator[bytes]:
    """One regular file of a tar stream: header, content, padding to the block size."""
    info = tarfile.TarInfo(name)
    info.size, info.mode = size, 0o644
    yield info.tobuf(format=tarfile.PAX_FORMAT)
    sent = 0
    for chunk in chunks:
        sent += len(chunk)
        yield chunk
    if sent != size:
        raise OSError(f"{name}: {sent} bytes sent, {size} announced")
    yield bytes(-size % tarfile.BLOCKSIZE)


def extract_saved(chunks: Iterable[bytes], into: Path) -> None:
    """Unpack a `docker save` stream into `into` (regular files and folders only)."""
    into.mkdir(parents=True, exist_ok=True)
    reader = ChunkReader(chunks)
    with tarfile.open(fileobj=reader, mode="r|") as tar:  # type: ignore[call-overload]
        for m in tar:
            target = _inside(into, m.name)
            if m.isdir():
                target.mkdir(parents=True, exist_ok=True)
            elif m.isreg():
                target.parent.mkdir(parents=True, exist_ok=True)
                fh = tar.extractfile(m)
                assert fh is not None  # for mypy: set above  # noqa: S101
                with target.open("wb") as out:
                    shutil.copyfileobj(fh, out, CHUNK)
            elif m.issym() or m.islnk():  # docker save links a layer that appears twice
                source = _inside(into, m.linkname if m.islnk() else str(Path(m.name).parent / m.linkname))
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)


def _kept_prefix(diff_ids: Sequence[str], keep: Sequence[str]) -> int:
    """How many of the image's first layers are the parent's (`keep`), in order."""
    n = 0
    for mine, theirs in zip(diff_ids, keep, strict=False):
        if mine != theirs:
            break
        n += 1
    return n


def normalise_saved(saved: Path, epoch: int, keep: Sequence[str] = ()) -> _Normalised:
    """Rewrite an extracted `docker save` folder (one image): its layers into
    `saved/out/<diff id>.tar`, the config and manifest in memory (`_Normalised.archive()`
    streams them). Its first layers that are `keep` (the parent's diff ids) stay as they
    are, and out of the archive (the daemon that saved them has them)."""
    manifest = read_document(saved / "manifest.json", _SAVE_MANIFEST, BuildFailed, source="docker save: manifest.json")
    if len(manifest) != 1:
        raise ValueError(f"docker save gave {len(manifest)} images, expected one")
    entry = manifest[0]
    source = f"docker save: {entry['Config']}"
    config = read_document(saved / entry["Config"], _IMAGE_CONFIG, BuildFailed, source=source)
    parts = _CONFIG_PARTS.check(config, source=source, error=BuildFailed)
    kept = _kept_prefix(list(parts.get("rootfs", {}).get("diff_ids") or []), keep)
    out_dir = saved / "out"
    out_dir.mkdir()
    diff_ids: list[str] = list(keep[:kept])
    layer_files: list[Path] = [out_dir / f"{d.split(':')[1]}.tar" for d in diff_ids]  # never written
    for rel in entry["Layers"][:kept]:
        (saved / rel).unlink()
    for i, rel in enumerate(entry["Layers"][kept:], start=kept):
        src_path = saved / rel
        tmp = out_dir / f"layer-{i}.tar"
        with src_path.open("rb") as src, tmp.open("wb") as dst:
            diff = _normalise_layer(src, dst, epoch)
        src_path.unlink()
        final = out_dir / f"{diff.split(':')[1]}.tar"
        if final.exists():
            tmp.unlink()
        else:
            tmp.rename(final)
        diff_ids.append(diff)
        layer_files.append(final)
    cfg = _normalise_config(config, epoch, diff_ids)
    new_id = _image_id(cfg)
    doc = [{"Config": f"{new_id.split(':')[1]}.json", "RepoTags": None, "Layers": [f.name for f in layer_files]}]
    # a new layer with a kept one's bytes is sent all the same: at its own place in the
    # chain the daemon has no layer yet
    return _Normalised(new_id, diff_ids, cfg, list(dict.fromkeys(layer_files[kept:])), json.dumps(doc).encode(), kept)


def _inside(root: Path, name: str) -> Path:
    target = (root / name).resolve()
    if not str(target).startswith(str(root.resolve()) + "/"):
        raise ValueError(f"docker save entry {name!r} points outside its folder")
    return target


class _Hashing:
    """A write-only file that hashes what passes through it."""

    def __init__(self, fh: IO[bytes]) -> None:
        self.fh = fh
        self.hash = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.hash.update(data)
        return self.fh.write(data)

    def tell(self) -> int:
        return self.fh.tell()

    def flush(self) -> None:
        self.fh.flush()


class ChunkReader:
    """A read-only file over an iterator of byte chunks (the docker SDK's save stream)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._it = iter(chunks)
        self._buf = bytearray()
        self._pos = 0

    def read(self, size: int = -1) -> bytes:
        """Up to `size` bytes of the stream (all that is left when negative)."""
        while size < 0 or len(self._buf) - self._pos < size:
            try:
                chunk = next(self._it)
            except StopIteration:
                break
            if self._pos:  # drop what was read before growing the buffer
                del self._buf[: self._pos]
                self._pos = 0
            self._buf += chunk
        end = len(self._buf) if size < 0 else min(len(self._buf), self._pos + size)
        out = bytes(self._buf[self._pos : end])
        self._pos = end
        return out
