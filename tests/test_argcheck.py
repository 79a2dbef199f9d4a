"""launch_arg_check's mapping of the engine image's answer to recipe lines, and launch_arg_probe's env
stage run against this checkout's kiln-engine (no Docker: the in-image half is tested
against the real engine image in tests/cuda/test_argcheck_docker.py)."""

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
from kiln.inimage import launch_arg_probe, launch_arg_vllm

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


# -- launch_arg_probe's env stage, with this checkout's kiln-engine --------------------------
@pytest.fixture
def clean_env(monkeypatch):
    import os

    for key in list(os.environ):
        if key.startswith(("KILN_DRAFT_TRUNC", "VLLM_MOE_SKIP_PADDING", "VLLM_USE_V2_MODEL_RUNNER")):
            monkeypatch.delenv(key)


def test_probe_names_every_bad_knob(clean_env):
    problems, version = launch_arg_probe._check_env(
        {"KILN_DRAFT_TRUNC_TAU": "2", "KILN_DRAFT_TRUNC_MOE_LAYER": "256,8"}
    )
    assert version is not None
    assert [(p["var"], p["message"]) for p in problems] == [
        ("KILN_DRAFT_TRUNC_TAU", "kiln-engine: draft-trunc: KILN_DRAFT_TRUNC_TAU='2': must lie in [0, 1]"),
        (
            "KILN_DRAFT_TRUNC_MOE_LAYER",
            (
                "kiln-engine: draft-trunc: KILN_DRAFT_TRUNC_MOE_LAYER='256,8': "
                "expected EXPERTS,TOP_K,EXPERT_BYTES (e.g. 256,8,75497472)"
            ),
        ),
    ]


def test_probe_runs_check_environment_for_combinations(clean_env):
    problems, _ = launch_arg_probe._check_env({"KILN_DRAFT_TRUNC": "1", "VLLM_MOE_SKIP_PADDING": "0"})
    assert len(problems) == 1 and problems[0]["var"] == "KILN_DRAFT_TRUNC", problems
    assert "needs VLLM_MOE_SKIP_PADDING=1" in problems[0]["message"]
    assert launch_arg_probe._check_env({"KILN_DRAFT_TRUNC": "1", "VLLM_MOE_SKIP_PADDING": "1"})[0] == []


def _stand_in_speculative_config():
    """A pydantic dataclass shaped like vLLM's SpeculativeConfig (the in-image probe runs
    against the real one: tests/cuda/test_argcheck_docker.py)."""
    from pydantic import model_validator
    from pydantic.dataclasses import dataclass

    @dataclass
    class SpeculativeConfig:
        method: str | None = None
        model: str | None = None
        num_speculative_tokens: int | None = None
        synthetic_acceptance_length: float | None = None
        prompt_lookup_min: int | None = None
        target_model_config: object = None

        def __post_init__(self):
            if self.method == "ngram" and (self.prompt_lookup_min or 0) > 5:
                raise ValueError(f"prompt_lookup_min={self.prompt_lookup_min} must be <= prompt_lookup_max=5")
            if self.method == "draft_model":
                raise ValueError("reads the draft model's config.json")

        @model_validator(mode="after")
        def _verify_args(self):
            if self.num_speculative_tokens is None:
                raise ValueError("num_speculative_tokens must be provided")
            length = self.synthetic_acceptance_length
            if length is not None and not 1 <= length <= self.num_speculative_tokens + 1:
                raise ValueError(
                    f"synthetic_acceptance_length must be in [1, {self.num_speculative_tokens + 1}], got {length}."
                )
            if self.model == "needs-the-model":
                self.target_model_config.get_vocab_size()  # AttributeError on the half-made instance
            return self

    return SpeculativeConfig


@pytest.mark.parametrize(
    "spec, expected",
    [
        (
            {"method": "draft_model", "num_speculative_tokens": 3, "synthetic_acceptance_length": 9},
            [
                (
                    "synthetic_acceptance_length",
                    "SpeculativeConfig: synthetic_acceptance_length must be in [1, 4], got 9.",
                )
            ],
        ),
        ({"method": "draft_model", "num_speculative_tokens": 3, "synthetic_acceptance_length": 2}, []),
        # no count: vLLM reads it from the draft model, which the probe has not got
        ({"method": "mtp", "synthetic_acceptance_length": 9}, []),
        # a check that needs the model (target_model_config) is no refusal
        ({"method": "draft_model", "model": "needs-the-model", "num_speculative_tokens": 3}, []),
        # __post_init__ runs for model-free methods only
        (
            {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 9},
            [("prompt_lookup_min", "SpeculativeConfig: prompt_lookup_min=9 must be <= prompt_lookup_max=5")],
        ),
        ({"method": "draft_model", "num_speculative_tokens": 3, "prompt_lookup_min": 9}, []),
    ],
)
def test_probe_runs_the_model_free_whole_config_checks(spec, expected):
    cls = _stand_in_speculative_config()
    inst = launch_arg_vllm._FieldCheck().instance(cls, dict(spec))
    assert launch_arg_vllm._speculative_whole(cls, inst, spec) == expected


def test_probe_names_the_key_a_complaint_names_first():
    spec = {"method": "x", "num_speculative_tokens": 3, "synthetic_acceptance_rates": [1.0]}
    assert (
        launch_arg_vllm._named_key("synthetic_acceptance_rates must have length 3 (num_speculative_tokens)", spec)
        == "synthetic_acceptance_rates"
    )
    # a key inside a longer name is not named: rejection_sample_method is not `method`
    assert launch_arg_vllm._named_key("rejection_sample_method='synthetic' needs a rate", spec) is None


def test_probe_tidies_pydantic_reports_into_one_line():
    text = (
        "1 validation error for CompilationConfig\nlevle\n  Unexpected keyword argument [type=x]\n"
        "    For further information visit https://errors.pydantic.dev/2.14/v/x"
    )
    assert (
        launch_arg_vllm._tidy(text)
        == "1 validation error for CompilationConfig levle Unexpected keyword argument [type=x]"
    )
    assert len(launch_arg_vllm._tidy("y" * 5000)) == launch_arg_vllm._MAX_MESSAGE + 3


@pytest.mark.parametrize("module", [launch_arg_vllm, launch_arg_probe], ids=lambda m: m.__name__)
def test_probe_imports_nothing_of_kiln(module):
    """The probe's modules run alone inside engine images, where kiln is not installed."""
    import ast

    tree = ast.parse(Path(module.__file__).read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert names and not [n for n in names if n == "kiln" or n.startswith("kiln.")], names


def test_the_probe_script_runs_alone_as_sent(tmp_path, clean_env):
    """The exact text launch_arg_check sends, run as `python -c` the way an engine image runs
    it, in a stand-in engine: this host's python (no vLLM) and this checkout's kiln-engine,
    kiln itself out of reach. The entry point finds launch_arg_vllm's names in the text
    before it, not by importing it."""
    import json
    import os
    import subprocess
    import sys

    request = {"jobs": [{"groups": [["serve", "m"]], "env": {"KILN_DRAFT_TRUNC_TAU": "2"}}]}
    env = {**os.environ, "PYTHONPATH": str(REPO / "engine"), launch_arg_probe.REQUEST_ENV: json.dumps(request)}
    done = subprocess.run(
        [sys.executable, "-c", launch_arg_check._PROBE],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith(launch_arg_probe.MARKER + " "))
    answer = json.loads(line.removeprefix(launch_arg_probe.MARKER + " "))
    assert answer["version"] is None and answer["kiln_engine"] is not None
    assert answer["jobs"] == [
        {
            "problems": [
                {
                    "stage": "env",
                    "group": None,
                    "key": None,
                    "var": "KILN_DRAFT_TRUNC_TAU",
                    "message": "kiln-engine: draft-trunc: KILN_DRAFT_TRUNC_TAU='2': must lie in [0, 1]",
                }
            ],
            "stages": ["env"],
        }
    ]
