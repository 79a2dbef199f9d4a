"""Launch args checked against the real CPU engine image's vLLM parser: a good recipe
passes, a bad flag fails naming its recipe line, and a failing build leaves no tag."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from kilntest import REPO, remove_images, run_kiln

from kiln.commands import build
from kiln.domain import argcheck

pytestmark = pytest.mark.docker

TEST_RECIPE = "kiln-test-argcheck"


@pytest.fixture(scope="module")
def cpu_engine_id(docker_daemon, base_image) -> str:
    """The engine image tiny-moe builds on (built here if missing: minutes, once)."""
    from kiln.basics.paths import recipes_dir
    from kiln.domain.recipe import load_recipe

    loaded = load_recipe(recipes_dir() / "tiny-moe")
    return build.engine_image_id(docker_daemon, loaded, build_if_missing=True)


@pytest.fixture(scope="module")
def accepted(docker_daemon, cpu_engine_id) -> argcheck.EngineArgs:
    return argcheck.engine_args(docker_daemon, cpu_engine_id)


def _recipe(tmp_path: Path, extra_args: str = "", spec_extra: str = "") -> Path:
    """A copy of tiny-moe named kiln-test-argcheck, with lines added under launch.args."""
    src = REPO / "recipes" / "tiny-moe"
    dest = tmp_path / "recipes" / TEST_RECIPE
    shutil.copytree(src, dest)
    shutil.copytree(REPO / "recipes" / "_shared", dest.parent / "_shared", dirs_exist_ok=True)  # its build.shared
    text = (dest / "recipe.yaml").read_text().replace("name: tiny-moe", f"name: {TEST_RECIPE}", 1)
    text = text.replace("    dtype: bfloat16\n", "    dtype: bfloat16\n" + extra_args, 1)
    text = text.replace("    num_speculative_tokens: 3\n", "    num_speculative_tokens: 3\n" + spec_extra, 1)
    (dest / "recipe.yaml").write_text(text)
    return dest


def _load(path: Path):
    from kiln.domain.recipe import load_recipe

    return load_recipe(path)


def test_engine_parser_is_read_from_the_image_and_cached(accepted, cpu_engine_id):
    assert accepted.version.startswith("0.32.0")
    for flag in ("max-model-len", "enforce-eager", "speculative-config", "tensor-parallel-size"):
        assert flag in accepted.flags, flag
    assert "num_speculative_tokens" in accepted.speculative_keys
    assert "draft_model" in accepted.speculative_methods
    assert argcheck._cache_file(cpu_engine_id).is_file()


def test_good_recipe_passes(accepted):
    from kiln.basics.paths import recipes_dir

    assert argcheck.problems(_load(recipes_dir() / "tiny-moe"), accepted) == []


def test_unknown_flag_names_the_recipe_line(tmp_path, accepted):
    loaded = _load(_recipe(tmp_path, "    max-model-lenght: 512\n"))
    line = loaded.line_of("launch", "args", "max-model-lenght")
    found = argcheck.problems(loaded, accepted)
    assert len(found) == 1, found
    assert found[0].endswith(f"recipe.yaml:{line}: launch.args.max-model-lenght: "
                             f"vLLM {accepted.version} does not accept --max-model-lenght")


def test_value_and_switch_mistakes_are_caught(tmp_path, accepted):
    loaded = _load(_recipe(tmp_path, "    max-num-batched-tokens: true\n    use-tqdm-on-load: false\n"))
    found = "\n".join(argcheck.problems(loaded, accepted))
    assert "launch.args.max-num-batched-tokens: --max-num-batched-tokens takes a value" in found
    assert "launch.args.use-tqdm-on-load: false has no effect" in found


def test_unknown_speculative_key_is_caught(tmp_path, accepted):
    loaded = _load(_recipe(tmp_path, spec_extra="    num_speculative_tokenz: 2\n"))
    found = argcheck.problems(loaded, accepted)
    assert len(found) == 1 and "launch.speculative_config.num_speculative_tokenz" in found[0], found


def test_kiln_check_reports_bad_flag_when_engine_exists(tmp_path, accepted):
    """`kiln check` runs the same check (the engine image exists: it is tiny-moe's)."""
    tree = _tree(tmp_path, "    no-such-vllm-flag: 1\n")
    result = run_kiln("check", TEST_RECIPE, env={"KILN_ROOT": str(tree)}, cwd=tree)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "launch.args.no-such-vllm-flag: vLLM" in result.stderr


def _tree(tmp_path: Path, extra_args: str) -> Path:
    """A kiln tree whose engine inputs equal the real engine-cpu's (same input digest,
    so the existing engine image is used) plus the test recipe."""
    tree = tmp_path / "tree"
    for rel in ("docker-images/engine-cpu", "docker-images/common", "engine", "patches"):
        shutil.copytree(REPO / rel, tree / rel, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    _recipe(tree.parent / "tree-recipes", extra_args)
    shutil.copytree(tree.parent / "tree-recipes" / "recipes", tree / "recipes")
    return tree


def test_build_with_bad_flag_fails_with_17_and_leaves_no_tag(tmp_path, accepted, docker_daemon):
    tree = _tree(tmp_path, "    no-such-vllm-flag: 1\n")
    remove_images(docker_daemon, f"kiln/{TEST_RECIPE}")
    result = run_kiln("build", TEST_RECIPE, env={"KILN_ROOT": str(tree)}, cwd=tree)
    try:
        assert result.returncode == 17, result.stderr[-3000:]
        assert "recipe.yaml:" in result.stderr and "launch.args.no-such-vllm-flag" in result.stderr
        assert docker_daemon.client.images.list(name=f"kiln/{TEST_RECIPE}") == []
    finally:
        remove_images(docker_daemon, f"kiln/{TEST_RECIPE}")
