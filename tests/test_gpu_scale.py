"""The scale twin's host half without a GPU: one rank's slice of each CUDA recipe, the
depth that fits, the informative acceptance table made from the recorded traces, and
the plan the device serves (benchmarks/gpu_twin/scale_*.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from kiln_testkit.scripts import load_script

shapes = load_script("benchmarks/gpu_twin/scale_shapes.py")
acceptance = load_script("benchmarks/gpu_twin/scale_acceptance.py")
scale_plan = load_script("benchmarks/gpu_twin/scale_plan.py")
scale_runner = load_script("benchmarks/gpu_twin/scale_runner.py")

GLM = {
    "architectures": ["Glm5NextForCausalLM"],
    "hidden_size": 6144,
    "num_hidden_layers": 78,
    "first_k_dense_replace": 3,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "q_lora_rank": 2048,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 192,
    "qk_rope_head_dim": 64,
    "v_head_dim": 256,
    "intermediate_size": 12288,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "vocab_size": 154880,
}


def test_a_tp8_rank_of_glm53_holds_an_eighth_of_heads_expert_width_and_vocabulary():
    cut = shapes.rank_slice(GLM, None, shapes.Topology(tensor_parallel=8))
    target = cut.target
    assert target["num_attention_heads"] == 8 and target["num_key_value_heads"] == 1
    assert (target["n_routed_experts"], target["num_experts_per_tok"]) == (256, 8)
    assert (target["moe_intermediate_size"], target["intermediate_size"]) == (256, 1536)
    assert target["vocab_size"] == 154880 // 8
    assert cut.attention == "gqa" and any("GQA" in note for note in cut.substitutions)
    # shared/notes/scale-twin.md: 2.42 GB of bf16 a MoE layer of this slice
    assert cut.layer_bytes == pytest.approx(2.42e9, rel=0.03)


def test_expert_parallel_shares_whole_experts_out_and_keeps_their_width():
    topo = shapes.Topology(tensor_parallel=2, data_parallel=4, expert_parallel=True)
    target = shapes.rank_slice(GLM, None, topo, "mla").target
    assert (target["n_routed_experts"], target["moe_intermediate_size"]) == (32, 2048)
    assert target["num_experts_per_tok"] == 4  # 8 * 32/256 * 4 DP ranks' tokens
    assert target["architectures"] == ["DeepseekV3ForCausalLM"] and target["kv_lora_rank"] == 512


def test_a_tp_that_does_not_divide_the_heads_is_one_line():
    with pytest.raises(shapes.ShapeProblem, match=r"^num_attention_heads 64 does not divide by 6$"):
        shapes.rank_slice(GLM, None, shapes.Topology(tensor_parallel=6))


def test_depth_is_full_where_it_fits_and_cuts_the_drafter_by_the_same_factor():
    assert shapes.depth(78, 28, 10, 100, 10_000) == (78, 28)
    assert shapes.depth(78, 28, 100, 100, 2_100) == (20, 7)  # 20 of 78, 28 * 20/78 = 7.2
    with pytest.raises(shapes.ShapeProblem, match="do not fit"):
        shapes.depth(78, 28, 100, 100, 150)


def test_the_acceptance_table_sets_the_level_and_keeps_the_recordings_spread():
    doc = acceptance.table()
    assert doc["windows"] > 1000
    for i, target in enumerate(doc["conditional"]):
        mean = sum(1 / (1 + math.exp(-(row[i] + doc["shift"][i]))) for row in doc["accept_logits"]) / doc["windows"]
        assert mean == pytest.approx(target, abs=2e-3)
    spread = acceptance.spread(doc)
    assert abs(spread["high_tenth"] - spread["low_tenth"]) > 0.02  # request levels differ


def test_a_recording_without_variation_gives_a_flat_table(tmp_path: Path):
    lines = [
        json.dumps({"step": n, "k": 4, "reqs": [{"p": [0.5] * 4, "kept": 4, "accepted": n % 5, "n": 4}]})
        for n in range(50)
    ]
    (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n")
    spread = acceptance.spread(acceptance.table([tmp_path / "t.jsonl"]))
    assert spread["low_tenth"] == spread["high_tenth"]
    assert acceptance.conditional([0.8, 0.6]) == pytest.approx([0.8, 0.75])


def test_the_plan_serves_the_recipes_own_command_with_every_change_listed():
    plan = scale_plan.recipe_plan("glm53-kindling", "gqa")
    configs = plan["configs"]
    assert set(configs) >= {"spec-off", "k1", "k2", "k3", "spec", "schedule", "shipped", "dt-cost", "av", "kiln-av"}
    shipped = configs["shipped"]["argv"]
    assert "--tensor-parallel-size" not in shipped and shipped[shipped.index("--load-format") + 1] == "dummy"
    for name, config in configs.items():
        argv = config["argv"]
        if name == "spec-off":
            assert "--speculative-config" not in argv
            continue
        spec = json.loads(argv[argv.index("--speculative-config") + 1])
        assert spec["rejection_sample_method"] == "synthetic"
        assert len(spec["synthetic_acceptance_rates"]) == spec["num_speculative_tokens"]
    changed = {c["what"] for c in plan["changes"]}
    assert {"--tensor-parallel-size", "--load-format", "--max-model-len", "model"} <= changed
    assert (
        configs["shipped"]["env"]["KILN_DRAFT_TRUNC"] == "1" and configs["schedule"]["env"]["KILN_DRAFT_TRUNC"] == "0"
    )


def test_a_cpu_recipe_is_refused_in_one_line():
    with pytest.raises(SystemExit, match=r"^gpu-scale: tiny-moe is a CPU recipe"):
        scale_plan.recipe_plan("tiny-moe", "gqa")


def test_the_runner_reads_counters_and_switches_acceptance_and_routing():
    text = (
        'vllm:generation_tokens_total{model="m"} 10.0\nvllm:generation_tokens_total{model="n"} 5.0\n# HELP x\nother 3\n'
    )
    assert scale_runner.parse_counters(text) == {"vllm:generation_tokens_total": 15.0}
    config = {"argv": [], "env": {"A": "1"}}
    variant = scale_runner._variant(config, "informative", "correlated")
    assert variant["env"]["KILN_GPU_TWIN_ACCEPTANCE"].endswith("acceptance.json")
    assert variant["env"]["VLLM_MOE_ROUTING_SIMULATION_STRATEGY"] == "kiln_correlated"
    assert "KILN_GPU_TWIN_ACCEPTANCE" not in scale_runner._variant(config, "flat", "uniform")["env"]


def test_a_step_profile_counts_kernels_copies_and_syncs_per_step():
    step_profile = load_script("benchmarks/gpu_twin/step_profile.py")
    events = [
        {"name": "fused_moe_kernel", "cat": "kernel", "dur": 30.0},
        {"name": "fused_moe_kernel", "cat": "kernel", "dur": 50.0},
        {"name": "Memcpy DtoH (Device -> Pinned)", "cat": "gpu_memcpy", "dur": 2.0},
        {"name": "cudaStreamSynchronize", "cat": "cuda_runtime", "dur": 9.0},
        {"name": "cudaLaunchKernel", "cat": "cuda_runtime", "dur": 3.0},
        {"name": "aten::add", "cat": "cpu_op", "dur": 5.0},
    ]
    out = step_profile.summarise({"traceEvents": events}, steps=2)
    assert out["kernels"] == {"fused_moe_kernel": {"per_step": 1.0, "us_per_step": 40.0}}
    assert out["gpu_us_per_step"] == 40.0
    assert list(out["syncs"]) == ["cudaStreamSynchronize"] and list(out["copies"]) == ["Memcpy DtoH (Device -> Pinned)"]
    assert out["launches"] == {"cudaLaunchKernel": {"per_step": 0.5, "us_per_step": 1.5}}


def test_correlated_routing_loads_about_the_published_share_of_experts():
    """4 verified tokens load about 2.5x one token's experts in real routing (published);
    uniform draws load 3.8x (256 * (1 - (1 - 8/256)^4) / 8), kiln_correlated about 2.4x."""
    uniform = shapes.distinct_experts(4, 256, 8, rho=0.0, trials=2000)
    correlated = shapes.distinct_experts(4, 256, 8, rho=0.5, trials=2000)
    assert uniform / 8 == pytest.approx(256 * (1 - (1 - 8 / 256) ** 4) / 8, rel=0.01)
    assert 2.2 < correlated / 8 < 2.7


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ("{not json", "not JSON ("),
        ('{"recipes": []}', "plan.json.recipes: must be a JSON object, not list"),
        (
            '{"recipes": {"r": {"slice": {}, "configs": {}, "smoke": {}}}}',
            "plan.json: recipes.r: missing field 'substitutions'",
        ),
        (
            (
                '{"recipes": {"r": {"slice": {"target": {}, "full_layers": "78"}, '
                '"configs": {}, "smoke": {}, "substitutions": []}}}'
            ),
            "plan.json: recipes.r.slice.full_layers: must be a JSON integer, not str",
        ),
    ],
)
def test_a_damaged_plan_is_one_line_and_exit_3(tmp_path: Path, capsys, doc: str, says: str):
    (tmp_path / "plan.json").write_text(doc)
    assert scale_runner.main(["--plan", str(tmp_path / "plan.json"), "--out", str(tmp_path / "out")]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err
    assert not (tmp_path / "out").exists()  # nothing made before the plan is read
