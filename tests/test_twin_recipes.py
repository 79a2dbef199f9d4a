"""tiny-moe and tiny-kindling bake their models with one generator (recipes/_shared/,
named by each recipe's `build.shared`), each with its own settings; tiny-kindling shares
glm53-kindling's override instead of copying it."""

from __future__ import annotations

import hashlib
import shutil

import pytest
from kilntest import REPO

from kiln.basics.errors import RecipeInvalid
from kiln.domain.recipes.recipe import display_path, load_recipe
from kiln.domain.recipes.resolved import ResolvedRecipe

GENERATOR = REPO / "recipes" / "_shared" / "make_models.py"
# the generator's bytes, pinned so that any change to them, formatting included, is a
# decision: they are an input of both tiny recipes' images (recipes/tiny-kindling/Dockerfile)
GENERATOR_SHA256 = "54606ba24226c207f3a047e0b8db01c68d8ca097e66b7c3cc01f402381be1330"


@pytest.mark.parametrize("name", ["tiny-moe", "tiny-kindling"])
def test_each_tiny_recipe_gets_the_one_shared_generator_in_its_context(name):
    from kiln.domain.images.definitions import RecipeImage
    from kiln.domain.images.engine_image import EngineImage

    loaded = load_recipe(REPO / "recipes" / name)
    assert loaded.recipe.build.shared == ["make_models.py"]
    assert not (loaded.dir / "make_models.py").exists(), "one copy, in recipes/_shared/"
    ctx = RecipeImage(ResolvedRecipe(loaded), EngineImage(loaded.recipe.engine, None)).context
    shipped = {e.arcname: e for e in ctx.entries}
    # at the context root, where the recipe's Dockerfile COPYs it from
    assert "COPY make_models.py " in (loaded.dir / "Dockerfile").read_text()
    assert shipped["make_models.py"].content() == GENERATOR.read_bytes()
    assert hashlib.sha256(GENERATOR.read_bytes()).hexdigest() == GENERATOR_SHA256
    # and it is an input: another generator is another image
    digests = {name: sha for name, _, sha in ctx.manifest()}
    assert digests["make_models.py"] == GENERATOR_SHA256


def _copy(tmp_path, name="tiny-moe"):
    root = tmp_path / "recipes"
    shutil.copytree(REPO / "recipes" / name, root / name)
    shutil.copytree(REPO / "recipes" / "_shared", root / "_shared")
    return root / name


def _problems(folder) -> list[str]:
    with pytest.raises(RecipeInvalid) as info:
        load_recipe(folder)
    return info.value.problems


def test_a_shared_file_that_is_missing_is_named_with_its_line(tmp_path):
    folder = _copy(tmp_path)
    (folder.parent / "_shared" / "make_models.py").unlink()
    (problem,) = _problems(folder)
    line = next(
        i for i, ln in enumerate((folder / "recipe.yaml").read_text().splitlines(), 1) if ln.startswith("  shared:")
    )
    shown = display_path(folder / "recipe.yaml"), display_path(folder.parent / "_shared" / "make_models.py")
    assert problem == f"{shown[0]}:{line}: build.shared[0]: no file {shown[1]}"


def test_a_shared_file_next_to_its_own_copy_is_refused(tmp_path):
    folder = _copy(tmp_path)
    shutil.copy(GENERATOR, folder / "make_models.py")
    (problem,) = _problems(folder)
    assert "build.shared[0]" in problem and "make_models.py exists too" in problem


@pytest.mark.parametrize(
    "entry,message",
    [
        ("[make_models.py, make_models.py]", "'make_models.py' is named twice"),
        ("[../tiny-kindling/Dockerfile]", "build.shared[0]: must match"),
        ("[.hidden]", "build.shared[0]: must match"),
    ],
)
def test_bad_shared_entries(tmp_path, entry, message):
    folder = _copy(tmp_path)
    text = (folder / "recipe.yaml").read_text().replace("shared: [make_models.py]", f"shared: {entry}")
    (folder / "recipe.yaml").write_text(text)
    assert any(message in p for p in _problems(folder)), _problems(folder)


def test_tiny_kindling_is_glm53_kindlings_twin():
    twin = load_recipe(REPO / "recipes" / "tiny-kindling")
    glm = load_recipe(REPO / "recipes" / "glm53-kindling")
    assert twin.feature_dir("draft-trunc") == glm.feature_dir("draft-trunc")
    assert not (twin.dir / "experimental").exists(), "the override is shared, not copied"
    spec = twin.recipe.launch.speculative_config
    assert spec["num_speculative_tokens"] == glm.recipe.launch.speculative_config["num_speculative_tokens"]
    from kiln.domain.serving.launch_command import launch_document

    def knobs(loaded):
        env = launch_document(loaded)["env"]
        return {k: v for k, v in env.items() if k.startswith("KILN_DRAFT_TRUNC")}

    twin_knobs, glm_knobs = knobs(twin), knobs(glm)
    # the one knob only the twin sets: its cost policy prices glm53's layer, not its own
    priced = twin_knobs.pop("KILN_DRAFT_TRUNC_MOE_LAYER")
    # the ones only the GPU recipe sets: drafting's price is its eager drafter's against a
    # TP-8 H200 step, and depth stays off there; the twin's "dyn" e2e server serves
    # drafting priced, with depth on (tests/e2e/test_tiny_kindling.py)
    assert glm_knobs.pop("KILN_DRAFT_TRUNC_DEPTH") == "0"
    assert glm_knobs.pop("KILN_DRAFT_TRUNC_DRAFT_COST").startswith("1:")
    assert twin_knobs == glm_knobs and twin_knobs["KILN_DRAFT_TRUNC"] == "1"
    assert "KILN_DRAFT_TRUNC_TAU" not in twin_knobs, "both run the cost-aware policy"
    from kiln_engine.draft_trunc._cost import MoELayer
    from kiln_engine.draft_trunc._env import read_knobs

    experts, top_k, expert_bytes = read_knobs({"KILN_DRAFT_TRUNC_MOE_LAYER": priced}).moe_layer
    assert MoELayer(experts, top_k, expert_bytes) == MoELayer(), "the GLM-5-like layer the H200 table measured"
    env = twin.recipe.launch.env
    assert env["VLLM_USE_V2_MODEL_RUNNER"] == "1" and env["TRITON_INTERPRET"] == "1"
    assert twin.recipe.launch.args["dtype"] == "float32"
