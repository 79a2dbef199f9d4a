"""The accelerators `kiln plan` knows: memory as the device reports it, with where that
number was read.

Capacities are nvidia-smi's `memory.total` (MiB), what the CUDA driver exposes; vLLM
sizes everything from torch's view of the same memory (`torch.cuda.mem_get_info`), which
is ~0.5 GiB less (the driver's own reservation), counted in the plan's engine reserve.
"""

from __future__ import annotations

from dataclasses import dataclass

_MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class Accelerator:
    """A GPU model the planner knows: its name, label, memory and where that figure comes from."""

    name: str
    label: str
    memory_bytes: int
    source: str

    @property
    def memory_gib(self) -> float:
        """The accelerator's memory in GiB."""
        return self.memory_bytes / GIB


def _mib(mebibytes: int) -> int:
    return mebibytes * _MIB


ACCELERATORS: dict[str, Accelerator] = {
    a.name: a
    for a in (
        Accelerator(
            "h100",
            "NVIDIA H100 80GB HBM3 (SXM)",
            _mib(81559),
            "nvidia-smi on H100 80GB HBM3: 81559MiB total (e.g. vLLM and NCCL issue logs)",
        ),
        Accelerator("h200", "NVIDIA H200 141GB HBM3e", _mib(143771), "nvidia-smi on H200: 143771MiB total"),
        Accelerator(
            "b200", "NVIDIA B200 180GB HBM3e", _mib(183359), "nvidia-smi on B200 (driver 570): 183359MiB total"
        ),
        Accelerator(
            "gb200",
            "NVIDIA GB200 (one Blackwell GPU of the superchip)",
            _mib(189471),
            "nvidia-smi on GB200: 189471MiB total per GPU",
        ),
        Accelerator(
            "a100",
            "NVIDIA A100-SXM4-80GB",
            85_056_798_720,
            "torch.cuda.get_device_properties(0).total_memory on A100-SXM4-80GB: 85,056,798,720 bytes",
        ),
        Accelerator("l40s", "NVIDIA L40S 48GB", _mib(46068), "nvidia-smi on L40S (driver 580): 46068MiB total"),
    )
}

NAMES = tuple(ACCELERATORS)
