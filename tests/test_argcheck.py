"""launch_arg_check's mapping of the engine image's answer to recipe lines (no Docker: the
in-image half is tested against the real engine image in tests/cuda/test_argcheck_docker.py;
the probe's env stage in tests/test_argcheck_probe.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from kilntest import REPO

from kiln.basics.errors import LaunchArgInvalid
from kiln.domain.imagecheck import launch_arg_check
from kiln.domain.imagecheck.launch_arg_check import Job, _ProbeAnswer, _Refusal
from kiln.domain.recipes.overrides import load_override
from kiln.domain.recipes.recipe import load_recipe
from kiln.domain.recipes.resolved import ResolvedRecipe
from kiln.domain.serving.launch_command import _vllm_argv
from kiln.inimage import launch_arg_vllm

ALL_STAGES = ("parse", "serve", "engine-args", "config", "speculative", "env")


@pytest.fixture(autouse=True)
def _root(tmp_path, monkeypatch):
    """Error lines name files relative to the working directory: run in the copies'."""
    monkeypatch.chdir(tmp_path)


def _copy(tmp_path: Path, name: str, replace: dict[str, str]) -> Path:
    """recipes/NAME copied into a tree of its own (with what its `from:` overrides need)."""
    shutil.copytree(REPO / "recipes", tmp_path / "recipes")
    file = tmp_path / "recipes" / name / "recipe.yaml"
    text = file.read_text()
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new, 1)
    file.write_text(text)
    return file.parent


def _answer(*refusals: _Refusal, version: str | None = "0.32.0") -> _ProbeAnswer:
    return _ProbeAnswer(version=version, kiln_engine="0.1.0", refusals=refusals, stages=ALL_STAGES)


def _accepted(loaded) -> launch_arg_check._EngineArgs:
    """A flag set that knows every flag the recipe uses (so only values are judged)."""
    flags = {
        flag: {"takes_value": value is not True, "default_on": False}
        for flag, value in loaded.recipe.launch.args.items()
    }
    return launch_arg_check._EngineArgs(
        {
            "version": "0.32.0",
            "flags": flags,
            "speculative_keys": sorted(loaded.recipe.launch.speculative_config or {}),
            "speculative_methods": ["draft_model"],
        }
    )


def _group_of(job: Job, field: str) -> int:
    return next(i for i, part in enumerate(job.parts) if part.field == field)


def test_parts_add_up_to_the_exact_argv_of_every_recipe():
    for name in ("tiny-moe", "tiny-kindling", "glm53-kindling", "glm53-kindling-2node"):
        loaded = load_recipe(REPO / "recipes" / name)
        recipe = ResolvedRecipe(loaded)
        job = Job.of(recipe)
        assert [t for p in job.parts for t in p.tokens] == _vllm_argv(loaded.recipe)
        assert job.parts[0].tokens[0] == "serve" and all(p.tokens[0].startswith("--") for p in job.parts[1:])
        # every part names a place in recipe.yaml that exists
        for part in job.parts:
            assert loaded.line_of(*part.loc) > 1, part


def test_a_flag_refusal_names_its_recipe_line_flag_value_and_complaint(tmp_path):
    loaded = load_recipe(
        _copy(tmp_path, "tiny-moe", {"    max-model-len: 512\n": '    max-model-len: "512; touch /tmp/pwned"\n'})
    )
    recipe = ResolvedRecipe(loaded)
    job = Job.of(recipe)
    complaint = "argument --max-model-len: invalid human_readable_int_or_auto value: '512; touch /tmp/pwned'"
    answer = _answer(_Refusal("parse", complaint, group=_group_of(job, "launch.args.max-model-len")))
    line = loaded.line_of("launch", "args", "max-model-len")
    assert launch_arg_check.launch_problems(recipe, _accepted(loaded), job, answer) == [
        (
            f"recipes/tiny-moe/recipe.yaml:{line}: launch.args.max-model-len: vLLM 0.32.0 refuses "
            f"--max-model-len '512; touch /tmp/pwned': {complaint}"
        )
    ]


def test_speculative_key_refusals_name_the_key_line_or_the_draft_path(tmp_path):
    loaded = load_recipe(_copy(tmp_path, "tiny-moe", {}))
    recipe = ResolvedRecipe(loaded)
    job = Job.of(recipe)
    group = _group_of(job, "launch.speculative_config")
    found = [
        p.line
        for p in launch_arg_check._value_problems(
            recipe,
            job,
            _answer(
                _Refusal(
                    "speculative",
                    "SpeculativeConfig.num_speculative_tokens: Input should be greater than 0",
                    group=group,
                    key="num_speculative_tokens",
                ),
                _Refusal(
                    "speculative", "SpeculativeConfig.model: Input should be a valid string", group=group, key="model"
                ),
            ),
        )
    ]
    spec_line = loaded.line_of("launch", "speculative_config", "num_speculative_tokens")
    draft_line = loaded.line_of("model", "draft", "path")
    assert found == [
        (
            f"recipes/tiny-moe/recipe.yaml:{spec_line}: launch.speculative_config.num_speculative_tokens: vLLM 0.32.0 "
            "refuses num_speculative_tokens=3 in --speculative-config: SpeculativeConfig.num_speculative_tokens: "
            "Input should be greater than 0"
        ),
        # model is not written in the recipe: kiln fills it in from model.draft.path
        (
            f"recipes/tiny-moe/recipe.yaml:{draft_line}: model.draft.path: vLLM 0.32.0 refuses "
            "'model=\"/models/tiny-qwen3-draft\"' in --speculative-config: "
            "SpeculativeConfig.model: Input should be a valid string"
        ),
    ]


def test_env_refusals_name_the_recipe_env_line_or_the_override_line(tmp_path):
    loaded = load_recipe(_copy(tmp_path, "tiny-kindling", {}))
    recipe = ResolvedRecipe(loaded)
    job = Job.of(recipe)
    found = [
        p.line
        for p in launch_arg_check._value_problems(
            recipe,
            job,
            _answer(
                _Refusal(
                    "env",
                    "kiln-engine: draft-trunc: KILN_DRAFT_TRUNC_MOE_LAYER='256,8,75497472': nonsense",
                    var="KILN_DRAFT_TRUNC_MOE_LAYER",
                ),
                # set by the draft-trunc override tiny-kindling takes from glm53-kindling
                _Refusal("env", "kiln-engine: draft-trunc: bad min keep", var="KILN_DRAFT_TRUNC_MIN_KEEP"),
            ),
        )
    ]
    ov = load_override(tmp_path / "recipes" / "glm53-kindling" / "experimental" / "draft-trunc")
    assert found == [
        (
            f"recipes/tiny-kindling/recipe.yaml:{loaded.line_of('launch', 'env', 'KILN_DRAFT_TRUNC_MOE_LAYER')}: "
            "launch.env.KILN_DRAFT_TRUNC_MOE_LAYER: kiln-engine 0.1.0 (the engine image's) refuses it: "
            "draft-trunc: KILN_DRAFT_TRUNC_MOE_LAYER='256,8,75497472': nonsense"
        ),
        # the complaint did not say the value: the line does
        (
            f"recipes/glm53-kindling/experimental/draft-trunc/override.yaml:"
            f"{ov.source.line_of(('env', 'KILN_DRAFT_TRUNC_MIN_KEEP'))}: "
            "env.KILN_DRAFT_TRUNC_MIN_KEEP: kiln-engine 0.1.0 (the engine image's) refuses it: "
            "KILN_DRAFT_TRUNC_MIN_KEEP='1': draft-trunc: bad min keep"
        ),
    ]


def test_env_refusals_are_placed_with_the_overrides_the_recipe_resolved(tmp_path, monkeypatch):
    """The env's lines come from the resolved recipe's features (Job.of read them): mapping a
    refusal loads no override again."""
    from kiln.domain.recipes import overrides

    recipe = ResolvedRecipe(load_recipe(_copy(tmp_path, "tiny-kindling", {})))
    job = Job.of(recipe)

    def again(path, model):
        raise AssertionError(f"{path}: read a second time")

    monkeypatch.setattr(overrides, "load_validated", again)  # what every load_override reads with
    (problem,) = launch_arg_check._value_problems(
        recipe, job, _answer(_Refusal("env", "kiln-engine: bad", var="KILN_DRAFT_TRUNC_MIN_KEEP"))
    )
    assert problem.where.startswith("recipes/glm53-kindling/experimental/draft-trunc/override.yaml:")
    assert problem.field == "env.KILN_DRAFT_TRUNC_MIN_KEEP"


def test_a_schedule_refusal_names_its_key_line_and_value(tmp_path):
    schedule = "    num_speculative_tokens_per_batch_size: [[0, 4, 3]]\n"
    loaded = load_recipe(
        _copy(tmp_path, "tiny-moe", {"    num_speculative_tokens: 3\n": "    num_speculative_tokens: 3\n" + schedule})
    )
    recipe = ResolvedRecipe(loaded)
    job = Job.of(recipe)
    complaint = "dynamic speculation schedule: Batch-size range (0, 4) must be positive."
    (line,) = [
        p.line
        for p in launch_arg_check._value_problems(
            recipe,
            job,
            _answer(
                _Refusal(
                    "speculative",
                    complaint,
                    group=_group_of(job, "launch.speculative_config"),
                    key=launch_arg_vllm._SCHEDULE_KEY,
                )
            ),
        )
    ]
    at = loaded.line_of("launch", "speculative_config", "num_speculative_tokens_per_batch_size")
    assert line == (
        f"recipes/tiny-moe/recipe.yaml:{at}: launch.speculative_config.num_speculative_tokens_per_batch_size: "
        "vLLM 0.32.0 refuses 'num_speculative_tokens_per_batch_size=[[0, 4, 3]]' in --speculative-config: "
        f"{complaint}"
    )


def test_a_refusal_of_the_whole_line_names_the_launch_block(tmp_path):
    loaded = load_recipe(_copy(tmp_path, "tiny-moe", {}))
    recipe = ResolvedRecipe(loaded)
    job = Job.of(recipe)
    found = [
        p.line
        for p in launch_arg_check._value_problems(
            recipe, job, _answer(_Refusal("engine-args", "ValueError: no"), _Refusal("parse", "stale", group=99))
        )
    ]
    line = loaded.line_of("launch")
    assert found == [
        f"recipes/tiny-moe/recipe.yaml:{line}: launch: vLLM 0.32.0 refuses the launch command: ValueError: no",
        f"recipes/tiny-moe/recipe.yaml:{line}: launch: vLLM 0.32.0 refuses the launch command: stale",
    ]


def test_a_wrong_flag_name_is_said_once(tmp_path):
    """The name check (from the cached flag set) and argparse both refuse an unknown
    flag: the line says it once, the name check's way."""
    loaded = load_recipe(
        _copy(tmp_path, "tiny-moe", {"    dtype: bfloat16\n": "    dtype: bfloat16\n    max-model-lenght: 5\n"})
    )
    recipe = ResolvedRecipe(loaded)
    job = Job.of(recipe)
    accepted = _accepted(loaded)
    del accepted.flags["max-model-lenght"]
    answer = _answer(
        _Refusal(
            "parse",
            "unrecognized arguments: --max-model-lenght 5",
            group=_group_of(job, "launch.args.max-model-lenght"),
        )
    )
    found = launch_arg_check.launch_problems(recipe, accepted, job, answer)
    assert len(found) == 1 and found[0].endswith(
        "launch.args.max-model-lenght: vLLM 0.32.0 does not accept --max-model-lenght"
    )


def test_a_long_value_is_shortened_in_the_line(tmp_path):
    long = "x" * 5000
    loaded = load_recipe(_copy(tmp_path, "tiny-moe", {"    dtype: bfloat16\n": f"    dtype: {long}\n"}))
    recipe = ResolvedRecipe(loaded)
    job = Job.of(recipe)
    answer = _answer(_Refusal("parse", "argument --dtype: invalid choice", group=_group_of(job, "launch.args.dtype")))
    (line,) = launch_arg_check.launch_problems(recipe, _accepted(loaded), job, answer)
    assert len(line) < 400 and "..." in line


def test_many_problems_are_one_error_line_each():
    exc = LaunchArgInvalid(["a.yaml:1: f: one", "a.yaml:2: g: two\u2028three"])
    assert exc.lines()[:2] == ["a.yaml:1: f: one", "a.yaml:2: g: two\\u2028three"]
    assert exc.exit_code == 17


def test_the_cache_key_follows_the_command_line_and_env(tmp_path):
    loaded = load_recipe(_copy(tmp_path, "tiny-moe", {}))
    other = load_recipe(
        _copy(tmp_path / "b", "tiny-moe", {'    VLLM_CPU_KVCACHE_SPACE: "1"\n': '    VLLM_CPU_KVCACHE_SPACE: "2"\n'})
    )
    same = load_recipe(
        _copy(tmp_path / "c", "tiny-moe", {"launch:\n": "# a comment moves the lines, not the argv\nlaunch:\n"})
    )
    loaded_job, same_job, other_job = (Job.of(ResolvedRecipe(r)) for r in (loaded, same, other))
    assert loaded_job.digest == same_job.digest != other_job.digest
