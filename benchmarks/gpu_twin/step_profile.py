"""One configuration's decode steps under torch's profiler, reduced to what a step costs:
every GPU kernel (graph-replayed ones included: CUPTI records each node), every host
copy and every host sync, per step, by name (scale_runner.py --profile).

The server runs with `--profiler-config` (torch profiler, CPU and CUDA activity, no
stacks, plain JSON); `profile` starts it over /start_profile, keeps one request decoding
for a few seconds, stops it, and reads the worker's Chrome trace. Comparing two of these
(`spec` and `dt-cost` at one request) lists what draft-trunc adds to a step.
Standard library only.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path

# host-side calls that wait for the GPU, and the copies that cross to the host
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
COPIES = ("Memcpy DtoH", "Memcpy HtoD", "Memcpy DtoD")
# launches: a step the CUDA graph covers is one cudaGraphLaunch, an eager one many kernels
LAUNCHES = ("cudaGraphLaunch", "cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")


def profiler_flags(folder: Path) -> list[str]:
    """The `vllm serve` flags that make /start_profile write a worker trace to `folder`."""
    config = {
        "profiler": "torch",
        "torch_profiler_dir": str(folder),
        "torch_profiler_with_stack": False,
        "torch_profiler_use_gzip": False,
        "ignore_frontend": True,
    }
    return ["--profiler-config", json.dumps(config, separators=(",", ":"))]


def _post(url: str, path: str) -> None:
    request = urllib.request.Request(f"{url}{path}", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=300) as resp:
        resp.read()


def summarise(trace: dict, steps: float) -> dict:
    """Kernels, copies, syncs and launches of a Chrome trace, each with its count and
    microseconds per step; `steps` is how many decode steps the trace covers."""
    kernels: dict[str, list[float]] = {}
    copies: dict[str, list[float]] = {}
    syncs: dict[str, list[float]] = {}
    launches: dict[str, list[float]] = {}
    for event in trace.get("traceEvents", []):
        name, cat, dur = event.get("name", ""), event.get("cat", ""), float(event.get("dur", 0.0))
        if cat == "kernel":
            table = kernels
        elif cat in ("gpu_memcpy", "gpu_memset") or name.startswith(COPIES):
            table = copies
        elif cat in ("cuda_runtime", "cuda_driver") and name.startswith(SYNCS):
            table = syncs
        elif cat in ("cuda_runtime", "cuda_driver") and name in LAUNCHES:
            table = launches
        else:
            continue
        entry = table.setdefault(name[:160], [0.0, 0.0])
        entry[0] += 1
        entry[1] += dur
    per = max(steps, 1.0)

    def per_step(table: dict[str, list[float]]) -> dict[str, dict[str, float]]:
        ranked = sorted(table.items(), key=lambda item: -item[1][1])
        return {name: {"per_step": round(n / per, 3), "us_per_step": round(us / per, 2)} for name, (n, us) in ranked}

    gpu_us = sum(us for _, us in kernels.values()) / per
    return {
        "steps": steps,
        "gpu_us_per_step": round(gpu_us, 1),
        "kernels": per_step(kernels),
        "copies": per_step(copies),
        "syncs": per_step(syncs),
        "launches": per_step(launches),
    }


def profile(url: str, folder: Path, seconds: float, request, steps_of) -> dict:
    """Profile `seconds` of one request decoding: `request()` sends it (in a thread),
    `steps_of()` reads how many decode steps the server has made so far."""
    folder.mkdir(parents=True, exist_ok=True)
    done = threading.Event()
    worker = threading.Thread(target=lambda: (request(), done.set()), daemon=True)
    worker.start()
    time.sleep(2.0)  # past the prefill
    before = steps_of()
    _post(url, "/start_profile")
    time.sleep(seconds)
    _post(url, "/stop_profile")
    steps = steps_of() - before
    worker.join(timeout=300)
    traces = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_size)
    if not traces:
        return {"error": f"no trace in {folder}"}
    return summarise(json.loads(traces[-1].read_text()), steps)
