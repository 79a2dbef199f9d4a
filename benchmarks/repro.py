#!/usr/bin/env python3
"""`nox -s repro`: build the base, engine-cpu, tiny-moe and tiny-kindling twice, with
kiln's images of them and the layer cache out of the way in between (`--force
--force-engine --no-cache`, the first round's images untagged from kiln's names), and
print both image ids and one same/different line per layer.

Everything is tagged in its own local namespace ($KILN_IMAGE_NAMESPACE, default
`kilnrepro`), so the images other people on a shared daemon use are never touched; the
namespace changes tags only, not ids. The first round's images are kept under
`<ns>-round1/...` until the end, so that a difference can be shown file by file (the
second round cannot reuse them: no layer cache, and no kiln tag points at them).
Exit status 1 when any id differs. `-- --json FILE` also writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from kiln.domain.reproducible import image_diff
from kiln.infra import records
from kiln.infra.docker import DockerDaemon

RECIPES = ("tiny-moe", "tiny-kindling")
# `-- --cuda`: the CUDA engine instead (a second build_cuda run must give the same
# digest), through its thinnest recipe; amd64 only (arm64 would run nvcc-free but hours
# of pip under qemu on this 2-core host)
CUDA_RECIPE = "glm53-kindling"


def kiln(*args: str) -> float:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "kiln", *args], env=os.environ.copy(), check=False)
    if proc.returncode != 0:
        sys.exit(f"repro: kiln {' '.join(args)} failed ({proc.returncode})")
    return time.monotonic() - t0


def refs(ns: str, cuda: bool = False) -> dict[str, str]:
    from kiln.domain.images.definitions import resolve

    if cuda:
        kindling = resolve(CUDA_RECIPE)
        return {
            "base": f"{ns}/base:bookworm",
            "engine-cuda": kindling.engine_image.tag,
            CUDA_RECIPE: kindling.recipe_image.tag,
        }
    moe = resolve("tiny-moe")
    out = {"base": f"{ns}/base:bookworm", "engine-cpu": moe.engine_image.tag}
    for name in RECIPES:
        out[name] = resolve(name).recipe_image.tag
    return out


def remove_namespace(docker: DockerDaemon, ns: str) -> None:
    for img in docker.client.images.list():
        for tag in img.tags:
            if tag.startswith(f"{ns}/"):
                docker.client.images.remove(tag, noprune=False)


def one_round(docker: DockerDaemon, ns: str, cuda: bool = False) -> dict:
    remove_namespace(docker, ns)
    times = {"base": kiln("base", "build", "--force")}
    if cuda:
        times[f"engine-cuda+{CUDA_RECIPE}"] = kiln(
            "build", CUDA_RECIPE, "--platform", "linux/amd64", "--force", "--force-engine", "--no-cache"
        )
    else:
        times["engine-cpu+tiny-moe"] = kiln("build", "tiny-moe", "--force", "--force-engine", "--no-cache")
        times["tiny-kindling"] = kiln("build", "tiny-kindling", "--force", "--no-cache")
    out = {}
    for what, ref in refs(ns, cuda).items():
        img = docker.require_image(ref)
        recs = records.build_records(img.id)
        out[what] = {
            "id": img.id,
            "layers": img.attrs["RootFS"]["Layers"],
            "normalise_s": recs[-1]["normalise_seconds"] if recs else None,
            "build_s": recs[-1]["build_seconds"] if recs else None,
        }
    out["times"] = times
    # what the builder made before normalising (ours: their ids are in the build records)
    # goes now: the disk holds both rounds' images, the builds' own copies need not stay
    for what in out:
        if what == "times":
            continue
        for rec in records.build_records(out[what]["id"]):
            try:
                docker.client.images.remove(rec["built_id"], noprune=False)
            except Exception as exc:  # already gone, or still a parent: not worth failing for  # noqa: BLE001
                print(f"repro: kept {rec['built_id'][:19]} ({str(exc)[:80]})")
    # after the builds' own images went (so only what no record names is left dangling):
    # the CUDA builder stage alone is ~16 GB, two rounds of it do not fit beside the images
    if cuda:
        for img in docker.client.images.list(filters={"dangling": True}):
            if img.attrs.get("Size", 0) > 4e9:
                print(f"repro: removing the builder stage {img.id[:19]} ({img.attrs['Size'] / 1e9:.1f} GB)")
                docker.client.images.remove(img.id, noprune=False)
    return out


def _comparable(attrs: dict) -> dict:
    return {k: attrs.get(k) for k in ("Created", "Config", "Architecture", "Os", "Author", "Comment")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument(
        "--first-from-tags",
        action="store_true",
        help="take the first round's ids from <ns>-round1/<what>:round1 tags (an earlier run's); "
        "an image without one is built a second time after the round instead",
    )
    ap.add_argument(
        "--cuda",
        action="store_true",
        help=f"base, engine-cuda and {CUDA_RECIPE} (amd64) instead of the CPU images (~4 GB download "
        "per round, ~30 GB of disk)",
    )
    args = ap.parse_args()
    cuda = args.cuda
    ns = os.environ.setdefault("KILN_IMAGE_NAMESPACE", "kilnrepro")
    keep = f"{ns}-round1"
    docker = DockerDaemon()
    t0 = time.monotonic()
    if args.first_from_tags:
        first = {"times": {}}
        for what in refs(ns, cuda):
            img = docker.image(f"{keep}/{what}:round1")
            if img is not None:
                first[what] = {
                    "id": img.id,
                    "layers": img.attrs["RootFS"]["Layers"],
                    "normalise_s": None,
                    "build_s": None,
                }
    else:
        first = one_round(docker, ns, cuda)
        for what in refs(ns, cuda):
            docker.tag(first[what]["id"], f"{keep}/{what}:round1")
    second = one_round(docker, ns, cuda)
    for what in () if cuda else RECIPES:
        if what not in first:  # built once in this round: build it again (layer cache off)
            first, second = second, dict(second)
            docker.tag(first[what]["id"], f"{keep}/{what}:round1")
            docker.remove_image(refs(ns)[what])
            t = kiln("build", what, "--force", "--no-cache")
            img = docker.require_image(refs(ns)[what])
            recs = records.build_records(img.id)
            second[what] = {
                "id": img.id,
                "layers": img.attrs["RootFS"]["Layers"],
                "normalise_s": recs[-1]["normalise_seconds"] if recs else None,
                "build_s": recs[-1]["build_seconds"] if recs else None,
            }
            second["times"] = {**second["times"], f"{what} again": t}
    ok = True
    for what in refs(ns, cuda):
        a, b = first[what], second[what]
        same = a["id"] == b["id"]
        ok &= same
        print(
            f"{what}: {a['id']}  {b['id']}  {'SAME' if same else 'DIFFERENT'}"
            f"  (normalise {a['normalise_s']} s / {b['normalise_s']} s)"
        )
        for i, (la, lb) in enumerate(zip(a["layers"], b["layers"], strict=False)):
            print(f"  layer {i + 1:2d} {la[:19]} {lb[:19]} {'same' if la == lb else 'DIFFERENT'}")
        if len(a["layers"]) != len(b["layers"]):
            print(f"  layer count {len(a['layers'])} vs {len(b['layers'])}: DIFFERENT")
        if not same:
            diff = image_diff.compare(
                a["layers"],
                b["layers"],
                _comparable(docker.require_image(a["id"]).attrs),
                _comparable(docker.require_image(b["id"]).attrs),
                lambda i=a["id"]: docker.save(i),
                lambda i=b["id"]: docker.save(i),
            )
            print(f"  first difference: {diff.line() if diff else 'none found'}")
    print(f"round times: {json.dumps(first['times'])} / {json.dumps(second['times'])}")
    print(f"repro: {'all ids equal' if ok else 'ids differ'} ({time.monotonic() - t0:.0f} s)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"first": first, "second": second, "same": ok}, fh, indent=1)
    remove_namespace(docker, keep)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
