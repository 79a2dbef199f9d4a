"""Launch args checked against the real CPU engine image's vLLM parser: a good recipe
passes, a bad flag or value (or a bad feature knob in the launch env) fails with one line
naming its recipe line, the flag, the value and the engine's own complaint, and a
failing build leaves no tag."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from kiln_testkit.engine_images import engine_image_id
from kilntest import REPO, remove_images, run_kiln

from kiln.basics.documents import Shape
from kiln.basics.errors import BuildFailed
from kiln.domain.imagecheck import launch_arg_check
from kiln.domain.recipes.resolved import ResolvedRecipe

# beside the serial daemon group (tests/kilntest.py assign_xdist_groups): this module's images are its own
# recipe's (kiln-test-argcheck) and the real engine-cpu, which no integration test removes
pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("argcheck")]

TEST_RECIPE = "kiln-test-argcheck"


@pytest.fixture(scope="module")
def cpu_engine_id(docker_daemon, base_image) -> str:
    """The engine image tiny-moe builds on (built here if missing: minutes, once)."""
    from kiln.basics.paths import recipes_dir
    from kiln.domain.recipes.recipe import load_recipe

    loaded = load_recipe(recipes_dir() / "tiny-moe")
    return engine_image_id(docker_daemon, ResolvedRecipe(loaded), build_if_missing=True)


@pytest.fixture(scope="module")
def accepted(docker_daemon, cpu_engine_id) -> launch_arg_check._EngineArgs:
    return launch_arg_check.engine_args(docker_daemon, cpu_engine_id)


def _recipe(
    tmp_path: Path,
    extra_args: str = "",
    spec_extra: str = "",
    *,
    env_extra: str = "",
    replace: dict[str, str] | None = None,
) -> Path:
    """A copy of tiny-moe named kiln-test-argcheck, with lines added under launch.args,
    launch.speculative_config and launch.env, and lines of it replaced."""
    src = REPO / "recipes" / "tiny-moe"
    dest = tmp_path / "recipes" / TEST_RECIPE
    shutil.copytree(src, dest)
    shutil.copytree(REPO / "recipes" / "_shared", dest.parent / "_shared", dirs_exist_ok=True)  # its build.shared
    text = (dest / "recipe.yaml").read_text().replace("name: tiny-moe", f"name: {TEST_RECIPE}", 1)
    text = text.replace("    dtype: bfloat16\n", "    dtype: bfloat16\n" + extra_args, 1)
    text = text.replace("    num_speculative_tokens: 3\n", "    num_speculative_tokens: 3\n" + spec_extra, 1)
    text = text.replace('    VLLM_CPU_KVCACHE_SPACE: "1"\n', '    VLLM_CPU_KVCACHE_SPACE: "1"\n' + env_extra, 1)
    for old, new in (replace or {}).items():
        assert old in text, old
        text = text.replace(old, new, 1)
    (dest / "recipe.yaml").write_text(text)
    return dest


def _load(path: Path):
    from kiln.domain.recipes.recipe import load_recipe

    return load_recipe(path)


def test_engine_parser_is_read_from_the_image_and_cached(accepted, cpu_engine_id):
    assert accepted.version.startswith("0.32.0")
    for flag in ("max-model-len", "enforce-eager", "speculative-config", "tensor-parallel-size"):
        assert flag in accepted.flags, flag
    assert "num_speculative_tokens" in accepted.speculative_keys
    assert "draft_model" in accepted.speculative_methods
    assert launch_arg_check._cache_file(cpu_engine_id).is_file()


def test_good_recipe_passes(accepted):
    from kiln.basics.paths import recipes_dir

    assert launch_arg_check.problems(_load(recipes_dir() / "tiny-moe"), accepted) == []


def test_unknown_flag_names_the_recipe_line(tmp_path, accepted):
    loaded = _load(_recipe(tmp_path, "    max-model-lenght: 512\n"))
    line = loaded.line_of("launch", "args", "max-model-lenght")
    found = launch_arg_check.problems(loaded, accepted)
    assert len(found) == 1, found
    assert found[0].endswith(
        f"recipe.yaml:{line}: launch.args.max-model-lenght: vLLM {accepted.version} does not accept --max-model-lenght"
    )


def test_value_and_switch_mistakes_are_caught(tmp_path, accepted):
    loaded = _load(_recipe(tmp_path, "    max-num-batched-tokens: true\n    use-tqdm-on-load: false\n"))
    found = "\n".join(launch_arg_check.problems(loaded, accepted))
    assert "launch.args.max-num-batched-tokens: --max-num-batched-tokens takes a value" in found
    assert "launch.args.use-tqdm-on-load: false has no effect" in found


def test_unknown_speculative_key_is_caught(tmp_path, accepted):
    loaded = _load(_recipe(tmp_path, spec_extra="    num_speculative_tokenz: 2\n"))
    found = launch_arg_check.problems(loaded, accepted)
    assert len(found) == 1 and "launch.speculative_config.num_speculative_tokenz" in found[0], found


def test_kiln_check_reports_bad_flag_when_engine_exists(tmp_path, accepted):
    """`kiln check` runs the same check (the engine image exists: it is tiny-moe's)."""
    tree = _tree(tmp_path, "    no-such-vllm-flag: 1\n")
    result = run_kiln("check", TEST_RECIPE, env={"KILN_ROOT": str(tree)}, cwd=tree)
    assert result.returncode == 17, result.stderr[-2000:]
    assert "launch.args.no-such-vllm-flag: vLLM" in result.stderr
    # the name is wrong: said once, not again as argparse's "unrecognized arguments"
    assert "unrecognized" not in result.stderr, result.stderr


def _tree(tmp_path: Path, extra_args: str = "", **edits) -> Path:
    """A kiln tree whose engine inputs equal the real engine-cpu's, plus the test recipe.
    A clone of this checkout's HEAD (objects shared: about a second), so the engine's
    source date and revision are the real one's too and `kiln build` reuses the existing
    engine image: a plain copy has no git history, hence date 0, hence another engine
    image, built for minutes (393 s in one run) only to be refused."""
    tree = tmp_path / "tree"
    cloned = subprocess.run(
        ["git", "clone", "-q", "--shared", str(REPO), str(tree)], capture_output=True, text=True, check=False
    )
    if cloned.returncode != 0:  # not a checkout (a source tarball): the copy still has the same input digest
        for rel in ("docker-images/engine-cpu", "docker-images/common", "engine", "patches"):
            shutil.copytree(REPO / rel, tree / rel, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    _recipe(tree.parent / "tree-recipes", extra_args, **edits)
    shutil.copytree(tree.parent / "tree-recipes" / "recipes", tree / "recipes", dirs_exist_ok=True)
    return tree


def _check_fails_with_one_line(tmp_path: Path, loc: tuple, field: str, message: str, **edits) -> None:
    """`kiln check` of the edited recipe exits 17 with exactly one error line: the
    recipe line of `loc`, the field, then `message` (the flag, its value, the engine's
    complaint). A fresh cache: the engine image really answers."""
    tree = _tree(tmp_path, **edits)
    line = _load(tree / "recipes" / TEST_RECIPE).line_of(*loc)
    result = run_kiln(
        "check", TEST_RECIPE, cwd=tree, env={"KILN_ROOT": str(tree), "KILN_CACHE_DIR": str(tmp_path / "cache")}
    )
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("kiln: error:")]
    assert result.returncode == 17, result.stderr[-3000:]
    assert errors == [f"kiln: error: recipes/{TEST_RECIPE}/recipe.yaml:{line}: {field}: {message}"], result.stderr


def test_check_refuses_a_shell_command_in_a_value(tmp_path, accepted):
    _check_fails_with_one_line(
        tmp_path,
        ("launch", "args", "max-model-len"),
        "launch.args.max-model-len",
        "vLLM 0.32.0 refuses --max-model-len '512; touch /tmp/pwned': argument --max-model-len: "
        "invalid human_readable_int_or_auto value: '512; touch /tmp/pwned'",
        replace={"    max-model-len: 512\n": '    max-model-len: "512; touch /tmp/pwned"\n'},
    )


def test_check_refuses_an_infinite_count(tmp_path, accepted):
    _check_fails_with_one_line(
        tmp_path,
        ("launch", "args", "max-num-seqs"),
        "launch.args.max-num-seqs",
        "vLLM 0.32.0 refuses --max-num-seqs inf: argument --max-num-seqs: invalid int value: 'inf'",
        replace={"    max-num-seqs: 8\n": "    max-num-seqs: .inf\n"},
    )


def test_check_refuses_a_value_the_config_class_refuses(tmp_path, accepted):
    """argparse takes 0 (an int); vLLM's SchedulerConfig does not (max_num_seqs >= 1)."""
    _check_fails_with_one_line(
        tmp_path,
        ("launch", "args", "max-num-seqs"),
        "launch.args.max-num-seqs",
        "vLLM 0.32.0 refuses --max-num-seqs 0: SchedulerConfig.max_num_seqs: "
        "Input should be greater than or equal to 1",
        replace={"    max-num-seqs: 8\n": "    max-num-seqs: 0\n"},
    )


def test_check_refuses_a_speculative_value(tmp_path, accepted):
    _check_fails_with_one_line(
        tmp_path,
        ("launch", "speculative_config", "num_speculative_tokens"),
        "launch.speculative_config.num_speculative_tokens",
        "vLLM 0.32.0 refuses num_speculative_tokens=0 in --speculative-config: "
        "SpeculativeConfig.num_speculative_tokens: Input should be greater than 0",
        replace={"    num_speculative_tokens: 3\n": "    num_speculative_tokens: 0\n"},
    )


def test_check_refuses_a_bad_dynamic_schedule(tmp_path, accepted):
    """vLLM's own schedule check (what its scheduler runs at start) refuses a batch-size
    range that does not start at a batch size of 1 or more."""
    _check_fails_with_one_line(
        tmp_path,
        ("launch", "speculative_config", "num_speculative_tokens_per_batch_size"),
        "launch.speculative_config.num_speculative_tokens_per_batch_size",
        "vLLM 0.32.0 refuses 'num_speculative_tokens_per_batch_size=[[0, 4, 3]]' in --speculative-config: "
        "dynamic speculation schedule: Batch-size range (0, 4) must be positive.",
        spec_extra="    num_speculative_tokens_per_batch_size: [[0, 4, 3]]\n",
    )


def test_check_refuses_a_speculative_number_the_whole_config_check_refuses(tmp_path, accepted):
    """SpeculativeConfig's own after-validator holds the synthetic acceptance length to
    [1, num_speculative_tokens + 1]; no field validator does."""
    _check_fails_with_one_line(
        tmp_path,
        ("launch", "speculative_config", "synthetic_acceptance_length"),
        "launch.speculative_config.synthetic_acceptance_length",
        "vLLM 0.32.0 refuses synthetic_acceptance_length=9 in --speculative-config: "
        "SpeculativeConfig: synthetic_acceptance_length must be in [1, 4], got 9.0.",
        spec_extra="    rejection_sample_method: synthetic\n    synthetic_acceptance_length: 9\n",
    )


def test_a_valid_dynamic_schedule_passes_the_engine(tmp_path, accepted):
    """vLLM's form of num_speculative_tokens_per_batch_size, [[first, last, drafts], ...],
    passes kiln's bounds and the engine's own checks."""
    tree = _tree(
        tmp_path, spec_extra="    num_speculative_tokens_per_batch_size: [[1, 4, 3], [5, 8, 2], [9, 256, 0]]\n"
    )
    result = run_kiln(
        "check", TEST_RECIPE, cwd=tree, env={"KILN_ROOT": str(tree), "KILN_CACHE_DIR": str(tmp_path / "cache")}
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert list((tmp_path / "cache" / "argcheck" / "argv").glob("*.json")), "the engine image was not asked"


def test_the_engine_leaves_the_draft_count_open_so_kiln_bounds_it(tmp_path, docker_daemon, cpu_engine_id, monkeypatch):
    """vLLM 0.32.0's SpeculativeConfig takes num_speculative_tokens: 100000 (it is only
    `gt=0` without a model), which is why kiln's own bound (draft_bounds.py) exists: `kiln
    check` refuses it at its line with exit 2, before any engine is asked. Should a vLLM
    refuse it itself, this test fails: the engine's refusal could then replace kiln's."""
    import dataclasses
    import json

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    job = launch_arg_check.Job.of(ResolvedRecipe(_load(_recipe(tmp_path))))
    parts = tuple(
        dataclasses.replace(
            p,
            tokens=(p.tokens[0], p.tokens[1].replace('"num_speculative_tokens":3', '"num_speculative_tokens":100000')),
        )
        if p.field == "launch.speculative_config"
        else p
        for p in job.parts
    )
    big = dataclasses.replace(job, parts=parts)
    assert json.loads(parts[-1].tokens[1])["num_speculative_tokens"] == 100000
    answer = launch_arg_check.ask(docker_daemon, cpu_engine_id, big).answer
    assert "speculative" in answer.stages and answer.refusals == (), answer
    tree = _tree(tmp_path / "t", replace={"    num_speculative_tokens: 3\n": "    num_speculative_tokens: 100000\n"})
    line = (tree / "recipes" / TEST_RECIPE / "recipe.yaml").read_text().splitlines().index(
        "    num_speculative_tokens: 100000"
    ) + 1
    result = run_kiln(
        "check", TEST_RECIPE, cwd=tree, env={"KILN_ROOT": str(tree), "KILN_CACHE_DIR": str(tmp_path / "t-cache")}
    )
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("kiln: error:")]
    assert result.returncode == 2, result.stderr[-3000:]
    assert errors == [
        (
            f"kiln: error: recipes/{TEST_RECIPE}/recipe.yaml:{line}: launch.speculative_config."
            "num_speculative_tokens: 100000 draft tokens per step: vLLM's rejection sampler takes at most "
            "128 (MAX_SPEC_LEN in vllm/v1/sample/rejection_sampler.py, asserted at every verification step)"
        )
    ]
    assert not (tmp_path / "t-cache" / "argcheck").exists(), "kiln asked the engine about a recipe it refuses"


def test_check_refuses_a_bad_feature_knob(tmp_path, accepted):
    _check_fails_with_one_line(
        tmp_path,
        ("launch", "env", "KILN_DRAFT_TRUNC_TAU"),
        "launch.env.KILN_DRAFT_TRUNC_TAU",
        "kiln-engine 0.1.0 (the engine image's) refuses it: draft-trunc: KILN_DRAFT_TRUNC_TAU='2': must lie in [0, 1]",
        env_extra='    KILN_DRAFT_TRUNC_TAU: "2"\n',
    )


def test_check_refuses_a_bad_moe_layer(tmp_path, accepted):
    _check_fails_with_one_line(
        tmp_path,
        ("launch", "env", "KILN_DRAFT_TRUNC_MOE_LAYER"),
        "launch.env.KILN_DRAFT_TRUNC_MOE_LAYER",
        "kiln-engine 0.1.0 (the engine image's) refuses it: draft-trunc: KILN_DRAFT_TRUNC_MOE_LAYER='8,16,1e6': "
        "expected EXPERTS,TOP_K,EXPERT_BYTES (e.g. 256,8,75497472); need 0 < TOP_K <= EXPERTS <= 1048576 "
        "and 0 < EXPERT_BYTES < 1e15",
        env_extra='    KILN_DRAFT_TRUNC_MOE_LAYER: "8,16,1e6"\n',
    )


def test_shipped_cpu_recipes_pass_the_value_check(docker_daemon, cpu_engine_id):
    from kiln.basics.paths import recipes_dir

    for name in ("tiny-moe", "tiny-kindling"):
        recipe = ResolvedRecipe(_load(recipes_dir() / name))
        job = launch_arg_check.Job.of(recipe)
        accepted, answer = launch_arg_check.ask(docker_daemon, cpu_engine_id, job)
        assert answer.version.startswith("0.32.0") and answer.kiln_engine, answer
        # every stage ran: the parser, serve's checks, EngineArgs, the config fields, the
        # speculative config and kiln-engine's knobs (tiny-kindling switches draft-trunc on)
        assert answer.stages == ("parse", "serve", "engine-args", "config", "speculative", "env"), answer
        assert launch_arg_check.launch_problems(recipe, accepted, job, answer) == [], name


def test_answer_is_cached_per_command_line(tmp_path, docker_daemon, cpu_engine_id, monkeypatch):
    """A second check of the same argv asks no container; a changed value does."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    recipe = ResolvedRecipe(_load(_recipe(tmp_path, replace={"    max-num-seqs: 8\n": "    max-num-seqs: 0\n"})))
    runs = []
    real = docker_daemon.run_script
    monkeypatch.setattr(docker_daemon, "run_script", lambda *a, **kw: runs.append(1) or real(*a, **kw))
    first = launch_arg_check.check_engine_image(docker_daemon, recipe, cpu_engine_id)
    assert len(runs) == 1 and len(first) == 1 and "SchedulerConfig.max_num_seqs" in first[0], first
    assert launch_arg_check.check_engine_image(docker_daemon, recipe, cpu_engine_id) == first
    assert len(runs) == 1
    other = ResolvedRecipe(_load(_recipe(tmp_path / "b", replace={"    max-num-seqs: 8\n": "    max-num-seqs: 4\n"})))
    assert launch_arg_check.check_engine_image(docker_daemon, other, cpu_engine_id) == []
    assert len(runs) == 2
    assert re.fullmatch(
        r"[0-9a-f]{24}-[0-9a-f]{32}\.json",
        launch_arg_check._answer_file(cpu_engine_id, launch_arg_check.Job.of(other)).name,
    )


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


def test_build_with_bad_value_fails_with_17_and_leaves_no_tag(tmp_path, accepted, docker_daemon):
    tree = _tree(tmp_path, replace={"    max-num-seqs: 8\n": "    max-num-seqs: .inf\n"})
    line = _load(tree / "recipes" / TEST_RECIPE).line_of("launch", "args", "max-num-seqs")
    remove_images(docker_daemon, f"kiln/{TEST_RECIPE}")
    result = run_kiln(
        "build", TEST_RECIPE, cwd=tree, env={"KILN_ROOT": str(tree), "KILN_CACHE_DIR": str(tmp_path / "cache")}
    )
    try:
        assert result.returncode == 17, result.stderr[-3000:]
        errors = [ln for ln in result.stderr.splitlines() if ln.startswith("kiln: error:")]
        assert errors == [
            (
                f"kiln: error: recipes/{TEST_RECIPE}/recipe.yaml:{line}: launch.args.max-num-seqs: "
                "vLLM 0.32.0 refuses --max-num-seqs inf: argument --max-num-seqs: invalid int value: 'inf'"
            )
        ]
        assert docker_daemon.client.images.list(name=f"kiln/{TEST_RECIPE}") == []
    finally:
        remove_images(docker_daemon, f"kiln/{TEST_RECIPE}")


def test_a_probe_past_its_wait_says_how_long_it_waited_and_leaves_no_container(docker_daemon, cpu_engine_id):
    """A loaded host can make the in-image probe slow: the error names the wait, not a
    urllib3 read timeout, and the throwaway container is gone."""
    script = "import time; time.sleep(60)  # kiln-test: probe past its wait"
    with pytest.raises(BuildFailed) as err:
        docker_daemon.run_script(
            cpu_engine_id,
            script,
            marker="KILN-TEST",
            answer=Shape(dict[str, object]),
            what="a sleeping probe",
            timeout_s=3,
        )
    assert err.value.message == "a sleeping probe did not finish within 3 s"
    assert "loaded" in err.value.hint
    left = [
        c
        for c in docker_daemon.client.containers.list(all=True, filters={"ancestor": cpu_engine_id})
        if script in (c.attrs["Config"].get("Entrypoint") or [])
    ]
    assert left == []
