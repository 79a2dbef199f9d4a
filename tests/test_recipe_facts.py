"""A recipe's facts that contradict each other, refused by `kiln check` before any build
and before the fit (domain/planning/recipe_facts.py, lock_policy.pin_problems): each
one line at the field's line with the reason vLLM or the build would give, exit 2
(RecipeInvalid), through the real CLI on a copy of recipes/."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from kilntest import REPO, run_kiln

GLM = "glm53-kindling"
pytestmark = pytest.mark.usefixtures("no_docker")  # the launch check's "no daemon" path


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A checkout whose recipes/ is a copy (to edit); the rest is the real one."""
    shutil.copytree(REPO / "recipes", tmp_path / "recipes", ignore=shutil.ignore_patterns("__pycache__"))
    for shared in ("docker-images", "engine", "benchmarks"):  # what a checkout holds besides recipes/
        (tmp_path / shared).symlink_to(REPO / shared)
    return tmp_path


def _edit(root: Path, old: str, new: str) -> tuple[str, int]:
    """recipes/glm53-kindling/recipe.yaml with `old` replaced; (its text, the line `new` starts at)."""
    file = root / "recipes" / GLM / "recipe.yaml"
    text = file.read_text()
    assert old in text, old
    text = text.replace(old, new, 1)
    file.write_text(text)
    return text, text[: text.index(new)].count("\n") + 1 + (len(new) - len(new.lstrip("\n")))


def _refused(root: Path, needle: str) -> str:
    cli = run_kiln("check", GLM, env={"KILN_ROOT": str(root)})
    assert cli.returncode == 2, cli.stderr  # RecipeInvalid, not 92 (PlanDoesNotFit)
    [line] = [p for p in cli.stderr.splitlines() if needle in p]
    assert line.startswith("kiln: error: ")
    assert "does not fit" not in cli.stderr  # checked before the fit arithmetic
    return line


def test_the_recipe_as_shipped_passes(checkout):
    cli = run_kiln("check", GLM, env={"KILN_ROOT": str(checkout)})
    assert cli.returncode == 0, cli.stderr


def test_every_shipped_recipe_states_facts_that_agree():
    from kiln.domain.locks.lock_policy import pin_problems
    from kiln.domain.planning.recipe_facts import problems
    from kiln.domain.recipes.recipe import load_recipe, recipe_dir, recipe_names

    names = recipe_names()
    assert GLM in names
    for name in names:
        loaded = load_recipe(recipe_dir(name))
        assert problems(loaded) + pin_problems(loaded) == [], name


def test_a_draft_with_another_vocabulary_is_refused(checkout):
    _, at = _edit(checkout, "vocab_size: {value: 154880,", "vocab_size: {value: 151936,")
    line = _refused(checkout, "vocab_size 151936")
    assert line.endswith(
        f"recipes/{GLM}/recipe.yaml:{at}: model.draft.shape.config.vocab_size: vocab_size 151936 is not the "
        "target's 154880: vLLM refuses a draft model whose vocabulary differs from its target's at start"
    )


def test_more_experts_per_token_than_routed_experts_is_refused_before_the_fit(checkout):
    _, at = _edit(checkout, "        num_experts_per_tok: 8\n", "        num_experts_per_tok: 300\n")
    line = _refused(checkout, "num_experts_per_tok 300")
    assert line.endswith(
        f"recipes/{GLM}/recipe.yaml:{at}: model.target.shape.config.num_experts_per_tok: num_experts_per_tok 300 "
        "is above n_routed_experts 256: the router cannot pick more experts per token than the model has"
    )


def test_tensor_parallel_that_does_not_divide_the_heads_is_refused(checkout):
    _edit(checkout, "        num_attention_heads: 64\n", "        num_attention_heads: 60\n")
    text = (checkout / "recipes" / GLM / "recipe.yaml").read_text()
    at = text[: text.index("  tensor_parallel: 8")].count("\n") + 1
    line = _refused(checkout, "must be divisible by tensor parallel size")
    assert line.endswith(
        f"recipes/{GLM}/recipe.yaml:{at}: tensor_parallel: vLLM: Total number of attention heads (60) must be "
        "divisible by tensor parallel size (8) (model.target.shape.config.num_attention_heads)"
    )


def test_max_model_len_above_the_positions_is_refused(checkout):
    _, at = _edit(checkout, "    max-model-len: 131072\n", "    max-model-len: 2097152\n")
    line = _refused(checkout, "User-specified max_model_len")
    assert f"recipes/{GLM}/recipe.yaml:{at}: launch.args.max-model-len: vLLM: User-specified max_model_len " in line
    assert "(2097152) is greater than the derived max_model_len (max_position_embeddings=1048576 at " in line


@pytest.mark.parametrize(
    ("old", "new", "field", "says"),
    [
        ("  torch: 2.14.0\n", "  torch: 2.13.0\n", "torch", "engine.torch: 2.13.0, but "),
        ('  cuda: "13.0"\n', '  cuda: "12.8"\n', "cuda", "engine.cuda: 12.8, but "),
    ],
)
def test_engine_pins_that_contradict_the_lock_are_refused(checkout, old, new, field, says):
    _, at = _edit(checkout, old, new)
    line = _refused(checkout, says)
    found = {"torch": "2.14.0", "cuda": "13.0"}[field]
    assert f"recipes/{GLM}/recipe.yaml:{at}: {says}" in line
    assert (
        f"docker-images/engine-cuda/locks/vllm-0.34.0.lock.json pins {found} for vllm 0.34.0: the build would "
        f"fail when it reads the image's (set {found}, or re-lock: kiln engine lock {GLM})"
    ) in line


def test_a_served_record_that_is_no_file_is_refused(checkout):
    old = "    record: benchmarks/gpu_twin/results/gpu-twin-2026-12-07-glm53-kindling.json\n"
    _, at = _edit(checkout, old, old.replace("kindling.json", "kindling-gone.json"))
    line = _refused(checkout, "kindling-gone.json")
    assert line.endswith(
        f"recipes/{GLM}/recipe.yaml:{at}: served[3].record: "
        "benchmarks/gpu_twin/results/gpu-twin-2026-12-07-glm53-kindling-gone.json is no file of the checkout"
    )


def test_an_env_var_kiln_sets_itself_is_refused_naming_its_field(checkout):
    old = '    KILN_DRAFT_TRUNC_DEPTH: "0"\n'
    _, at = _edit(checkout, old, old + '    KILN_FEATURES: ""\n')
    line = _refused(checkout, "KILN_FEATURES")
    assert line.endswith(
        f"recipes/{GLM}/recipe.yaml:{at + 1}: launch.env.KILN_FEATURES: kiln sets KILN_FEATURES itself, from "
        "`experimental:` (its value here would be overwritten): set experimental instead"
    )


def test_hf_hub_cache_beside_a_hub_model_is_refused(tmp_path):
    import shutil as sh

    from kiln.domain.planning.recipe_facts import problems
    from kiln.domain.recipes.recipe import load_recipe

    sh.copytree(REPO / "recipes" / "tiny-moe-hf", tmp_path / "tiny-moe-hf")
    rfile = tmp_path / "tiny-moe-hf" / "recipe.yaml"
    text = rfile.read_text()
    assert "\n  env:\n" in text
    text = text.replace("\n  env:\n", "\n  env:\n    HF_HUB_CACHE: /elsewhere\n", 1)
    rfile.write_text(text)
    at = text[: text.index("    HF_HUB_CACHE:")].count("\n") + 1
    [line] = problems(load_recipe(tmp_path / "tiny-moe-hf"))
    assert line.endswith(
        f"tiny-moe-hf/recipe.yaml:{at}: launch.env.HF_HUB_CACHE: kiln sets HF_HUB_CACHE itself, for "
        "`model.target.source: hf` (the mounted cache, checked before start): drop it"
    )
