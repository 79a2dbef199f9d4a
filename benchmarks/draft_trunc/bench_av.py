"""What kiln-av's hook costs on one GPU, for R requests x K = 4 drafts,
as the runner calls it with KILN_DRAFT_TRUNC_AV_CALIBRATE=1 (once per step, after
drafting, launched eagerly: it is outside the CUDA graphs), against the verify step
it rides on. Variants:

- eager: ``_av.corrected_confidences``, the torch reference (~30 small kernels);
- compiled: the same fused by ``torch.compile`` (what compiling the hook would buy);
- fused: the engine's Triton kernel (``_kernels.av.launch_av``), one launch;
- hook: ``av_confidences`` end to end as the engine runs it (the fused kernel, the
  knob checks, the statistics' device sums with KILN_DRAFT_TRUNC_LOG_INTERVAL=1000);
- hook_timed: the same with KILN_DRAFT_TRUNC_AV_TIMING=1 (CUDA events and the host
  clock around each call): what reading the hook's time in a served engine costs.

Per variant: GPU time (CUDA events around one call: mostly launch gaps for eager),
host time (wall clock per call over many calls, then one synchronize: what the
runner's thread spends issuing it) and the larger of the two over the step it is
compared with, one GLM-5.3-like verify step per GPU at TP 8 as ``fit_draft.py`` prices
it from the 2026-12-05 H200 measurement (an eager kindling drafting position's time /
its share of the step); ``sim_adaptive.py`` prices kiln-av with that share. Also
checked on the device: the fused kernel's output against the eager one, element by
element (``fused_unequal``, ``fused_max_abs_diff``).

Needs torch and triton and the engine package only (no vLLM, no kiln):
    PYTHONPATH=engine python3 benchmarks/draft_trunc/bench_av.py --out-dir DIR
writes DIR/results-av-hook.json and prints the ratios between the variants.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
import triton
from kiln_engine import draft_trunc
from kiln_engine.draft_trunc import _av, _cost
from kiln_engine.draft_trunc._kernels.av import launch_av

HERE = Path(__file__).resolve().parent
SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
K = 4
ROWS = 512  # the speculator's buffer: max_num_reqs rows, the batch first
VARIANTS = ("eager", "compiled", "fused", "hook", "hook_timed")


def verify_step_us() -> dict[int, float]:
    """Per-GPU verify step at TP 8 by batch size, from the committed measurement and fit."""
    measured = json.loads((HERE / "results-2026-12-05-h200-draft-cost.json").read_text())
    fit = json.loads((HERE / "results-draft-fit.json").read_text())
    points = fit["drafters"]["kindling-0.6b-eager-tp8"]["points"]
    eager = {row["requests"]: row["decode_eager_us"] for row in measured["draft"] if row["model"] == "kindling-0.6b"}
    return {r: eager[r] / points[str(r)][0] for r in SIZES if r in eager and str(r) in points}


def gpu_us(fn: Callable[[], object], iters: int = 200) -> float:
    """Median microseconds per call on the GPU (CUDA events around each call)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return float(sorted(times)[len(times) // 2])


def host_us(fn: Callable[[], object], calls: int = 2000) -> float:
    """Microseconds of the host's time per call, issuing without waiting."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    issued = time.perf_counter() - start
    torch.cuda.synchronize()
    return issued / calls * 1e6


def engine_hook(hits: torch.Tensor, counts: torch.Tensor, timing: bool) -> Callable[..., torch.Tensor]:
    """``av_confidences`` with the engine's state as a served kiln-av leaves it: on, its
    statistics flushing every 1000 steps, never stepping aside, this calibration."""
    env = {
        "KILN_DRAFT_TRUNC": "1",
        "KILN_DRAFT_TRUNC_WITH_AV": "1",
        "KILN_DRAFT_TRUNC_AV_CALIBRATE": "1",
        "KILN_DRAFT_TRUNC_AV_MIN_BATCH": "0",
        "KILN_DRAFT_TRUNC_LOG_INTERVAL": "1000",
        "KILN_DRAFT_TRUNC_AV_TIMING": str(int(timing)),
    }
    draft_trunc.reload(env)
    draft_trunc.prepare(ROWS, "cuda", max_num_tokens=ROWS * (1 + K), num_spec=K)
    cal = draft_trunc.snapshot().calibration
    cal.hits.copy_(hits)
    cal.counts.copy_(counts)
    return draft_trunc.av_confidences


def measure(
    r: int,
    conf: torch.Tensor,
    hits: torch.Tensor,
    counts: torch.Tensor,
    compiled: Callable[..., torch.Tensor],
    step: dict[int, float],
) -> dict[str, float | int | None]:
    """Every variant at R = r requests, and the fused kernel's output against the eager one."""
    out = torch.empty_like(conf)
    fns: dict[str, Callable[[], torch.Tensor]] = {
        "eager": lambda: _av.corrected_confidences(conf, r, hits, counts),
        "compiled": lambda: compiled(conf, r, hits, counts),
        "fused": lambda: launch_av(conf, r, hits, counts, _av.AV_PRIOR, out),
        "hook": lambda: draft_trunc.av_confidences(conf, r),
        "hook_timed": lambda: draft_trunc.av_confidences(conf, r),
    }
    row: dict[str, float | int | None] = {"requests": r, "verify_step_us": step.get(r)}
    for name, fn in fns.items():
        if name.startswith("hook"):  # the two differ in a knob: each its own engine state
            engine_hook(hits, counts, timing=name == "hook_timed")
        row[f"{name}_gpu_us"] = gpu = gpu_us(fn)
        row[f"{name}_host_us"] = host = host_us(fn)
        row[f"{name}_share_of_step"] = max(gpu, host) / step[r] if r in step else float("nan")
    eager, fused, hooked = fns["eager"](), fns["fused"](), fns["hook_timed"]()
    torch.cuda.synchronize()
    if hooked is conf or not torch.equal(hooked, fused):  # a no-op hook would time nothing
        raise SystemExit(f"R={r}: av_confidences did not run the fused kernel; check the knobs")
    row["fused_unequal"] = int(((eager != fused) & ~(eager.isnan() & fused.isnan())).sum())
    row["fused_max_abs_diff"] = float((eager - fused).abs().nan_to_num().max())
    return row


def report(rows: list[dict]) -> None:
    for row in rows:
        cost = {v: max(row[f"{v}_gpu_us"], row[f"{v}_host_us"]) for v in VARIANTS}
        print(
            f"R={row['requests']:<4} "
            + " ".join(f"{v} {cost[v]:6.1f}" for v in VARIANTS)
            + f" us | eager/fused {cost['eager'] / cost['fused']:5.1f}x compiled/fused "
            f"{cost['compiled'] / cost['fused']:4.1f}x hook/fused {cost['hook'] / cost['fused']:4.2f}x "
            f"timed/hook {cost['hook_timed'] / cost['hook']:4.2f}x | hook/step "
            + " ".join(f"{v} {row[f'{v}_share_of_step']:.4f}" for v in VARIANTS)
            + f" | fused vs eager: {row['fused_unequal']} unequal, max diff {row['fused_max_abs_diff']:.2e}",
            flush=True,
        )
    for name in VARIANTS:
        worst = max(rows, key=lambda row: row[f"{name}_share_of_step"])
        print(
            f"summary ({name}): at most {worst[f'{name}_share_of_step']:.2%} of a TP-8 verify step "
            f"(R={worst['requests']})"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", type=Path, default=HERE)
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    cells = K * _cost.TAU_GRID + 1
    counts = torch.randint(0, 4096, (cells,), device=dev, generator=gen).float()
    hits = (counts * torch.rand(cells, device=dev, generator=gen)).floor()
    step = verify_step_us()
    compiled = torch.compile(_av.corrected_confidences, dynamic=True)
    rows = []
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / "results-av-hook.json"
    for r in SIZES:  # written after every size: a device call cut short keeps what it measured
        conf = torch.rand(ROWS, K, device=dev, generator=gen)
        rows.append(measure(r, conf, hits, counts, compiled, step))
        write(out, rows, complete=r == SIZES[-1])
        print(f"R={r}: measured", flush=True)
    draft_trunc.reload({})
    report(rows)
    print(f"wrote {out}")
    return 0


def write(out: Path, rows: list[dict], complete: bool) -> None:
    document = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "drafts_k": K,
        "variants": list(VARIANTS),
        "complete": complete,
        "rows": rows,
    }
    out.write_text(json.dumps(document, indent=1))


if __name__ == "__main__":
    raise SystemExit(main())
