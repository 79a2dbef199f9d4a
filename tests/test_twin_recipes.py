"""tiny-moe and tiny-kindling bake their models with one generator, each with its own
settings; tiny-kindling shares glm53-kindling's override instead of copying it."""

from __future__ import annotations

from kilntest import REPO

from kiln.domain.recipe import load_recipe


def test_both_tiny_recipes_ship_the_same_model_generator():
    # a recipe's build context is its own folder, so each carries a copy: keep them equal
    ours = (REPO / "recipes" / "tiny-kindling" / "make_models.py").read_bytes()
    assert (REPO / "recipes" / "tiny-moe" / "make_models.py").read_bytes() == ours


def test_tiny_kindling_is_glm53_kindlings_twin():
    twin = load_recipe(REPO / "recipes" / "tiny-kindling")
    glm = load_recipe(REPO / "recipes" / "glm53-kindling")
    assert twin.feature_dir("draft-trunc") == glm.feature_dir("draft-trunc")
    assert not (twin.dir / "experimental").exists(), "the override is shared, not copied"
    spec = twin.recipe.launch.speculative_config
    assert spec["num_speculative_tokens"] == glm.recipe.launch.speculative_config["num_speculative_tokens"]
    from kiln.domain.launch import launch_document

    def knobs(loaded):
        env = launch_document(loaded)["env"]
        return {k: v for k, v in env.items() if k.startswith("KILN_DRAFT_TRUNC")}

    twin_knobs = knobs(twin)
    # the one knob only the twin sets: its cost policy prices glm53's layer, not its own
    priced = twin_knobs.pop("KILN_DRAFT_TRUNC_MOE_LAYER")
    assert twin_knobs == knobs(glm) and twin_knobs["KILN_DRAFT_TRUNC"] == "1"
    assert "KILN_DRAFT_TRUNC_TAU" not in twin_knobs, "both run the cost-aware policy"
    from kiln_engine.draft_trunc._cost import MoELayer
    from kiln_engine.draft_trunc._env import read_knobs

    experts, top_k, expert_bytes = read_knobs({"KILN_DRAFT_TRUNC_MOE_LAYER": priced}).moe_layer
    assert MoELayer(experts, top_k, expert_bytes) == MoELayer(), "the GLM-5-like layer the H200 table measured"
    env = twin.recipe.launch.env
    assert env["VLLM_USE_V2_MODEL_RUNNER"] == "1" and env["TRITON_INTERPRET"] == "1"
    assert twin.recipe.launch.args["dtype"] == "float32"
