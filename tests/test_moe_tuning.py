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


def _warnings(caplog, monkeypatch, root):
    import logging

    from kiln.domain.recipes.resolved import resolve_recipe
    from kiln.infra import wheel_cache
    from kiln.usecases import check

    monkeypatch.setattr(wheel_cache, "cached_sources", lambda version, flavour: root)
    from kiln.domain.imagecheck.launch_checker import LaunchCheck

    monkeypatch.setattr(check, "_launch_args", lambda recipe, platform: LaunchCheck([], None))  # no engine asked
    with caplog.at_level(logging.DEBUG, logger="kiln.usecases"):
        check.check_one(resolve_recipe("deepseek-v32-mtp-2node"))
    return [r.getMessage() for r in caplog.records if "fused-MoE" in r.getMessage() or "MoE tuning" in r.getMessage()]


def test_kiln_check_warns_where_the_pinned_vllm_ships_no_tuned_config(caplog, monkeypatch, tmp_path):
    from kiln.domain.planning.moe_tuning import CONFIG_FOLDER

    folder = tmp_path / CONFIG_FOLDER
    folder.mkdir(parents=True)
    (folder / "E=16,N=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json").write_text("{}")
    said = _warnings(caplog, monkeypatch, tmp_path)
    assert len(said) == 1
    assert said[0].startswith("deepseek-v32-mtp-2node: no tuned fused-MoE config in vllm 0.34.0 for 16 experts")
    (folder / "E=16,N=2048,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128,128].json").write_text(
        "{}"
    )
    caplog.clear()
    assert _warnings(caplog, monkeypatch, tmp_path) == []
    caplog.clear()
    assert _warnings(caplog, monkeypatch, None) == [
        "deepseek-v32-mtp-2node: MoE tuning not checked (vllm 0.34.0's CUDA sources not cached)"
    ]
