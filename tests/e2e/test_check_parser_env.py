"""`kiln check` of a CUDA recipe on a machine with no GPU and no engine-cuda image (CI):
its launch command is checked by the pinned vLLM's and kiln-engine's own code in the
pin's parser environment (domain/imagecheck/parser_env.py), built once, with exit 17 and
the recipe's line for what they refuse, and answered from the cache the second time."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from kilntest import REPO, run_kiln

pytestmark = [pytest.mark.e2e, pytest.mark.docker, pytest.mark.xdist_group("argcheck-cuda")]

GLM = "glm53-kindling"


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A checkout whose recipes/ is a copy (to edit); the rest is the real one."""
    root = tmp_path_factory.mktemp("checkout")
    shutil.copytree(REPO / "recipes", root / "recipes", ignore=shutil.ignore_patterns("__pycache__"))
    for shared in ("docker-images", "engine", "benchmarks", "patches"):
        (root / shared).symlink_to(REPO / shared)
    return root


@pytest.fixture(scope="module")
def env(checkout, tmp_path_factory) -> dict[str, str]:
    """The copy, and a cache of its own: the probe's answers start empty. The wheels
    come from the locked-wheel cache's own folder when the machine's cache has them."""
    cache = tmp_path_factory.mktemp("cache")
    machine = Path.home() / ".cache" / "kiln" / "wheels" / "locked"
    if machine.is_dir():
        (cache / "wheels").mkdir()
        (cache / "wheels" / "locked").symlink_to(machine)
    return {"KILN_ROOT": str(checkout), "KILN_CACHE_DIR": str(cache)}


def _check(env: dict[str, str], *args: str):
    return run_kiln("check", GLM, *args, env=env, cwd=Path(env["KILN_ROOT"]))


def test_the_flagship_is_checked_by_the_parser_environment_then_from_the_cache(env, docker_daemon):
    first = _check(env, "--json")
    assert first.returncode == 0, first.stderr
    [entry] = json.loads(first.stdout)["recipes"]
    checked_by = entry["launch_checked_by"]
    assert checked_by.startswith("parser environment kiln/argcheck-cuda:"), checked_by  # no engine-cuda here
    assert f"{GLM}: launch args checked by the {checked_by} (vLLM 0.34.0)" in first.stderr
    t0 = time.monotonic()
    again = _check(env)
    took = time.monotonic() - t0
    assert again.returncode == 0, again.stderr
    assert "checking the launch command" not in again.stderr  # no container: the answer cache
    assert took < 15, f"a cached check took {took:.1f} s"


def test_what_vllm_and_kiln_engine_refuse_is_exit_17_at_the_recipe_line(env, checkout, docker_daemon):
    recipe = checkout / "recipes" / GLM / "recipe.yaml"
    text = recipe.read_text()
    text = text.replace(
        "    gpu-memory-utilization: 0.90\n", "    gpu-memory-utilization: 0.90\n    max-num-seqs: 0\n", 1
    )
    text = text.replace(
        '    KILN_DRAFT_TRUNC_DEPTH: "0"\n', '    KILN_DRAFT_TRUNC_DEPTH: "0"\n    KILN_DRAFT_TRUNC_TAU: "2"\n', 1
    )
    recipe.write_text(text)
    lines = text.splitlines()
    seqs = lines.index("    max-num-seqs: 0") + 1
    tau = lines.index('    KILN_DRAFT_TRUNC_TAU: "2"') + 1
    cli = _check(env)
    assert cli.returncode == 17, cli.stderr  # LaunchArgInvalid, as from the engine image
    errors = [ln for ln in cli.stderr.splitlines() if ln.startswith("kiln: error: ")]
    assert len(errors) == 2, cli.stderr
    assert errors[0].endswith(
        f"recipes/{GLM}/recipe.yaml:{seqs}: launch.args.max-num-seqs: vLLM 0.34.0 refuses --max-num-seqs 0: "
        "SchedulerConfig.max_num_seqs: Input should be greater than or equal to 1"
    )
    assert f"recipes/{GLM}/recipe.yaml:{tau}: launch.env.KILN_DRAFT_TRUNC_TAU: kiln-engine " in errors[1]
    assert "refuses it: draft-trunc: KILN_DRAFT_TRUNC_TAU='2': must lie in [0, 1]" in errors[1]
