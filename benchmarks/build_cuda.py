"""`nox -s build_cuda`: build engine-cuda, glm53-kindling and the plain `pip install vllm`
anchor here (no GPU needed), prove inside the image that what kiln removed is not needed,
and record sizes side by side in docs/build-cuda.json and docs/build-cuda.md.

Opt-in: the first run downloads ~4 GB from PyPI, once for both images (the two
Dockerfiles share their `wheels` stage, so the layer cache serves the second build).
Steps, each reported as it runs:
  1. build kiln/engine-cuda (and glm53-kindling on it) with kiln's own builder;
  2. build the plain anchor (docker-images/engine-cuda/plain.Dockerfile) on the same base;
  3. sizes side by side, ratio against the goal (kiln <= 0.8 x plain), `du` per package;
  4. checks in the recipe image (imports, patched runner, launch args against 0.33.0's
     own parser with a negative control, probed torch/CUDA/NCCL labels);
  5. the proofs (tests/cuda/test_image_proofs.py, run by pytest in a subprocess).
Exit status 1 if any check or proof fails; the ratio against the goal is reported, not
enforced (the recipe's budgets.max_image_size_gb guards size regressions). The documents
are written either way.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time

from kiln_testkit.scripts import load_script
from kiln_testkit.tree import REPO

from kiln.basics import log
from kiln.basics.errors import KilnError
from kiln.domain.images.definitions import resolve
from kiln.domain.locks import engine_lock
from kiln.domain.recipes.resolved import resolve_recipe
from kiln.infra.docker import DockerDaemon
from kiln.usecases.build import build_engine, build_recipe

checks = load_script("benchmarks/build_cuda_checks.py")
plain = load_script("benchmarks/build_cuda_plain.py")
doc = load_script("benchmarks/build_cuda_doc.py")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="rebuild the images (layer cache still used)")
    ap.add_argument("--cold", action="store_true", help="rebuild without the layer cache (downloads again)")
    ap.add_argument("--no-proofs", action="store_true", help="skip the in-image proofs (minutes)")
    ap.add_argument("--render-only", action="store_true", help=f"re-render {doc.DOC.name} from {doc.DATA.name}")
    ap.add_argument(
        "--platform",
        choices=sorted(engine_lock.PLATFORMS),
        default="linux/amd64",
        help="build and check this platform's images (linux/arm64 on x86-64: under qemu where "
        "it must run; scripts/setup.sh --arm64 and kiln base build --platform linux/arm64 first)",
    )
    args = ap.parse_args()
    if args.render_only:
        doc.render(json.loads(doc.data_file(args.platform).read_text()), args.platform)
        return 0
    args.force = args.force or args.cold
    docker = DockerDaemon()
    resolved = resolve(checks.NAME, platform=args.platform)
    loaded, engine_image = resolved.loaded, resolved.engine_image
    run: dict = {
        "date": dt.date.today().isoformat(),  # the local date is the one a reader expects  # noqa: DTZ011
        "engine": loaded.recipe.engine.version,
        "base_image": engine_image.base_ref,
        "cold": args.cold,
        "cpus": os.cpu_count(),
        "platform": args.platform,
        "builder_platform": engine_image.builder_platform,
    }

    t0 = time.monotonic()
    engine = build_engine(docker, engine_image, force=args.force, nocache=args.cold)
    run["engine_build"] = {
        "tag": engine.tag,
        "image_id": engine.image_id,
        "size": engine.size,
        "seconds": round(time.monotonic() - t0),
        "skipped": engine.skipped,
        "cached_steps": f"{engine.cached_steps}/{engine.steps}",
    }
    log.ok(f"engine {engine.tag}: {plain.gb(engine.size):.2f} GB")

    plain_id, plain_tag, plain_s, plain_cache = plain.build_plain(
        docker, engine_image, nocache=args.cold, force=args.force
    )
    plain_size = docker.client.images.get(plain_id).attrs.get("Size", 0)
    run["plain_build"] = {
        "tag": plain_tag,
        "image_id": plain_id,
        "size": plain_size,
        "seconds": round(plain_s),
        "cached_steps": plain_cache,
    }
    log.ok(f"plain {plain_tag}: {plain.gb(plain_size):.2f} GB")

    recipe_id = None
    try:
        recipe = build_recipe(
            resolve_recipe(checks.NAME),
            docker=docker,
            force=args.force,
            quiet_summary=True,
            nocache=args.cold,
            platform=args.platform,
        )
        recipe_id = recipe.image_id
        run["recipe_build"] = {"tag": recipe.tag, "size": recipe.size, "skipped": recipe.skipped}
    except KilnError as exc:  # the engine and the anchor are still measured
        log.warn(f"{checks.NAME} did not build: {exc.message}")
        run["recipe_build"] = {"error": exc.message}

    ratio = engine.size / plain_size
    run["ratio"] = round(ratio, 3)
    run["goal_met"] = ratio <= doc.GOAL_RATIO
    (log.ok if run["goal_met"] else log.warn)(
        f"engine-cuda {plain.gb(engine.size):.2f} GB / plain {plain.gb(plain_size):.2f} GB = {ratio:.3f} x "
        f"(goal <= {doc.GOAL_RATIO})"
    )
    run["du_mb"] = {"kiln": checks.du(docker, engine.image_id), "plain": checks.du(docker, plain_id)}
    run["checks"] = checks.run_checks(docker, loaded, engine.image_id, recipe_id, args.platform)
    if not args.no_proofs:
        ok, proofs = checks.run_proofs(engine.image_id)
        run["proofs_ok"], run["proofs"] = ok, proofs
    run["wall_s"] = round(time.monotonic() - t0)
    data = doc.data_file(args.platform)
    data.write_text(json.dumps(run, indent=1, sort_keys=True) + "\n")
    doc.render(run, args.platform)
    log.summary(
        "build_cuda",
        {
            "engine-cuda": f"{plain.gb(engine.size):.2f} GB",
            "plain": f"{plain.gb(plain_size):.2f} GB",
            "ratio": f"{ratio:.3f} x (goal <= {doc.GOAL_RATIO}: {'met' if run['goal_met'] else 'NOT met'})",
            "checks": f"{sum(c['ok'] for c in run['checks'])}/{len(run['checks'])} ok",
            "proofs": "skipped" if args.no_proofs else ("ok" if run.get("proofs_ok") else "FAILED"),
            "written": f"{data.relative_to(REPO)}, {doc.DOC.relative_to(REPO)}",
        },
    )
    failed = not all(c["ok"] for c in run["checks"]) or (not args.no_proofs and not run.get("proofs_ok"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
