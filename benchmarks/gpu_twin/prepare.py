#!/usr/bin/env python3
"""Make everything the lent GPU needs to serve a CUDA recipe's patched engine: `nox -s
gpu_twin -- RECIPE` (docs/draft-trunc.md, "The GPU twin").

The device has torch 2.11 and Triton, but no Docker, no vLLM and no network, and one
call carries at most 64 MiB (the checkout included). vLLM 0.33.0's two op libraries use
torch's stable ABI and load on that torch, so the twin is vLLM's own Python sources with
the recipe's series applied by kiln's applier, those two libraries from the pinned
wheel, kiln-engine, and the Python packages the device lacks (requirements/
gpu-twin.lock, hash-checked). This script packs them into one bundle, split into
`.gpu-twin/call-N/` folders that each fit one call beside the checkout, and writes the
plan the runner serves: the recipe's own `vllm serve` command for each configuration,
with every change the twin needs listed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

from kiln_testkit.scripts import load_script

from kiln.basics.paths import cache_dir
from kiln.domain.patching.series import (
    engine_root,
    feature_overlays,
    load_series,
    series_for,
)
from kiln.domain.recipes.resolved import resolve_recipe
from kiln.infra import wheel_cache
from kiln.inimage import patch_applier as applier
from kiln.inimage import patch_tree

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
OUT = ROOT / ".gpu-twin"
LOCK = ROOT / "requirements" / "gpu-twin.lock"
DEVICE_HAS = HERE / "device-packages.txt"
CALL_LIMIT = 64 * 2**20  # what one device call carries: the checkout plus the carried paths
MARGIN = 2 * 2**20  # files written between prepare and the call (results, notes)
# the op libraries the twin loads (stable ABI); FlashAttention's and the rest stay behind
OP_LIBRARIES = (
    "_C_stable_libtorch.abi3.so",
    "_moe_C_stable_libtorch.abi3.so",
    "cumem_allocator.abi3.so",
    "fs_io_C.abi3.so",
    "spinloop.abi3.so",
)
# deep_gemm's and fmha_sm100's sources (2,000 files) that Triton attention never imports;
# the rest of third_party stays (vLLM finds the GPU through third_party/pynvml.py)
SKIPPED_SOURCES = ("vllm/third_party/deep_gemm/", "vllm/third_party/fmha_sm100/")
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (5, 17, 24, 26, 27, 28, 31, 34, 35, 36, 38, 39)]


def _log(message: str) -> None:
    print(f"gpu-twin: {message}", flush=True)


def _sha256(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


# -- the parts ------------------------------------------------------------------------------
def _patched_sources(recipe: str, version: str, work: Path) -> Path:
    """vllm/ as the recipe's image installs it (engine series, then each feature's, then
    the twin's own series), plus vLLM's dist-info, as one tar.xz."""
    resolved = resolve_recipe(recipe)
    root, _ = engine_root(version, "cuda")
    tree_dir = work / "site"
    shutil.copytree(root, tree_dir, ignore=shutil.ignore_patterns(wheel_cache.MARKER))
    feature_series, replacements = feature_overlays(resolved, version)
    twin = HERE / "patches" / version / "series"
    if not twin.is_file():
        sys.exit(f"gpu-twin: no twin series for vllm {version}: {twin.relative_to(ROOT)} is missing")
    series = [series_for(version), *feature_series, load_series(twin, "gpu-twin")]
    tree = patch_tree.Tree(tree_dir)
    results = patch_tree.apply_series(tree, series)
    applier.apply_replacements(tree, replacements)
    tree.commit()
    _log(
        f"sources: {sum(len(s.patches) for s in series)} patches applied by kiln's applier "
        f"({sum(1 for r in results if r.offsets)} with offsets)"
    )
    wheel = wheel_cache.engine_wheel(version, "cuda")
    dist_info = f"vllm-{version}.dist-info"
    with zipfile.ZipFile(wheel) as zf:
        for name in ("METADATA", "entry_points.txt", "top_level.txt", "WHEEL"):
            target = tree_dir / dist_info / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(f"{dist_info}/{name}"))
    out = work / "vllm-sources.tar.xz"
    with tarfile.open(out, "w:xz", preset=6) as tar:
        for path in sorted(tree_dir.rglob("*")):
            rel = path.relative_to(tree_dir).as_posix()
            if path.is_file() and not rel.startswith(SKIPPED_SOURCES) and "__pycache__" not in rel:
                tar.add(path, arcname=rel, recursive=False)
    return out


def _op_libraries(version: str) -> list[Path]:
    """The wheel's op libraries, each xz-compressed once per wheel (about 3 min on 2 cores)."""
    wheel = wheel_cache.engine_wheel(version, "cuda")
    folder = cache_dir() / "gpu-twin" / f"ops-{_sha256(wheel)[:16]}"
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    with zipfile.ZipFile(wheel) as zf:
        for name in OP_LIBRARIES:
            packed = folder / f"{name}.xz"
            if not packed.is_file():
                _log(f"compressing {name} of {wheel.name} (once)")
                partial = packed.with_suffix(".partial")
                partial.write_bytes(lzma.compress(zf.read(f"vllm/{name}"), preset=9 | lzma.PRESET_EXTREME))
                partial.replace(packed)
            out.append(packed)
    return out


def _device_wheels(work: Path) -> list[Path]:
    """requirements/gpu-twin.lock's wheels for the device's CPython 3.12, hash-checked."""
    folder = cache_dir() / "gpu-twin" / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--disable-pip-version-check",
        "--no-deps",
        "--require-hashes",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        "--abi",
        "cp312",
        "--abi",
        "abi3",
        "--abi",
        "none",
        "--platform",
        "any",
        *[arg for p in PLATFORMS for arg in ("--platform", p)],
        "-d",
        str(folder),
        "-r",
        str(LOCK),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        sys.exit(f"gpu-twin: {LOCK.relative_to(ROOT)}: pip download failed: {tail}")
    locked = {
        line.split("==")[0].strip().lower().replace("_", "-")
        for line in LOCK.read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }
    wheels = [w for w in sorted(folder.glob("*.whl")) if w.name.split("-")[0].lower().replace("_", "-") in locked]
    if len(wheels) != len(locked):
        sys.exit(f"gpu-twin: {len(wheels)} wheels for {len(locked)} locked packages in {folder}")
    engine = work / "engine-wheel"
    source = work / "engine-source"  # a copy: the build leaves build/ beside the sources
    shutil.copytree(ROOT / "engine", source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(engine),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    return [*wheels, *sorted(engine.glob("*.whl"))]


def relock() -> None:
    """Re-resolve requirements/gpu-twin.lock from gpu-twin.in for the device's Python,
    leaving out what the device image ships (device-packages.txt)."""
    names, pins = [], []
    for line in DEVICE_HAS.read_text().splitlines():
        if line and not line.startswith("#"):
            names.append(line.split("==")[0])
            # numpy's pin is left to the resolver: mistral_common's own cap (<2.4 on
            # Python < 3.13) is stricter than the device's 2.5.2, which serves it
            if "==" in line and not line.startswith("numpy"):
                pins.append(line)
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as constraints:
        constraints.write("\n".join(pins) + "\n")
        constraints.flush()
        subprocess.run(
            [
                "uv",
                "pip",
                "compile",
                str(LOCK.with_suffix(".in")),
                "-c",
                constraints.name,
                "--python-version",
                "3.12",
                "--python-platform",
                "x86_64-manylinux_2_28",
                "--generate-hashes",
                "--no-header",
                "--no-annotate",
                *[arg for n in names for arg in ("--no-emit-package", n)],
                "-o",
                str(LOCK),
            ],
            check=True,
        )


# -- the plan (twin_plan.py), named here for the runner's and the tests' use --------------
twin_plan = load_script("benchmarks/gpu_twin/twin_plan.py")
plan, configurations = twin_plan.plan, twin_plan.configurations
TARGET, DRAFT, MTP_TARGET, MTP_K = twin_plan.TARGET, twin_plan.DRAFT, twin_plan.MTP_TARGET, twin_plan.MTP_K
SCHEDULE, AV = twin_plan.SCHEDULE, twin_plan.AV


# -- packing: one bundle, split to fit the calls ---------------------------------------------
def _travelling_bytes() -> int:
    """What every call carries anyway: tracked and untracked-not-ignored files."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    return sum((ROOT / n).stat().st_size for n in out.decode().split("\0") if n and (ROOT / n).is_file())


def pack(members: dict[str, Path], out: Path) -> dict[str, object]:
    """members (name in the bundle -> file) into out/call-N/ chunks with a manifest each."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir()
    bundle = out / "bundle.tar"
    with tarfile.open(bundle, "w") as tar:
        for name, path in members.items():
            tar.add(path, arcname=name)
    chunk = CALL_LIMIT - _travelling_bytes() - MARGIN
    data_sha, size = _sha256(bundle), bundle.stat().st_size
    chunks = []
    with bundle.open("rb") as fh:
        for n in range(1, size // chunk + 2):
            block = fh.read(chunk)
            if not block:
                break
            folder = out / f"call-{n}"
            folder.mkdir()
            (folder / f"chunk-{n}").write_bytes(block)
            chunks.append({"name": f"chunk-{n}", "bytes": len(block), "sha256": hashlib.sha256(block).hexdigest()})
    bundle.unlink()
    manifest = {
        "bundle_sha256": data_sha,
        "bundle_bytes": size,
        "chunks": chunks,
        "members": {name: _sha256(path) for name, path in members.items()},
    }
    for n in range(1, len(chunks) + 1):
        (out / f"call-{n}" / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("recipe", nargs="?", default="glm53-kindling")
    p.add_argument("--shape", default="av-cut", help="twin_models.py's shape")
    p.add_argument("--relock", action="store_true", help="re-resolve requirements/gpu-twin.lock first")
    p.add_argument(
        "--engine",
        metavar="VERSION",
        help="serve another vLLM version than the recipe pins, with that version's series (a bump)",
    )
    args = p.parse_args(argv)
    t0 = time.monotonic()
    if args.relock:
        relock()
    the_plan = plan(args.recipe, args.shape, args.engine)
    version = str(the_plan["engine"])
    with tempfile.TemporaryDirectory(prefix="kiln-gpu-twin-") as tmp:
        work = Path(tmp)
        members = {"vllm-sources.tar.xz": _patched_sources(args.recipe, version, work)}
        for lib in _op_libraries(version):
            members[f"ops/{lib.name}"] = lib
        for wheel in _device_wheels(work):
            members[f"wheels/{wheel.name}"] = wheel
        (work / "plan.json").write_text(json.dumps(the_plan, indent=1) + "\n")
        members["plan.json"] = work / "plan.json"
        manifest = pack(members, OUT)
    chunks = manifest["chunks"]
    assert isinstance(chunks, list)
    _log(
        f"{args.recipe} (vllm {version}): {len(members)} parts, {manifest['bundle_bytes'] / 2**20:.1f} MiB in "
        f"{len(chunks)} calls, made in {time.monotonic() - t0:.0f} s"
    )
    configs = the_plan["configs"]
    assert isinstance(configs, dict)
    mtp = [n for n in configs if n.startswith("mtp")]
    main_runs = [n for n in configs if n not in mtp]
    # each timed load is three steady 10 s windows, so one call times about three servers
    groups = [main_runs[i : i + 3] for i in range(0, len(main_runs), 3)] + [
        mtp[i : i + 3] for i in range(0, len(mtp), 3)
    ]
    for n in range(1, len(chunks) + 1):
        run = f"python3 benchmarks/gpu_twin/runner.py stash .gpu-twin/call-{n}"
        _log(f"call {n}: carry ['.gpu-twin/call-{n}'], command: {run}")
    for n, group in enumerate(groups, len(chunks) + 1):
        command = f"python3 benchmarks/gpu_twin/runner.py all --out $OUT --only {' '.join(group)}"
        _log(f"call {n}: carry nothing, command: {command}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
