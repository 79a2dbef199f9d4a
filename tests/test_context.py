"""Build contexts are deterministic and their input digest covers every input."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile

import pytest

from kiln.domain.images.build_context import BuildContext


def make_files(root):
    (root / "a").mkdir(parents=True)
    (root / "a" / "one.txt").write_text("one\n")
    (root / "a" / "two.sh").write_text("#!/bin/sh\necho two\n")
    os.chmod(root / "a" / "two.sh", 0o755)
    (root / "Dockerfile").write_text("FROM scratch\n")
    (root / "a" / "__pycache__").mkdir()
    (root / "a" / "__pycache__" / "x.pyc").write_bytes(b"junk")
    return root


def ctx_for(root, **params) -> BuildContext:
    ctx = BuildContext()
    ctx.add_tree("", root)
    for k, v in params.items():
        ctx.add_param(k, v)
    return ctx


def test_same_inputs_same_digest_and_tar(tmp_path):
    r1 = make_files(tmp_path / "r1")
    r2 = make_files(tmp_path / "r2")
    c1, c2 = ctx_for(r1, engine="vllm==0.32.0"), ctx_for(r2, engine="vllm==0.32.0")
    assert c1.digest() == c2.digest()
    assert hashlib.sha256(c1.tar_bytes()).digest() == hashlib.sha256(c2.tar_bytes()).digest()


def test_mtimes_and_owners_do_not_matter(tmp_path):
    root = make_files(tmp_path / "r")
    before = ctx_for(root)
    d0, t0 = before.digest(), before.tar_bytes()
    os.utime(root / "a" / "one.txt", (1, 1))
    after = ctx_for(root)
    assert after.digest() == d0
    assert after.tar_bytes() == t0


def test_every_single_byte_change_changes_the_digest(tmp_path):
    root = make_files(tmp_path / "r")
    base = ctx_for(root).digest()
    for rel in ("a/one.txt", "a/two.sh", "Dockerfile"):
        path = root / rel
        original = path.read_bytes()
        for i in range(len(original)):
            changed = bytearray(original)
            changed[i] ^= 0x01
            path.write_bytes(bytes(changed))
            assert ctx_for(root).digest() != base, (rel, i)
        path.write_bytes(original)
    assert ctx_for(root).digest() == base


def test_renames_modes_params_and_new_files_change_the_digest(tmp_path):
    root = make_files(tmp_path / "r")
    base = ctx_for(root, engine="vllm==0.32.0").digest()
    assert ctx_for(root, engine="vllm==0.33.0").digest() != base
    assert ctx_for(root, engine="vllm==0.32.0", base_image="x@sha256:" + "0" * 64).digest() != base
    os.chmod(root / "a" / "one.txt", 0o755)
    assert ctx_for(root, engine="vllm==0.32.0").digest() != base
    os.chmod(root / "a" / "one.txt", 0o644)
    (root / "a" / "one.txt").rename(root / "a" / "uno.txt")
    assert ctx_for(root, engine="vllm==0.32.0").digest() != base
    (root / "a" / "uno.txt").rename(root / "a" / "one.txt")
    (root / "new").write_text("")
    assert ctx_for(root, engine="vllm==0.32.0").digest() != base


def test_secret_entries_travel_but_are_not_digested(tmp_path):
    root = make_files(tmp_path / "r")
    plain = ctx_for(root)
    with_ca = ctx_for(root)
    with_ca.add_bytes("_kiln/ca.crt", b"-----BEGIN CERTIFICATE-----\nX\n", in_digest=False)
    assert plain.digest() == with_ca.digest()
    names = tarfile.open(fileobj=io.BytesIO(with_ca.tar_bytes())).getnames()
    assert "_kiln/ca.crt" in names


def test_tar_is_sorted_with_fixed_metadata(tmp_path):
    ctx = ctx_for(make_files(tmp_path / "r"))
    tar = tarfile.open(fileobj=io.BytesIO(ctx.tar_bytes()))
    members = tar.getmembers()
    files = [m.name for m in members if m.isfile()]
    assert files == sorted(files) == ["Dockerfile", "a/one.txt", "a/two.sh"]  # caches skipped
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, 0, "", "")}
    modes = {m.name: m.mode for m in members if m.isfile()}
    assert modes == {"Dockerfile": 0o644, "a/one.txt": 0o644, "a/two.sh": 0o755}


def test_duplicate_entries_are_refused(tmp_path):
    ctx = BuildContext()
    ctx.add_bytes("x", b"1")
    with pytest.raises(ValueError):
        ctx.add_bytes("x", b"2")
