"""launch_arg_probe's env stage run against this checkout's kiln-engine: bad knobs named,
vLLM's model-free config checks, one-line reports, and the probe alone as it is sent."""

from __future__ import annotations

from pathlib import Path

import pytest
from kilntest import REPO

from kiln.domain.imagecheck import launch_arg_check
from kiln.inimage import launch_arg_probe, launch_arg_vllm


@pytest.fixture(autouse=True)
def _root(tmp_path, monkeypatch):
    """Error lines name files relative to the working directory: run in the copies'."""
    monkeypatch.chdir(tmp_path)


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
