"""Whether a recipe's fused-MoE shape has a tuned kernel config in its pinned vLLM.

vLLM's Triton fused-MoE kernel reads its tile sizes from
`vllm/model_executor/layers/fused_moe/configs/E=<experts>,N=<width>,device_name=<GPU>
[,dtype=<dtype>][,block_shape=[n,k]].json`: the experts and expert width one rank holds,
the GPU's name as torch reports it, and the weights' quantization. Where no file matches,
vLLM logs `Using default MoE config` and runs untuned tiles (the scale twin saw it for
GLM-5.3's TP-8 rank on an H100). `kiln check` says so in one line; it does not fail.

Pure arithmetic over the model's shape and topology; the file names come from the
engine's unpacked sources, read by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.domain.planning.model_config import ModelShape

# the accelerator names kiln knows -> the device name vLLM's file names carry
# (torch.cuda.get_device_name with spaces as underscores; any H200 variant reads as NVIDIA_H200)
_DEVICE_FILE_NAMES = {
    "h100": "NVIDIA_H100_80GB_HBM3",
    "h200": "NVIDIA_H200",
    "b200": "NVIDIA_B200",
    "gb200": "NVIDIA_GB200",
    "a100": "NVIDIA_A100-SXM4-80GB",
    "l40s": "NVIDIA_L40S",
}
CONFIG_FOLDER = "vllm/model_executor/layers/fused_moe/configs"


@dataclass(frozen=True)
class _MoeKernelShape:
    """What vLLM looks a tuned fused-MoE config up by, for one rank."""

    experts: int
    width: int
    device: str
    dtype: str  # "" for bf16/fp16 weights
    block: tuple[int, int] | None

    @property
    def file_name(self) -> str:
        """The config file vLLM would read for this shape."""
        dtype = f",dtype={self.dtype}" if self.dtype else ""
        block = f",block_shape=[{self.block[0]},{self.block[1]}]" if self.block else ""
        return f"E={self.experts},N={self.width},device_name={self.device}{dtype}{block}.json"


def kernel_shape(
    shape: ModelShape, *, tensor_parallel: int, data_parallel: int, expert_parallel: bool, accelerator: str
) -> _MoeKernelShape | None:
    """The rank's fused-MoE lookup key; None where vLLM's tuned Triton configs do not apply
    (a dense model, MXFP4 experts, or a GPU kiln has no file name for)."""
    device = _DEVICE_FILE_NAMES.get(accelerator)
    if not shape.experts or shape.quant == "mxfp4" or device is None:
        return None
    if expert_parallel:
        experts, width = shape.experts // (tensor_parallel * data_parallel), shape.expert_intermediate
    else:
        experts, width = shape.experts, shape.expert_intermediate // tensor_parallel
    if shape.quant == "fp8":
        block = shape.fp8_block if all(shape.fp8_block) else None
        return _MoeKernelShape(experts, width, device, "fp8_w8a8", block)
    return _MoeKernelShape(experts, width, device, "", None)


def untuned_line(key: _MoeKernelShape, shipped: frozenset[str], engine: str) -> str | None:
    """One line when vLLM `engine` ships no tuned config for `key`, else None."""
    if key.file_name in shipped:
        return None
    return (
        f"no tuned fused-MoE config in vllm {engine} for {key.experts} experts of width {key.width} "
        f"on {key.device}{' ' + key.dtype if key.dtype else ' bf16'}: vLLM runs its default tiles "
        f"({CONFIG_FOLDER}/{key.file_name} is missing)"
    )
