"""The feature registry: one parser per knob, and recipes sharing another recipe's
override (`experimental: [{name, from}]`)."""

from __future__ import annotations

import shutil

import pytest
from kiln_engine import features
from kiln_engine.draft_trunc._env import Knobs, read_knobs
from kilntest import REPO, run_kiln

from kiln.basics.errors import RecipeInvalid
from kiln.domain.recipes.feature_registry import engine_features, registry
from kiln.domain.recipes.recipe import load_recipe
from kiln.usecases.smoke_checks import feature_ratio, metric_sum

DT = features.DRAFT_TRUNC


@pytest.mark.parametrize("value", ["maybe", "2", "enable"])
def test_a_bad_switch_fails_the_same_way_everywhere(value):
    # before the registry, features.py read these as "off" while _env.py raised
    env = {"KILN_DRAFT_TRUNC": value}
    with pytest.raises(ValueError, match="KILN_DRAFT_TRUNC="):
        DT.enabled(env)
    with pytest.raises(ValueError, match="KILN_DRAFT_TRUNC="):
        read_knobs(env)
    with pytest.raises(features.UnsafeConfiguration, match="draft-trunc: KILN_DRAFT_TRUNC="):
        features.check_environment(env)


def test_a_bad_knob_stops_the_plugin_naming_the_variable():
    env = {"KILN_DRAFT_TRUNC": "1", "KILN_DRAFT_TRUNC_TAU": "2"}
    with pytest.raises(features.UnsafeConfiguration, match=r"KILN_DRAFT_TRUNC_TAU='2': must lie in \[0, 1\]"):
        features.check_environment(env)


def test_a_bad_moe_layer_stops_the_plugin_in_one_line():
    env = {"KILN_DRAFT_TRUNC": "1", "KILN_DRAFT_TRUNC_MOE_LAYER": "256,8,1e30"}
    with pytest.raises(features.UnsafeConfiguration) as exc:
        features.check_environment(env)
    message = str(exc.value)
    assert "\n" not in message
    assert message.startswith("kiln-engine: draft-trunc: KILN_DRAFT_TRUNC_MOE_LAYER='256,8,1e30': expected")


def test_knobs_are_the_registry_reading():
    env = {"KILN_DRAFT_TRUNC": "on", "KILN_DRAFT_TRUNC_TAU": "0", "KILN_DRAFT_TRUNC_TRACE": "/tmp/t.jsonl"}
    # policy "auto" resolves from whether a tau is given: here one is, so the fixed-tau rule
    assert read_knobs(env) == Knobs(**{**DT.read(env), "policy": "tau"})
    assert read_knobs(env).trace == "/tmp/t.jsonl" and read_knobs(env).tau == 0.0
    assert read_knobs({"KILN_DRAFT_TRUNC": "1"}).policy == "cost" == Knobs().policy
    defaults = {k.name: k.default for k in DT.knobs if k.name != "policy"}
    assert {k: v for k, v in Knobs().__dict__.items() if k not in ("enabled", "policy")} == defaults


def test_the_override_sets_only_knobs_the_registry_knows():
    text = (REPO / "recipes" / "glm53-kindling" / "experimental" / "draft-trunc" / "override.yaml").read_text()
    import yaml

    env = yaml.safe_load(text)["env"]
    known = {DT.env} | {k.env for k in DT.knobs}
    assert set(env) <= known, set(env) - known
    DT.read(env)  # and every value parses


def test_harness_and_engine_read_the_same_registry():
    assert registry() is features
    assert [f.name for f in engine_features(["version-warning", "draft-trunc"])] == ["draft-trunc"]


def test_ratios_come_from_counter_sums():
    text = "\n".join(  # one exposition line a line  # noqa: FLY002
        [
            "# TYPE kiln_draft_trunc_dead_total counter",
            "kiln_draft_trunc_dead_total 30.0",
            "kiln_draft_trunc_tokens_total 100.0",
            "kiln_draft_trunc_accepted_total 0.0",
        ]
    )
    values = {m: metric_sum(text, m) for m in DT.metrics}
    assert feature_ratio(values, DT.ratio("dead_fraction")) == pytest.approx(0.3)
    assert feature_ratio(values, DT.ratio("acceptance")) is None  # kept never counted
    with pytest.raises(KeyError, match="no ratio 'dead_frac'"):
        DT.ratio("dead_frac")


# -- experimental: [{name, from}] ------------------------------------------------------------
def _twin(tmp_path, entry: str, *, with_glm: bool = True):
    root = tmp_path / "recipes"
    root.mkdir()
    if with_glm:
        shutil.copytree(REPO / "recipes" / "glm53-kindling", root / "glm53-kindling")
    shutil.copytree(REPO / "recipes" / "tiny-kindling", root / "tiny-kindling")
    shutil.copytree(REPO / "recipes" / "_shared", root / "_shared")  # its build.shared
    rfile = root / "tiny-kindling" / "recipe.yaml"
    text = rfile.read_text()
    start = text.index("experimental:")
    end = text.index("smoke:")
    rfile.write_text(text[:start] + f"experimental: {entry}\n" + text[end:])
    return root / "tiny-kindling"


def test_a_recipe_uses_another_recipes_override(tmp_path):
    loaded = load_recipe(_twin(tmp_path, "[{name: draft-trunc, from: glm53-kindling}]"))
    assert loaded.recipe.features == ["draft-trunc"]
    assert loaded.feature_dir("draft-trunc") == tmp_path / "recipes" / "glm53-kindling" / "experimental" / "draft-trunc"


@pytest.mark.parametrize(
    "entry,message",
    [
        ("[{name: draft-trunc, from: nope}]", "experimental[0].from: no recipe 'nope' in"),
        ("[{name: nope, from: glm53-kindling}]", "experimental[0].from: recipe 'glm53-kindling' has no overlay at"),
        ("[{name: draft-trunc, from: ../glm53-kindling}]", "experimental[0].from: must match"),
        ("[{name: draft-trunc, from: tiny-kindling}]", "'tiny-kindling' is this recipe"),
        ("[{name: draft-trunc, form: glm53-kindling}]", "experimental[0].form: unknown key"),
        ("[draft-trunc, {name: draft-trunc, from: glm53-kindling}]", "'draft-trunc' is switched on twice"),
    ],
)
def test_a_bad_from_is_one_line_naming_the_field(tmp_path, entry, message):
    with pytest.raises(RecipeInvalid) as info:
        load_recipe(_twin(tmp_path, entry))
    assert any(message in p for p in info.value.problems), info.value.problems
    assert all("\n" not in p and "recipe.yaml:" in p for p in info.value.problems)


def test_from_may_not_lead_outside_the_recipes_folder(tmp_path):
    twin = _twin(tmp_path, "[{name: draft-trunc, from: glm53-kindling}]", with_glm=False)
    outside = tmp_path / "elsewhere"
    shutil.copytree(REPO / "recipes" / "glm53-kindling", outside)
    (tmp_path / "recipes" / "glm53-kindling").mkdir()
    shutil.copy(outside / "recipe.yaml", tmp_path / "recipes" / "glm53-kindling" / "recipe.yaml")
    (tmp_path / "recipes" / "glm53-kindling" / "experimental").symlink_to(outside / "experimental")
    with pytest.raises(RecipeInvalid) as info:
        load_recipe(twin)
    assert any("experimental[0].from:" in p and "leads outside" in p for p in info.value.problems), info.value.problems


def test_smoke_bounds_need_the_feature_switched_on(tmp_path):
    twin = _twin(tmp_path, "[]")
    with pytest.raises(RecipeInvalid) as info:
        load_recipe(twin)
    assert any("smoke.features.draft-trunc: not switched on" in p for p in info.value.problems)


def test_kiln_show_names_where_a_shared_feature_comes_from_and_its_engine_versions():
    from kiln.domain.recipes.overrides import load_override

    versions = load_override(REPO / "recipes" / "glm53-kindling" / "experimental" / "draft-trunc").series_versions()
    assert "0.32.0" in versions and "0.34.0" in versions  # the CPU twin's, and the CUDA recipes' pin
    result = run_kiln("show", "tiny-kindling")
    assert result.returncode == 0, result.stderr
    assert f"draft-trunc from glm53-kindling (series for vllm {', '.join(versions)})" in result.stdout


def test_av_calibration_without_adaptive_verification_is_refused_at_load(tmp_path):
    """KILN_DRAFT_TRUNC_AV_CALIBRATE=1 in glm53-kindling's env while its speculative
    config leaves adaptive verification off: one line naming the knob's line and the
    field; with adaptive verification on, the recipe loads."""
    root = tmp_path / "recipes"
    shutil.copytree(REPO / "recipes", root, ignore=shutil.ignore_patterns("__pycache__"))
    rfile = root / "glm53-kindling" / "recipe.yaml"
    text = rfile.read_text()
    knob = '    KILN_DRAFT_TRUNC_AV_CALIBRATE: "1"\n    KILN_DRAFT_TRUNC_WITH_AV: "1"\n'
    text = text.replace('    KILN_DRAFT_TRUNC_DEPTH: "0"\n', '    KILN_DRAFT_TRUNC_DEPTH: "0"\n' + knob)
    rfile.write_text(text)
    with pytest.raises(RecipeInvalid) as info:
        load_recipe(root / "glm53-kindling")
    [problem] = [p for p in info.value.problems if "AV_CALIBRATE" in p]
    line = text[: text.index(knob)].count("\n") + 1
    assert f"recipe.yaml:{line}: launch.env.KILN_DRAFT_TRUNC_AV_CALIBRATE:" in problem
    assert "enable_adaptive_verification is not true" in problem and "\n" not in problem
    for shared in ("docker-images", "engine"):  # what a checkout holds besides recipes/
        (tmp_path / shared).symlink_to(REPO / shared)
    cli = run_kiln("check", "glm53-kindling", env={"KILN_ROOT": str(tmp_path)})
    assert cli.returncode == 2, cli.stderr  # RecipeInvalid, before any image is looked at
    assert f"recipe.yaml:{line}: launch.env.KILN_DRAFT_TRUNC_AV_CALIBRATE:" in cli.stderr
    rfile.write_text(
        text.replace(
            "    method: draft_model\n", "    method: draft_model\n    enable_adaptive_verification: true\n", 1
        )
    )
    assert load_recipe(root / "glm53-kindling").recipe.launch.env["KILN_DRAFT_TRUNC_AV_CALIBRATE"] == "1"
