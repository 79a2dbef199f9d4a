"""domain/locks/base_lock.py: the base lock's one path, and the Debian release a base names."""

import pytest

from kiln.domain.locks import base_lock


@pytest.mark.parametrize(
    ("ref", "distro"),
    [
        ("kiln/base:bookworm", "debian-12"),
        ("kiln/base:bookworm-arm64", "debian-12"),
        ("debian:trixie-slim@sha256:" + "a" * 64, "debian-13"),
        ("ubuntu:24.04", None),
        ("kiln/base", None),
        ("bookworm/base:latest", None),  # the suite is read from the tag, not found anywhere in the name
    ],
)
def test_debian_distro(ref, distro):
    assert base_lock.debian_distro(ref) == distro


def test_one_lock_path_for_spec_and_tag():
    spec = base_lock.BaseSpec.load()
    assert base_lock.lock_path(spec) == base_lock.lock_path_for_tag(spec.suite)
    assert base_lock.lock_path(spec, "-arm64").name == f"{spec.suite}-arm64.lock.json"
    assert base_lock.lock_path(spec).is_file()  # committed: the provenance cites it
