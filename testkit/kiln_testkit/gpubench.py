"""Timing on a CUDA device, and the header every GPU benchmark result starts with
(benchmarks/draft_trunc/bench_moe.py, bench_policy.py)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def timed_graph(fn: Callable[[], object], iters: int = 20, reps: int = 5) -> float:
    """Median seconds per call of ``fn``, replayed from a CUDA graph."""
    s = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # torch leaves Stream() unannotated
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # unannotated in torch
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # unannotated in torch
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / iters)
    return float(sorted(times)[len(times) // 2])


def timed_eager(fn: Callable[[], object], iters: int = 10) -> float:
    """Median seconds per call of ``fn`` launched eagerly (CUDA events)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # unannotated in torch
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # unannotated in torch
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return float(sorted(times)[len(times) // 2])


def write_result(path: Path | str, **fields: Any) -> None:
    """The result JSON: when, on what device, with which torch and triton, then ``fields``."""
    import triton

    result = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        **fields,
    }
    Path(path).write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")
