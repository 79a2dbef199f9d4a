#!/usr/bin/env python3
"""Record draft-trunc acceptance traces from a real tiny-kindling server.

Serve the built tiny-kindling image once, with draft-trunc on and tau = 0 (nothing is
cut, so every draft is verified and the outcomes are uncensored) and
KILN_DRAFT_TRUNC_TRACE pointing into the container's /tmp. Then, for each concurrency N
in turn, keep N requests in flight (64 tokens each; even requests greedy, odd ones
sampled at temperature 0.8 with a per-request seed) until the trace has grown by
--steps verify steps, and let the requests in flight finish. The trace is split at
those boundaries into OUT/tiny-kindling-c{N}.jsonl. Line format: see traces/README.md.

usage: record_traces.py [--concurrency 1 4 8] [--steps 2000] [--out DIR] [--dev]
--dev mounts this checkout's engine/kiln_engine and kiln-serve over the image's, to
record with engine code newer than the built image (the trace format is the same).
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

from kiln_testkit.tree import REPO

TRACE_IN_CONTAINER = "/tmp/kiln-draft-trunc-trace.jsonl"


MODELS: Path | None = None


def dev_mounts() -> list[tuple[str, str]]:
    mounts = [
        (str(REPO / "engine" / "kiln_engine"), "/opt/kiln/engine/kiln_engine"),
        (str(REPO / "docker-images" / "common" / "kiln-serve"), "/opt/kiln/bin/kiln-serve"),
    ]
    if MODELS is not None:
        mounts += [(str(MODELS / name), f"/models/{name}") for name in ("tiny-qwen3moe", "tiny-qwen3-draft")]
    return mounts


def trace_lines(box) -> int:
    code, out = box.exec(
        ["sh", "-c", f"if [ -f {TRACE_IN_CONTAINER} ]; then wc -l < {TRACE_IN_CONTAINER}; else echo 0; fi"]
    )
    return int(out.strip().splitlines()[-1]) if code == 0 and out.strip() else 0


def _phase(box, model: str, concurrency: int, until_lines: int, limit_s: float) -> int:
    """Keep `concurrency` requests in flight until the trace has `until_lines` lines (or
    the time limit), then let every request in flight finish: phases never overlap."""
    from kiln_testkit.twinserve import prompts, run_set

    t0 = time.monotonic()
    stop = threading.Event()
    done = {"tokens": 0}

    def client(worker: int) -> None:
        batch = 0
        while not stop.is_set():
            ps = prompts(4, seed=100_000 * concurrency + 1000 * worker + batch)
            batch += 1
            for i, p in enumerate(ps):
                if stop.is_set():
                    break
                greedy = i % 2 == 0
                res = run_set(
                    box.url,
                    model,
                    [p],
                    max_tokens=64,
                    temperature=0.0 if greedy else 0.8,
                    seeds=None if greedy else [worker * 100_003 + batch * 7 + i],
                )
                done["tokens"] += len(res[0].token_ids)

    workers = [threading.Thread(target=client, args=(w,), daemon=True) for w in range(concurrency)]
    for w in workers:
        w.start()
    have = trace_lines(box)
    while have < until_lines and time.monotonic() - t0 < limit_s:
        time.sleep(5)
        have = trace_lines(box)
        print(
            f"  c{concurrency}: {have}/{until_lines} trace lines, {done['tokens']} tokens, "
            f"{time.monotonic() - t0:.0f} s",
            flush=True,
        )
    stop.set()
    for w in workers:
        w.join(timeout=300)
    return trace_lines(box)


def record(
    docker, loaded, image_id, concurrencies: list[int], steps: int, out: Path, dev: bool, limit_s: float
) -> list[dict]:
    """One server, one phase per concurrency (in order); the trace is split at the phase
    boundaries, where no request is in flight."""
    from kiln_testkit.twinserve import serving

    env = {
        "KILN_DRAFT_TRUNC": "1",
        "KILN_DRAFT_TRUNC_TAU": "0",
        "KILN_DRAFT_TRUNC_TRACE": TRACE_IN_CONTAINER,
        "KILN_DRAFT_TRUNC_LOG_INTERVAL": "200",
    }
    model = loaded.recipe.launch.served_model_name
    bounds = []
    with serving(docker, loaded, image_id, env, mounts=dev_mounts() if dev else None) as box:
        start = trace_lines(box)
        for conc in concurrencies:
            t0 = time.monotonic()
            end = _phase(box, model, conc, start + steps, limit_s)
            bounds.append((conc, start, end, time.monotonic() - t0))
            start = end
        code, text = box.exec(["cat", TRACE_IN_CONTAINER])
        if code != 0:
            raise SystemExit(f"record_traces: cannot read the trace: {text[-300:]}")
    lines = text.splitlines()
    rows = []
    for conc, first, last, seconds in bounds:
        path = out.resolve() / f"tiny-kindling-c{conc}.jsonl"
        chunk = lines[first:last]
        path.write_text("\n".join(chunk) + "\n")
        shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        rows.append(
            {
                "concurrency": conc,
                "steps": len(chunk),
                "file": str(shown),
                "bytes": path.stat().st_size,
                "seconds": round(seconds, 1),
            }
        )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "draft_trunc" / "traces")
    p.add_argument("--limit-s", type=float, default=900, help="per concurrency")
    p.add_argument("--dev", action="store_true")
    p.add_argument("--models", type=Path, help="with --dev: a make_models.py output folder to serve instead")
    args = p.parse_args()
    global MODELS
    MODELS = args.models.resolve() if args.models else None
    from kiln.domain.images.definitions import require_built
    from kiln.infra.docker import DockerDaemon

    docker = DockerDaemon()
    built = require_built(docker, "tiny-kindling") if not args.dev else _any_built(docker)
    loaded, image = built.loaded, built.image
    args.out.mkdir(parents=True, exist_ok=True)
    rows = record(docker, loaded, image.id, args.concurrency, args.steps, args.out, args.dev, args.limit_s)
    print("\nrecorded:")
    for row in rows:
        print(
            f"  c{row['concurrency']}: {row['steps']} steps, {row['bytes'] / 1e3:.0f} kB, "
            f"{row['seconds']:.0f} s -> {row['file']}"
        )


def _any_built(docker):
    """--dev: the newest kiln/tiny-kindling image, whatever inputs it was built from."""
    from kiln.domain.images.definitions import BuiltRecipe, resolve

    resolved = resolve("tiny-kindling")
    image = docker.client.images.get("kiln/tiny-kindling:latest")
    return BuiltRecipe(resolved.loaded, resolved.recipe_image, image)


if __name__ == "__main__":
    main()
