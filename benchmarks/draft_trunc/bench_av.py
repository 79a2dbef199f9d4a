"""What kiln-av's hook costs on one GPU (issue 37): ``draft_trunc._av.corrected_confidences``
for R requests x K = 4 drafts, as the runner calls it with
KILN_DRAFT_TRUNC_AV_CALIBRATE=1 (once per step, after drafting, launched eagerly: it is
outside the CUDA graphs), against the verify step it rides on.

- GPU time: CUDA events around one call (a span of ~15 small kernels, so it is mostly
  launch gaps);
- host time: wall clock per call over many calls, then one synchronize (what the
  runner's thread spends issuing it);
- the step it is compared with: one GLM-5.3-like verify step per GPU at TP 8, as
  ``fit_draft.py`` prices it from the 2026-12-05 H200 measurement (an eager kindling
  drafting position's time / its share of the step).

Usage: python benchmarks/draft_trunc/bench_av.py [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from kiln_engine.draft_trunc import _av, _cost
from kiln_testkit.gpubench import timed_eager, write_result

HERE = Path(__file__).resolve().parent
SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
K = 4


def verify_step_us() -> dict[int, float]:
    """Per-GPU verify step at TP 8 by batch size, from the committed measurement and fit."""
    measured = json.loads((HERE / "results-2026-12-05-h200-draft-cost.json").read_text())
    fit = json.loads((HERE / "results-draft-fit.json").read_text())
    points = fit["drafters"]["kindling-0.6b-eager-tp8"]["points"]
    eager = {row["requests"]: row["decode_eager_us"] for row in measured["draft"]
             if row["model"] == "kindling-0.6b"}
    return {r: eager[r] / points[str(r)][0] for r in SIZES if r in eager and str(r) in points}


def host_us(fn, calls: int = 2000) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    issued = time.perf_counter() - start
    torch.cuda.synchronize()
    return issued / calls * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE / "results-av-hook.json")
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    cells = K * _cost.TAU_GRID + 1
    counts = torch.randint(0, 4096, (cells,), device=dev, generator=gen).float()
    hits = (counts * torch.rand(cells, device=dev, generator=gen)).floor()
    step = verify_step_us()
    # the same arithmetic fused by torch.compile (one or two kernels instead of ~30
    # launches), for comparison: what compiling the hook would buy
    fused = torch.compile(_av.corrected_confidences, dynamic=True)
    rows = []
    for r in SIZES:
        conf = torch.rand(512, K, device=dev, generator=gen)
        row: dict[str, float | int | None] = {"requests": r, "verify_step_us": step.get(r)}
        for name, fn in (("eager", _av.corrected_confidences), ("compiled", fused)):

            def call(conf=conf, r=r, fn=fn):
                return fn(conf, r, hits, counts)

            row[f"{name}_gpu_us"] = gpu = timed_eager(call, iters=200) * 1e6
            row[f"{name}_host_us"] = host = host_us(call)
            row[f"{name}_share_of_step"] = max(gpu, host) / step[r] if r in step else float("nan")
        rows.append(row)
        print(f"R={r:<4} eager gpu {row['eager_gpu_us']:6.1f} host {row['eager_host_us']:6.1f} us | "
              f"compiled gpu {row['compiled_gpu_us']:6.1f} host {row['compiled_host_us']:6.1f} us | "
              f"verify step {step.get(r, float('nan')):8.0f} us | hook/step eager "
              f"{row['eager_share_of_step']:.4f} compiled {row['compiled_share_of_step']:.4f}", flush=True)
    write_result(args.out, drafts_k=K, rows=rows)
    for name in ("eager", "compiled"):
        worst = max(rows, key=lambda row: row[f"{name}_share_of_step"])
        print(f"summary ({name}): the hook costs at most {worst[f'{name}_share_of_step']:.2%} of a TP-8 "
              f"verify step (R={worst['requests']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
