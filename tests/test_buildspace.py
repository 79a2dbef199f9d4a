"""domain/images/disk_space.py: what an engine build is counted at, and the one line a
build that would not fit stops with (the real daemon's side: tests/test_build_docker.py)."""

from __future__ import annotations

import pytest

from kiln.basics.errors import DiskSpaceShort, UsageError
from kiln.domain.images.disk_space import _GB, EngineBuild, _needed_gb, require_space

CUDA_AMD, CUDA_ARM = EngineBuild("cuda", "linux/amd64"), EngineBuild("cuda", "linux/arm64")


def test_an_engine_build_is_counted_at_its_measured_peak_once_per_platform():
    assert _needed_gb([CUDA_AMD]) == pytest.approx(42.0)
    assert _needed_gb([CUDA_AMD, CUDA_ARM]) == pytest.approx(84.0)
    assert _needed_gb([EngineBuild("cpu", "linux/amd64")]) == pytest.approx(13.2)
    assert _needed_gb([]) == 0


def test_two_cuda_platforms_on_64_gb_stop_in_one_line_naming_both(monkeypatch):
    monkeypatch.delenv("KILN_DISK_RESERVE_GB", raising=False)
    with pytest.raises(DiskSpaceShort) as caught:
        require_space("glm53-kindling", [CUDA_AMD, CUDA_ARM], 64 * _GB, "/var/lib/docker")
    message = caught.value.message
    assert "\n" not in message and caught.value.exit_code == 35
    assert message == (
        "build glm53-kindling: 2 engine builds (engine-cuda linux/amd64, engine-cuda linux/arm64) "
        "need about 84.0 GB, and /var/lib/docker has 64.0 GB free (engine-cuda and its recipe: 42 GB "
        "at the peak, measured (builder stage 16.4 GB, image 7.83 GB and the copies normalisation "
        "makes)); nothing was built"
    )
    require_space("glm53-kindling", [CUDA_AMD], 64 * _GB, "/var/lib/docker")  # one platform fits


def test_the_reserve_counts_and_a_bad_one_names_the_variable(monkeypatch):
    monkeypatch.setenv("KILN_DISK_RESERVE_GB", "6")
    with pytest.raises(DiskSpaceShort, match=r"need about 42\.0 GB \+ 6\.0 GB kept free \(KILN_DISK_RESERVE_GB\)"):
        require_space("r", [CUDA_AMD], 47 * _GB, "/d")
    monkeypatch.setenv("KILN_DISK_RESERVE_GB", "4")
    require_space("r", [CUDA_AMD], 47 * _GB, "/d")
    for bad in ("lots", "-1", "nan", "inf", "1e400"):
        monkeypatch.setenv("KILN_DISK_RESERVE_GB", bad)
        with pytest.raises(UsageError, match=f"KILN_DISK_RESERVE_GB='{bad}': not a number of gigabytes"):
            require_space("r", [CUDA_AMD], 37 * _GB, "/d")


def test_nothing_to_build_needs_no_space():
    require_space("r", [], 0, "/d")
