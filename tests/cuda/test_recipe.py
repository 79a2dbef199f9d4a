"""glm53-kindling's recipe: schema, launch command, and the names it relies on existing
in the pinned vLLM (checked in the engine's own sources, not from memory)."""

from __future__ import annotations

import itertools
import json

import pytest

# daemon-optional commands run with no daemon, on purpose (conftest no_docker): unit tests
pytestmark = pytest.mark.usefixtures("no_docker")


def test_recipe_is_a_cuda_recipe_on_one_8_gpu_node(glm):
    r = glm.recipe
    assert r.engine.flavour == "cuda" and r.engine.version == "0.34.0"
    assert r.engine.torch and r.engine.cuda, "torch and CUDA must be declared, so the build can check them"
    assert r.topology and (r.topology.nodes, r.topology.accelerators_per_node, r.topology.tensor_parallel) == (1, 8, 8)
    assert r.smoke.gpu is True and r.smoke.expect_spec_decode is True
    assert r.smoke.min_acceptance_rate and r.smoke.min_tokens_per_s


def test_weights_are_read_only_host_mounts_not_baked(glm):
    from kiln.domain.serving.launch_command import model_mounts

    mounts = dict(model_mounts(glm.recipe))
    assert mounts == {"/data/models/GLM-5.3": "/models/glm-5.3", "/data/models/GLM-5.3-kindling": "/models/kindling"}


def test_speculative_decoding_uses_the_draft_model(glm):
    from kiln.domain.serving.launch_command import _vllm_argv

    argv = _vllm_argv(glm.recipe)
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    schedule = spec.pop("num_speculative_tokens_per_batch_size")
    assert spec == {"method": "draft_model", "num_speculative_tokens": 4, "model": "/models/kindling"}
    # vLLM's batch-size schedule (docs/draft-trunc-policy.md section 4): every batch size
    # from 1 has a count, none above num_speculative_tokens
    assert schedule[0][0] == 1 and all(0 <= k <= 4 for _, _, k in schedule)
    assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(schedule))
    assert argv[:2] == ["serve", "/models/glm-5.3"]
    for flag in (
        "--tool-call-parser",
        "--reasoning-parser",
        "--max-model-len",
        "--gpu-memory-utilization",
        "--enable-auto-tool-choice",
    ):
        assert flag in argv, flag


def test_launch_env_is_offline_with_moe_padding_skip_and_draft_trunc_on(glm):
    from kiln.domain.serving.launch_command import launch_document

    env = launch_document(glm)["env"]
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_MOE_SKIP_PADDING"] == "1"
    assert env["KILN_DRAFT_TRUNC"] == "1"
    assert env["KILN_FEATURES"] == "draft-trunc"
    for knob in ("MIN_KEEP", "WARMUP", "EXPLORE", "LOG_INTERVAL"):
        assert f"KILN_DRAFT_TRUNC_{knob}" in env, knob
    # no fixed tau: the engine picks the cost-aware policy, priced from the model's config
    assert "KILN_DRAFT_TRUNC_TAU" not in env and "KILN_DRAFT_TRUNC_MOE_LAYER" not in env

    from kiln_engine.draft_trunc._env import read_knobs  # the engine's parser, as vLLM's reads it

    assert read_knobs(env).policy == "cost"


def test_recipe_passes_kiln_check():
    from kilntest import run_kiln

    result = run_kiln("check", "glm53-kindling")
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.fixture(scope="module")
def vllm_sources(glm):
    """The pinned vLLM's Python sources when already unpacked here (never downloaded by tests)."""
    from kiln.basics.paths import cache_dir

    for flavour in ("cuda", "cpu"):
        root = cache_dir() / "sources" / f"vllm-{glm.recipe.engine.version}-{flavour}" / "vllm"
        if root.is_dir():
            return root
    pytest.skip("vLLM sources not unpacked (kiln patches check fetches them)")


def test_architecture_and_parsers_are_registered_in_the_pinned_vllm(glm, vllm_sources):
    registry = (vllm_sources / "model_executor" / "models" / "registry.py").read_text()
    assert '"Glm5NextForCausalLM"' in registry
    tools = (vllm_sources / "tool_parsers" / "__init__.py").read_text()
    reasoning = (vllm_sources / "reasoning" / "__init__.py").read_text()
    assert f'"{glm.recipe.launch.args["tool-call-parser"]}"' in tools
    assert f'"{glm.recipe.launch.args["reasoning-parser"]}"' in reasoning
