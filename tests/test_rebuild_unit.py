"""`kiln rebuild --verify`'s reading of labels and the base lock's check, without Docker."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from kiln.basics.errors import BaseLockMismatch, RebuildSourceMissing
from kiln.domain.locks import base_lock
from kiln.domain.reproducible import image_diff
from kiln.usecases import rebuild


def _img(**labels):
    return SimpleNamespace(labels=labels)


def test_labels_name_the_recipe_and_the_commit():
    img = _img(**{"ai.kiln.recipe": "tiny-moe", "org.opencontainers.image.revision": "ab" * 20})
    assert rebuild._what_to_rebuild(img, "x") == ("tiny-moe", "ab" * 20)


@pytest.mark.parametrize(
    "labels, why",
    [
        ({"org.opencontainers.image.revision": "ab" * 20}, "ai.kiln.recipe"),
        ({"ai.kiln.recipe": "r", "org.opencontainers.image.revision": "unknown"}, "outside a git checkout"),
        ({"ai.kiln.recipe": "r", "org.opencontainers.image.revision": "ab" * 20 + "-dirty"}, "uncommitted"),
    ],
)
def test_images_that_cannot_be_rebuilt_say_why(labels, why):
    with pytest.raises(RebuildSourceMissing) as exc:
        rebuild._what_to_rebuild(_img(**labels), "ref")
    assert why in exc.value.message and "\n" not in exc.value.message


def test_first_file_difference_names_path_and_fact():
    a = {"opt": ("5", 0o755, 0, 0, 0, "", 0, ""), "opt/p.txt": ("0", 0o644, 0, 0, 3, "", 0, "aa")}
    b = {**a, "opt/p.txt": ("0", 0o644, 0, 0, 3, "", 0, "bb")}
    assert image_diff._first_file_difference(a, b) == ("opt/p.txt", "content (sha256) differs: aa vs bb")
    assert image_diff._first_file_difference(a, a) is None
    assert image_diff._first_file_difference(a, {"opt": a["opt"]}) == ("opt/p.txt", "only in the first image")


def test_base_lock_mismatch_is_one_line_naming_the_package(tmp_path):
    spec = base_lock.BaseSpec("bookworm", "minbase", "http://m", "http://s", (), (), "kiln/base:bookworm")
    lock = tmp_path / "bookworm.lock.json"
    lock.write_text(base_lock.lock_document(spec, {"libc6:amd64": "2.36-9+deb12u9", "zlib1g:amd64": "1:1.2.13"}))
    base_lock.check_lock(spec, json.loads(lock.read_text())["packages"], lock)  # the same set: fine
    with pytest.raises(BaseLockMismatch) as exc:
        base_lock.check_lock(
            spec, {"libc6:amd64": "2.36-9+deb12u10", "zlib1g:amd64": "1:1.2.13", "new:amd64": "1"}, lock
        )
    msg = exc.value.message
    assert "libc6:amd64 2.36-9+deb12u9 -> 2.36-9+deb12u10" in msg and "(and 1 more)" in msg and "\n" not in msg
    assert "--relock" in exc.value.hint
