"""Which fused-MoE config vLLM would look up for a recipe's rank, and the one line kiln
check prints when its pinned vLLM ships none (kiln.domain.planning.moe_tuning)."""

from __future__ import annotations

from kiln.domain.planning.model_config import parse_config
from kiln.domain.planning.moe_tuning import kernel_shape, untuned_line

GLM = {
    "architectures": ["Glm5NextForCausalLM"],
    "hidden_size": 6144,
    "num_hidden_layers": 78,
    "first_k_dense_replace": 3,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "intermediate_size": 12288,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "vocab_size": 154880,
    "max_position_embeddings": 1048576,
}
FP8 = {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}


def test_tp_cuts_the_expert_width_and_fp8_blocks_name_the_dtype():
    key = kernel_shape(
        parse_config({**GLM, **FP8}), tensor_parallel=8, data_parallel=1, expert_parallel=False, accelerator="h200"
    )
    assert key is not None
    assert key.file_name == "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"


def test_ep_shares_out_whole_experts():
    key = kernel_shape(parse_config(GLM), tensor_parallel=8, data_parallel=2, expert_parallel=True, accelerator="h100")
    assert key is not None
    assert key.file_name == "E=16,N=2048,device_name=NVIDIA_H100_80GB_HBM3.json"


def test_one_line_where_the_engine_ships_none_and_nothing_where_it_does():
    key = kernel_shape(parse_config(GLM), tensor_parallel=8, data_parallel=1, expert_parallel=False, accelerator="h100")
    assert key is not None
    line = untuned_line(key, frozenset(), "0.34.0")
    assert line is not None
    assert "\n" not in line
    assert line.startswith("no tuned fused-MoE config in vllm 0.34.0 for 256 experts of width 256 on NVIDIA_H100")
    assert untuned_line(key, frozenset({key.file_name}), "0.34.0") is None


def test_dense_and_mxfp4_models_have_no_lookup():
    dense = {k: v for k, v in GLM.items() if k not in ("n_routed_experts", "moe_intermediate_size")}
    shape = parse_config(dense)
    assert kernel_shape(shape, tensor_parallel=1, data_parallel=1, expert_parallel=False, accelerator="h200") is None
