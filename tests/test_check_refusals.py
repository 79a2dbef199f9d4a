"""Recipes `kiln check` refuses at load, before any image is looked at: each one line
naming recipe.yaml (or override.yaml) and the line of the field, exit 2 (RecipeInvalid),
through the real CLI on a copy of recipes/."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from kilntest import REPO, run_kiln


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A checkout whose recipes/ is a copy (to edit); the rest is the real one."""
    shutil.copytree(REPO / "recipes", tmp_path / "recipes", ignore=shutil.ignore_patterns("__pycache__"))
    for shared in ("docker-images", "engine"):  # what a checkout holds besides recipes/
        (tmp_path / shared).symlink_to(REPO / shared)
    return tmp_path


def _edit(file: Path, old: str, new: str) -> str:
    text = file.read_text()
    assert old in text, old
    text = text.replace(old, new, 1)
    file.write_text(text)
    return text


def _line_of(text: str, snippet: str) -> int:
    return text[: text.index(snippet)].count("\n") + 1


def _refused(root: Path, name: str, needle: str) -> str:
    """`kiln check NAME` exits 2 and prints one problem holding `needle` (an override's
    problem may be printed twice, once per check that loads the override: one line)."""
    cli = run_kiln("check", name, env={"KILN_ROOT": str(root)})
    assert cli.returncode == 2, cli.stderr  # RecipeInvalid, before any image is looked at
    [line] = {p for p in cli.stderr.splitlines() if needle in p}
    assert line.startswith("kiln: error: ")
    return line


# -- 3. unknown KILN_<FEATURE>_* knobs --------------------------------------------------
def test_a_misspelt_knob_in_the_recipe_env_names_the_closest_one(checkout):
    rfile = checkout / "recipes" / "glm53-kindling" / "recipe.yaml"
    text = _edit(rfile, '    KILN_DRAFT_TRUNC_EXPLORE: "0.05"\n', '    KILN_DRAFT_TRUNC_EXPLOR: "0.05"\n')
    line = _refused(checkout, "glm53-kindling", "KILN_DRAFT_TRUNC_EXPLOR:")
    at = _line_of(text, "KILN_DRAFT_TRUNC_EXPLOR:")
    assert f"recipes/glm53-kindling/recipe.yaml:{at}: launch.env.KILN_DRAFT_TRUNC_EXPLOR: " in line
    assert "has no knob KILN_DRAFT_TRUNC_EXPLOR (did you mean KILN_DRAFT_TRUNC_EXPLORE?)" in line


def test_a_misspelt_knob_in_an_override_env_is_refused_at_its_line(checkout):
    ofile = checkout / "recipes" / "glm53-kindling" / "experimental" / "draft-trunc" / "override.yaml"
    text = _edit(ofile, '  KILN_DRAFT_TRUNC_WARMUP: "1"\n', '  KILN_DRAFT_TRUNC_WARMUPS: "1"\n')
    line = _refused(checkout, "glm53-kindling", "KILN_DRAFT_TRUNC_WARMUPS:")
    at = _line_of(text, "KILN_DRAFT_TRUNC_WARMUPS:")
    assert f"experimental/draft-trunc/override.yaml:{at}: env.KILN_DRAFT_TRUNC_WARMUPS: " in line
    assert "did you mean KILN_DRAFT_TRUNC_WARMUP?" in line


def test_a_name_far_from_every_knob_lists_the_knobs(checkout):
    rfile = checkout / "recipes" / "glm53-kindling" / "recipe.yaml"
    _edit(rfile, '    KILN_DRAFT_TRUNC_DEPTH: "0"\n', '    KILN_DRAFT_TRUNC_ZZZZZZZZZZZZZZZZ: "0"\n')
    line = _refused(checkout, "glm53-kindling", "KILN_DRAFT_TRUNC_ZZZZZZZZZZZZZZZZ:")
    assert "its knobs: KILN_DRAFT_TRUNC, KILN_DRAFT_TRUNC_TAU," in line


def test_every_registered_knob_and_other_kiln_names_pass(checkout):
    from kiln_engine.features import FEATURES

    from kiln.domain.recipes.feature_registry import unknown_knob_problems

    env = {k.env: "" for f in FEATURES for k in (f.switch, *f.knobs)}
    env |= {"KILN_FEATURES": "x", "KILN_DRAFT_TRUNCATE": "1"}  # no `KILN_DRAFT_TRUNC_` prefix
    assert unknown_knob_problems(env, lambda *loc: "f:1", ("env",)) == []


# -- 4. smoke bounds that cannot hold ---------------------------------------------------
def test_a_smoke_min_above_its_max_is_refused(checkout):
    rfile = checkout / "recipes" / "glm53-kindling" / "recipe.yaml"
    text = _edit(
        rfile, "      dead_fraction: {max: 0.9}\n", "      dead_fraction:\n        min: 0.95\n        max: 0.9\n"
    )
    line = _refused(checkout, "glm53-kindling", "min 0.95 is above max 0.9")
    at = _line_of(text, "        min: 0.95")
    assert line.endswith(
        f"recipes/glm53-kindling/recipe.yaml:{at}: smoke.features.draft-trunc.dead_fraction: "
        "min 0.95 is above max 0.9, so no run can pass: swap them or fix one"
    )


@pytest.mark.parametrize("bound", ["{max: 1.5}", "{min: -0.1}", "{max: .nan}"])
def test_a_share_bound_outside_0_1_is_refused(checkout, bound):
    rfile = checkout / "recipes" / "glm53-kindling" / "recipe.yaml"
    text = _edit(rfile, "      dead_fraction: {max: 0.9}\n", f"      dead_fraction: {bound}\n")
    line = _refused(checkout, "glm53-kindling", "is outside [0, 1]")
    at = _line_of(text, f"dead_fraction: {bound}")
    side = bound[1:4]
    assert f"recipes/glm53-kindling/recipe.yaml:{at}: smoke.features.draft-trunc.dead_fraction.{side}: " in line
    assert "dead_fraction is a share of draft-trunc's counters: use a value in [0, 1]" in line


def test_a_ratio_the_registry_does_not_declare_is_only_held_to_min_below_max(checkout):
    rfile = checkout / "recipes" / "glm53-kindling" / "recipe.yaml"
    _edit(rfile, "      dead_fraction: {max: 0.9}\n", "      dead_fraction: {max: 0.9}\n      speedup: {min: 1.2}\n")
    from kiln.domain.recipes.recipe import load_recipe

    loaded = load_recipe(checkout / "recipes" / "glm53-kindling")
    assert loaded.recipe.smoke.features["draft-trunc"]["speedup"].min == 1.2


# -- 1. vLLM's adaptive verification with what it cannot run with ----------------------
_AV_ON = ("    method: draft_model\n", "    method: draft_model\n    enable_adaptive_verification: true\n")
_ARGS = "    max-model-len: 131072\n"


@pytest.mark.parametrize(
    ("old", "new", "at", "field", "says"),
    [
        (
            _ARGS,
            _ARGS + "    enforce-eager: true\n",
            "    enforce-eager",
            "launch.args.enforce-eager",
            "vLLM refuses adaptive verification without full CUDA graphs, and enforce-eager captures none",
        ),
        (
            _ARGS,
            _ARGS + "    compilation-config: {cudagraph_mode: piecewise}\n",
            "    compilation-config",
            "launch.args.compilation-config.cudagraph_mode",
            "piecewise has no full CUDA graphs",
        ),
        (
            "  tensor_parallel: 8\n",
            "  tensor_parallel: 4\n  pipeline_parallel: 2\n",
            "  pipeline_parallel",
            "topology.pipeline_parallel",
            "vLLM refuses adaptive verification with pipeline parallelism",
        ),
        (
            _ARGS,
            _ARGS + "    enable-lora: true\n",
            "    enable-lora",
            "launch.args.enable-lora",
            "vLLM refuses adaptive verification with LoRA",
        ),
        (
            '    VLLM_MOE_SKIP_PADDING: "1"\n',
            '    VLLM_MOE_SKIP_PADDING: "1"\n    VLLM_USE_V2_MODEL_RUNNER: "0"\n',
            "    VLLM_USE_V2_MODEL_RUNNER",
            "launch.env.VLLM_USE_V2_MODEL_RUNNER",
            "0 selects the V1 model runner",
        ),
        (
            "  version: 0.34.0\n",
            "  version: 0.31.0\n",
            "  version: 0.31.0",
            "engine.version",
            "vLLM 0.31.0 has no adaptive verification (first in 0.32.0)",
        ),
    ],
)
def test_adaptive_verification_with_what_vllm_refuses_it_with(checkout, old, new, at, field, says):
    rfile = checkout / "recipes" / "glm53-kindling" / "recipe.yaml"
    _edit(rfile, *_AV_ON)
    text = _edit(rfile, old, new)
    line = _refused(checkout, "glm53-kindling", f": {field}: ")
    assert f"recipes/glm53-kindling/recipe.yaml:{_line_of(text, at)}: {field}: " in line
    assert says in line and "enable_adaptive_verification is true" in line


def test_adaptive_verification_on_the_cpu_engine_is_refused(checkout):
    rfile = checkout / "recipes" / "tiny-kindling" / "recipe.yaml"
    text = _edit(rfile, *_AV_ON)
    line = _refused(checkout, "tiny-kindling", ": engine.flavour: ")
    assert f"recipes/tiny-kindling/recipe.yaml:{_line_of(text, '  flavour: cpu')}: engine.flavour: cpu: " in line
    assert "runs only in the CUDA (V2 GPU) model runner" in line
    _refused(checkout, "tiny-kindling", ": launch.args.enforce-eager: ")  # the twin runs eager, too


def test_pipeline_parallel_from_launch_args_is_refused_at_the_flag(checkout):
    rfile = checkout / "recipes" / "glm53-kindling" / "recipe.yaml"
    _edit(rfile, *_AV_ON)
    text = rfile.read_text()
    start, end = text.index("topology:\n"), text.index("launch:\n")
    text = text[:start] + text[end:]  # no topology: the layout comes from launch.args
    rfile.write_text(text.replace(_ARGS, _ARGS + "    pipeline-parallel-size: 2\n", 1))
    from kiln.basics.errors import RecipeInvalid
    from kiln.domain.recipes.recipe import load_recipe

    with pytest.raises(RecipeInvalid) as info:
        load_recipe(checkout / "recipes" / "glm53-kindling")
    [problem] = [p for p in info.value.problems if "pipeline" in p]
    assert ": launch.args.pipeline-parallel-size: vLLM refuses adaptive verification with pipeline" in problem


def test_adaptive_verification_alone_loads(checkout):
    from kiln.domain.recipes.recipe import load_recipe

    rfile = checkout / "recipes" / "glm53-kindling" / "recipe.yaml"
    _edit(rfile, *_AV_ON)
    assert load_recipe(checkout / "recipes" / "glm53-kindling").recipe.launch.speculative_config
