"""Device time of mark_dead under each truncation policy, 1-1024 requests.

CUDA-graph replay of one mark_dead launch (median of 5 x 200 replays), fixed
``tau`` rule vs the cost-aware rule (which also chooses tau on the device), K =
4 and 8 drafts; goal: the cost-aware launch <= 5 us at 512 requests on an H200.

Usage: python benchmarks/draft_trunc/bench_policy.py [--out results.json]
"""

from __future__ import annotations

import argparse
import functools
import json

import numpy as np
import torch
from kiln_testkit.dt_batches import random_batch
from kiln_testkit.gpubench import timed_graph, write_result

SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
GOAL_US = 5.0


def time_policy(dtm, policy: str, num_reqs: int, k: int) -> dict:
    env = {"KILN_DRAFT_TRUNC": "1", "KILN_DRAFT_TRUNC_POLICY": policy}
    if policy == "tau":
        env["KILN_DRAFT_TRUNC_TAU"] = "0.3"
    dtm.reload(env)
    b = random_batch(np.random.default_rng(num_reqs), num_reqs, k, mixed=False).to("cuda")
    dtm.prepare(b.predictions.shape[0], "cuda", b.is_padding.shape[0])
    call = functools.partial(b.mark_dead, dtm)
    call()  # compile outside the capture
    torch.cuda.synchronize()
    graph_us = timed_graph(call, iters=200) * 1e6
    return {
        "policy": policy,
        "requests": num_reqs,
        "k": k,
        "graph_us": graph_us,
        "tau_chosen": float(dtm.snapshot().buffers.tau.item()),
    }


def time_launch_shapes(dtm, num_reqs: int, k: int) -> list[dict]:
    """The cost-aware launch at other num_warps."""
    from kiln_engine.draft_trunc._kernels.kernel import launch_mark_dead

    dtm.reload({"KILN_DRAFT_TRUNC": "1", "KILN_DRAFT_TRUNC_POLICY": "cost"})
    b = random_batch(np.random.default_rng(num_reqs), num_reqs, k, mixed=False).to("cuda")
    dtm.prepare(b.predictions.shape[0], "cuda", b.is_padding.shape[0], num_spec=k)
    st = dtm.snapshot()
    out = []
    for warps in (1, 2, 4, 8, 16):
        call = functools.partial(
            launch_mark_dead,
            b.mark_inputs(),
            st.buffers,
            num_reqs,
            0.0,
            1,
            0.05,
            cost=st.cost,
            num_warps=warps,
            calibration=st.calibration,
        )
        call()
        torch.cuda.synchronize()
        us = timed_graph(call, iters=200) * 1e6
        out.append({"requests": num_reqs, "k": k, "num_warps": warps, "graph_us": us})
        print(json.dumps(out[-1]), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="draft-trunc-policy-bench.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to benchmark")
        return
    import kiln_engine.draft_trunc as dtm

    rows = []
    for k in (4, 8):
        for policy in ("tau", "cost"):
            for num_reqs in SIZES:
                rows.append(time_policy(dtm, policy, num_reqs, k))
                print(json.dumps(rows[-1]), flush=True)
    at512 = {(r["policy"], r["k"]): r["graph_us"] for r in rows if r["requests"] == 512}
    for (policy, k), us in sorted(at512.items()):
        print(
            f"{policy:>4} K={k}: {us:.2f} us at 512 requests (goal <= {GOAL_US} us: "
            f"{'met' if us <= GOAL_US else 'MISSED'}); "
            f"ratio to tau rule {us / at512[('tau', k)]:.2f}x"
        )
    shapes = [row for k in (4, 8) for n in (128, 512, 1024) for row in time_launch_shapes(dtm, n, k)]
    write_result(args.out, rows=rows, launch_shapes=shapes)


if __name__ == "__main__":
    main()
