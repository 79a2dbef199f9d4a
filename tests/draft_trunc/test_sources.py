"""Exactness runs against every engine version draft-trunc ships a series for; a
version whose sources cannot be had fails loudly (never a silent skip), unless it is
left out on purpose."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from dt_patched import SERIES_ROOT, VLLM_VERSIONS

REPO = Path(__file__).resolve().parents[2]


def test_every_shipped_series_version_is_tested():
    shipped = sorted(p.name for p in SERIES_ROOT.iterdir() if (p / "series").is_file())
    assert shipped == sorted(VLLM_VERSIONS)


def _pytest(tmp_path, **env) -> subprocess.CompletedProcess:
    """The mask-off control test, with an empty kiln cache and no package index."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("KILN_VLLM_SRC")}
    full.update(KILN_CACHE_DIR=str(tmp_path / "cache"), PIP_NO_INDEX="1", PIP_FIND_LINKS="", **env)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rs",
            "tests/draft_trunc/test_exactness.py::test_marking_without_mask_is_wrong",
        ],
        cwd=REPO,
        env=full,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


# the download path itself: runs `pip download` (with no index, but the unit tier
# refuses any pip download) inside a pytest of a network-marked test
@pytest.mark.network
@pytest.mark.kernels
def test_missing_sources_fail_naming_the_version_and_the_opt_out(tmp_path):
    proc = _pytest(tmp_path, KILN_DT_VLLM_VERSIONS="0.33.0")
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "vLLM 0.33.0 sources (vllm wheel) are unavailable: pip download vllm==0.33.0 failed" in proc.stdout
    assert "KILN_VLLM_SRC_0_33_0" in proc.stdout and "skipped" not in proc.stdout
    proc = _pytest(tmp_path, KILN_DT_VLLM_VERSIONS="0.32.0,0.33.0")
    assert "leave this version out on purpose with KILN_DT_VLLM_VERSIONS=0.33.0" in proc.stdout


def test_an_unknown_version_is_a_usage_error(tmp_path):
    proc = _pytest(tmp_path, KILN_DT_VLLM_VERSIONS="0.31.0")
    assert proc.returncode == 4 and "no draft-trunc series for ['0.31.0']" in proc.stdout + proc.stderr
