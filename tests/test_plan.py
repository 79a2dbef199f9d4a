"""`kiln plan` against published deployment facts: each model's documented deployment fits
and the next smaller one does not; the parameter counts its formulas give equal the
publishers' counts; the CLI's table, verdict line and exit codes.

Shapes are the config.json numbers of each model (the recipes' `shape:` blocks where a
recipe serves the model; DeepSeek-V3 and Kimi-K2 below, with their sources)."""

from __future__ import annotations

import pytest
from kilntest import REPO, run_kiln

from kiln.basics.errors import ModelShapeUnknown
from kiln.domain.planning.model_config import parse_config, total_params
from kiln.domain.planning.plan import Layout, PlanInput, compute
from kiln.domain.recipes.accelerators import ACCELERATORS
from kiln.domain.recipes.recipe import load_recipe

# `kiln check` asks a daemon for the engine image when there is one: not here
pytestmark = pytest.mark.usefixtures("no_docker")

# https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json: DeepSeek-V3.2's
# geometry without the sparse-attention indexer
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "hidden_size": 7168,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "num_nextn_predict_layers": 1,
    "vocab_size": 129280,
    "max_position_embeddings": 163840,
    "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
    "torch_dtype": "bfloat16",
}
# https://huggingface.co/moonshotai/Kimi-K2-Instruct/blob/main/config.json (DeepseekV3 architecture)
KIMI_K2 = {
    **DEEPSEEK_V3,
    "num_attention_heads": 64,
    "n_routed_experts": 384,
    "first_k_dense_replace": 1,
    "num_nextn_predict_layers": 0,
    "vocab_size": 163840,
    "max_position_embeddings": 131072,
}


def _recipe_config(name: str, role: str = "target") -> dict:
    src = getattr(load_recipe(REPO / "recipes" / name).recipe.model, role)
    return src.shape.as_config()


def _plan(config: dict, gpu: str, layout: Layout, **args):
    inp = PlanInput(
        recipe="fact",
        flavour="cuda",
        engine_version="0.33.0",
        args=args,
        env={},
        speculative=None,
        target=parse_config(config),
        draft=None,
        topology=None,
    )
    return compute(inp, ACCELERATORS[gpu], layout)


# -- parameter counts: the formulas against the publishers' totals ---------------------------
@pytest.mark.parametrize(
    "config, published, source",
    [
        (lambda: _recipe_config("qwen3-30b-a3b"), 30.5e9, "Qwen3-30B-A3B model card: 30.5B total parameters"),
        (lambda: _recipe_config("qwen3-30b-a3b", "draft"), 0.6e9, "Qwen3-0.6B model card: 0.6B parameters"),
        (lambda: _recipe_config("gpt-oss-120b"), 116.83e9, "openai/gpt-oss-120b model card: 116.83B parameters"),
        (lambda: DEEPSEEK_V3, 671e9, "DeepSeek-V3 README: 671B total parameters (685B with the 14B MTP module)"),
        (lambda: KIMI_K2, 1.0e12, "Kimi-K2 model card: 1T total parameters"),
        (
            lambda: _recipe_config("glm53-kindling-2node"),
            743e9,
            "vllm-project/recipes models/zai-org/GLM-5.3.yaml: parameter_count 743B",
        ),
    ],
)
def test_parameter_count_matches_the_publisher(config, published, source):
    counted = total_params(parse_config(config()))
    assert abs(counted - published) / published < 0.03, f"{counted / 1e9:.2f}B vs {source}"


def test_mtp_layer_is_counted_separately():
    s = parse_config(DEEPSEEK_V3)
    mtp = total_params(s, with_mtp=True) - total_params(s)
    # DeepSeek-V3 README: 14B MTP module = one MoE layer + projection (11.6B) + embedding and head (1.9B)
    assert 11e9 < mtp < 12.5e9


# -- published deployments: the documented one fits, the next smaller one does not ------------
FACTS = [
    # (model, gpu, fits layout, does-not-fit (gpu, layout), launch args, source)
    (
        "Qwen3-30B-A3B bf16",
        lambda: _recipe_config("qwen3-30b-a3b"),
        "h100",
        Layout(1),
        ("l40s", Layout(1)),
        {"max-model-len": 32768},
        (
            "vllm-project/recipes models/Qwen/Qwen3-30B-A3B.yaml: bf16 vram_minimum_gb 74; basetenlabs/truss-examples "
            "llm/qwen/qwen-3-30B-A3-vllm: GPU H100:1"
        ),
    ),
    (
        "gpt-oss-120b",
        lambda: _recipe_config("gpt-oss-120b"),
        "h100",
        Layout(1),
        ("l40s", Layout(1)),
        {"max-model-len": 131072},
        (
            "openai-cookbook articles/gpt-oss/run-vllm.md: gpt-oss-120b 'Can fit on a single H100'; "
            "vllm-project/recipes "
            "OpenAI/GPT-OSS.md: 'gpt-oss-120b will fit on a single A100 (80GB)'"
        ),
    ),
    (
        "gpt-oss-120b on A100",
        lambda: _recipe_config("gpt-oss-120b"),
        "a100",
        Layout(1),
        ("l40s", Layout(1)),
        {"max-model-len": 131072},
        "vllm-project/recipes OpenAI/GPT-OSS.md: 'will fit on a single A100 (80GB)'",
    ),
    (
        "DeepSeek-V3 FP8",
        lambda: DEEPSEEK_V3,
        "h200",
        Layout(tp=8, ep=True),
        ("h100", Layout(tp=8, ep=True)),
        {"max-model-len": 163840},
        (
            "vllm-project/recipes models/deepseek-ai/DeepSeek-V3.yaml: 'Native FP8 weights on 8xH200', vram_minimum_gb "
            "805 (8 x H100 = 640 GB)"
        ),
    ),
    (
        "DeepSeek-V3 FP8, 4 x H200",
        lambda: DEEPSEEK_V3,
        "h200",
        Layout(tp=8, ep=True),
        ("h200", Layout(tp=4, ep=True)),
        {"max-model-len": 163840},
        "vllm-project/recipes DeepSeek/DeepSeek-V3.md: '8xH200 with fp8'",
    ),
    (
        "Kimi-K2 FP8 at 128k",
        lambda: KIMI_K2,
        "h100",
        Layout(tp=8, pp=2),
        ("h100", Layout(tp=8)),
        {"max-model-len": 131072},
        (
            "Kimi-K2-Instruct deploy guidance (vllm-project/recipes "
            "models/moonshotai/Kimi-K2-Instruct.yaml): 'The smallest "
            "deployment unit for Kimi-K2 FP8 weights with 128k seqlen "
            "on mainstream H800 platforms is a 16-GPU cluster', "
            "its first layout Tensor Parallelism + Pipeline Parallelism (TP8+PP2) (H800: the H100's 80 GB)"
        ),
    ),
    (
        "GLM-5.3 FP8",
        lambda: _recipe_config("glm53-kindling"),
        "h200",
        Layout(tp=8),
        ("h100", Layout(tp=8)),
        {"max-model-len": 131072},
        "vllm-project/recipes models/zai-org/GLM-5.3.yaml: 'The FP8 checkpoint fits on a single 8xH200 / 8xH20 node'",
    ),
    (
        "GLM-5.3 BF16",
        lambda: _recipe_config("glm53-kindling-2node"),
        "h200",
        Layout(tp=8, dp=2, ep=True),
        ("h200", Layout(tp=8)),
        {"max-model-len": 131072},
        "vllm-project/recipes models/zai-org/GLM-5.3.yaml: BF16 'requires multi-node deployment'",
    ),
]


@pytest.mark.parametrize("name, config, gpu, layout, smaller, args, source", FACTS, ids=[f[0] for f in FACTS])
def test_published_deployment_fits_and_the_next_smaller_one_does_not(name, config, gpu, layout, smaller, args, source):
    cfg = config()
    fits = _plan(cfg, gpu, layout, **args)
    assert fits.fits, f"{name} on {layout.gpus} x {gpu} should fit ({source}): kv room {fits.kv_room / 2**30:.1f} GiB"
    small_gpu, small_layout = smaller
    short = _plan(cfg, small_gpu, small_layout, **args)
    assert not short.fits, f"{name} on {small_layout.gpus} x {small_gpu} should not fit ({source})"


# -- the arithmetic itself ----------------------------------------------------------------------
def test_kv_cache_of_a_gqa_model_is_split_over_tensor_parallel_ranks():
    cfg = _recipe_config("qwen3-30b-a3b")
    one = _plan(cfg, "h200", Layout(1), **{"max-model-len": 32768})
    # 48 layers x 2 (K, V) x 4 KV heads x 128 x 2 bytes = 98,304 bytes per token
    assert one.kv_one == 98304 * 32768
    two = _plan(cfg, "h200", Layout(2), **{"max-model-len": 32768})
    assert two.kv_one == one.kv_one / 2
    # 4 KV heads over 8 ranks: vLLM replicates, one head per rank (not half a head)
    eight = _plan(cfg, "h200", Layout(8), **{"max-model-len": 32768})
    assert eight.kv_one == one.kv_one / 4


def test_mla_kv_cache_is_whole_on_every_rank_and_fp8_uses_flashmla_sparse_layout():
    cfg = _recipe_config("deepseek-v32-mtp")
    bf16 = _plan(cfg, "h200", Layout(tp=1), **{"max-model-len": 1024})
    tp8 = _plan(cfg, "h200", Layout(tp=8), **{"max-model-len": 1024})
    assert bf16.kv_one == tp8.kv_one  # the latent is not split over heads
    # (512 + 64) x 2 bytes + the indexer's 128 fp8 + 4-byte scale, per layer and token
    assert bf16.kv_one == 61 * (1152 + 132) * 1024
    fp8 = _plan(cfg, "h200", Layout(tp=1), **{"max-model-len": 1024, "kv-cache-dtype": "fp8"})
    assert fp8.kv_one == 61 * (656 + 132) * 1024


def test_sliding_window_layers_hold_only_their_window():
    cfg = _recipe_config("gpt-oss-120b")
    plan = _plan(cfg, "h200", Layout(1), **{"max-model-len": 131072, "max-num-batched-tokens": 8192})
    per_token = 2 * 8 * 64 * 2  # K and V, 8 KV heads of 64, bf16
    full = 18 * per_token * 131072
    window = 18 * per_token * (-(-(128 - 1 + 8192) // 16) + 1) * 16
    assert plan.kv_one == full + window


def test_expert_parallel_splits_experts_over_every_rank_and_replicates_attention():
    cfg = DEEPSEEK_V3
    tp8 = _plan(cfg, "h200", Layout(tp=8, ep=True))
    dp8 = _plan(cfg, "h200", Layout(tp=1, dp=8, ep=True))
    # the same expert share per GPU, but DP replicas hold the whole attention and vocabulary
    assert dp8.weights > tp8.weights
    no_ep = _plan(cfg, "h200", Layout(tp=1, dp=8, ep=False))
    assert no_ep.weights > 8 * 0.9 * tp8.weights  # every replica holds every expert


def test_layout_over_more_gpus_adds_replicas_or_widens_tensor_parallel():
    assert Layout(tp=2, dp=4, ep=True).over(16) == Layout(tp=2, dp=8, ep=True)
    assert Layout(tp=8).over(4) == Layout(tp=4)
    assert Layout(tp=8, pp=2).over(6) == Layout(tp=3, pp=2)


def test_a_config_without_a_needed_number_is_named():
    with pytest.raises(ModelShapeUnknown, match="num_hidden_layers"):
        parse_config({"hidden_size": 8, "num_attention_heads": 2, "vocab_size": 10})


# -- the CLI --------------------------------------------------------------------------------------
def test_plan_prints_the_table_and_fits():
    result = run_kiln("plan", "qwen3-30b-a3b")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for row in (
        "weights: target",
        "weights: draft",
        "KV cache: 1 request",
        "KV cache: all requests",
        "engine reserve",
        "usable",
        "left for KV cache",
    ):
        assert row in out
    assert "1 x NVIDIA H200" in out and "fits 1 x h200" in result.stderr


def test_plan_that_does_not_fit_exits_92_with_one_line():
    result = run_kiln("plan", "deepseek-v32-mtp", "--gpu", "h100")
    assert result.returncode == 92
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("kiln: error:")]
    assert len(errors) == 1 and "does not fit 8 x h100" in errors[0] and "short" in errors[0]


def test_strict_needs_every_request_at_full_length():
    result = run_kiln("plan", "qwen3-30b-a3b", "--strict")
    assert result.returncode == 92 and "(--strict)" in result.stderr


def test_more_gpus_make_the_two_node_variant_unnecessary_on_h200_but_not_on_h100():
    assert run_kiln("plan", "deepseek-v32-mtp-2node", "--gpus", "8").returncode == 92  # 8 x H100
    assert run_kiln("plan", "deepseek-v32-mtp-2node", "--gpu", "h200", "--gpus", "8").returncode == 0


def test_check_runs_the_plan_of_recipes_with_a_topology(tmp_path):
    import shutil

    root = tmp_path / "tree"
    for part in ("recipes", "docker-images", "engine", "patches"):
        shutil.copytree(
            REPO / part, root / part, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
        )
    (root / "benchmarks").symlink_to(REPO / "benchmarks")  # the served: records the recipe names
    path = root / "recipes" / "deepseek-v32-mtp" / "recipe.yaml"
    path.write_text(path.read_text().replace("accelerator: h200", "accelerator: h100"))
    result = run_kiln("check", "deepseek-v32-mtp", env={"KILN_ROOT": str(root)}, cwd=root)
    assert result.returncode == 92, result.stderr
    assert "recipes/deepseek-v32-mtp/recipe.yaml" in result.stderr and "does not fit 8 x h100" in result.stderr
