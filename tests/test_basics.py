"""The shared pieces of kiln.basics: image references, the clock, atomic writes."""

from __future__ import annotations

import os
import re
import stat

import pytest

from kiln.basics import clock, image_ref
from kiln.basics.files import sha256_file, write_atomic


@pytest.mark.parametrize(
    "ref,name,tag,digest,host,path",
    [
        ("kiln/base:bookworm", "kiln/base", "bookworm", None, None, "kiln/base"),
        ("localhost:5000/kiln/x", "localhost:5000/kiln/x", None, None, "localhost:5000", "kiln/x"),
        ("localhost:5000/kiln/x:stable", "localhost:5000/kiln/x", "stable", None, "localhost:5000", "kiln/x"),
        (
            "nvcr.io/nvidia/cuda:12.8.1-runtime@sha256:" + "a" * 64,
            "nvcr.io/nvidia/cuda",
            "12.8.1-runtime",
            "sha256:" + "a" * 64,
            "nvcr.io",
            "nvidia/cuda",
        ),
        ("debian@sha256:" + "b" * 64, "debian", None, "sha256:" + "b" * 64, None, "debian"),
        ("[::1]:5000/x:1", "[::1]:5000/x", "1", None, "[::1]:5000", "x"),
        ("library/debian", "library/debian", None, None, None, "library/debian"),  # no dot, no port: a path
    ],
)
def test_a_reference_splits_as_docker_reads_it(ref, name, tag, digest, host, path):
    parts = image_ref.parse(ref)
    assert (parts.name, parts.tag, parts.digest, parts.host, parts.path) == (name, tag, digest, host, path)
    assert str(parts) == ref


def test_pinning_drops_the_tag_and_keeps_the_registry_port():
    assert (
        image_ref.parse("localhost:5000/kiln/base:bookworm").pinned("sha256:" + "c" * 64)
        == "localhost:5000/kiln/base@sha256:" + "c" * 64
    )


def test_timestamps_are_utc_with_a_z():
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", clock.timestamp())
    assert re.fullmatch(r"\d{8}T\d{6}\.\d{6}Z", clock.file_stamp())
    assert clock.now().utcoffset().total_seconds() == 0


def test_an_atomic_write_replaces_the_file_whole_and_leaves_nothing_else(tmp_path):
    target = tmp_path / "record.json"
    target.write_text("old")
    write_atomic(target, "new\n")
    assert target.read_text() == "new\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    write_atomic(target, b"\x00bytes")
    assert target.read_bytes() == b"\x00bytes"
    assert os.listdir(tmp_path) == ["record.json"]


def test_a_failed_atomic_write_keeps_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "lock.json"
    target.write_text("old")
    with pytest.raises(TypeError):
        write_atomic(target, 42)  # neither str nor bytes: fails after the temporary file exists
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["lock.json"]
    with pytest.raises(FileNotFoundError):
        write_atomic(tmp_path / "missing" / "x.json", "{}")  # the caller makes the folder
    assert not (tmp_path / "missing").exists()


def test_sha256_of_a_file(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"abc")
    assert sha256_file(f) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
