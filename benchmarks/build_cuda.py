"""`nox -s build_cuda`: build engine-cuda and glm53-kindling here (no GPU needed), check
them on CPU inside the image, and record build time and image size in docs/build-cuda.md.

Opt-in: the first run downloads several GB from PyPI. Checks, all inside the built
recipe image with no GPU and no network:
  1. `import vllm, kiln_engine`
  2. `python -m kiln_engine info`
  3. import of the patched GPU model runner (and the draft-trunc hook is in it)
  4. launch-arg validation against the image's own vLLM parser (plus a bogus flag, which
     must be rejected: a check that cannot fail proves nothing)
  5. torch / CUDA / NCCL labels against the recipe's declared engine
Exit status 1 if any check fails; the document is written either way.
"""

from __future__ import annotations

import argparse
import datetime as dt
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from kiln import argcheck, enginecheck, log  # noqa: E402
from kiln.build import build_engine, build_recipe  # noqa: E402
from kiln.dockerengine import DockerEngine  # noqa: E402
from kiln.errors import KilnError  # noqa: E402
from kiln.images import resolve  # noqa: E402

NAME = "glm53-kindling"
DOC = REPO / "docs" / "build-cuda.md"
ANCHORS_GB = {"vllm/vllm-openai": 12.0, "`pip install vllm` on a slim base": 7.07}
GOAL_GB = 0.8 * 7.07

TRITON_CHECK = (
    "import triton, tokenspeed_triton, torch.utils._triton as t; "
    "assert t.has_triton_package(), 'torch does not see triton'; print('triton', triton.__version__)"
)

# vLLM workers load the general plugins (kiln-engine registers draft_trunc under
# vllm.v1.worker.gpu.spec_decode) before importing the runner; do the same.
RUNNER_CHECK = (
    "from vllm.plugins import load_general_plugins; load_general_plugins(); "
    "import inspect, vllm.v1.worker.gpu.model_runner as m; "
    "src = inspect.getsource(m); "
    "assert 'draft_trunc' in src, 'draft-trunc hook missing from the runner'; "
    "print('patched runner imported:', m.__file__)"
)


def in_image(docker: DockerEngine, image_id: str, *argv: str) -> tuple[int, str]:
    """Run `python ARGV` in the image on CPU: no GPU, no network, output captured."""
    container = docker.client.containers.create(
        image_id, entrypoint=["python", *argv], network_disabled=True,
        environment={"VLLM_LOGGING_LEVEL": "WARNING"},
    )
    try:
        container.start()
        code = container.wait(timeout=600).get("StatusCode", 1)
        return code, container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)


def gb(n: float) -> float:
    return n / 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="rebuild both images (layer cache still used)")
    ap.add_argument("--cold", action="store_true", help="rebuild both images without the layer cache "
                    "(the number to compare: downloads everything again)")
    args = ap.parse_args()
    args.force = args.force or args.cold
    docker = DockerEngine()
    loaded, engine_image, recipe_image = resolve(NAME)

    t0 = time.monotonic()
    engine = build_engine(docker, engine_image, force=args.force, nocache=args.cold)
    recipe = build_recipe(NAME, docker=docker, force=args.force, quiet_summary=True, nocache=args.cold)
    total_s = time.monotonic() - t0

    engine_img = docker.client.images.get(engine.image_id)
    recipe_img = docker.client.images.get(recipe.image_id)
    results: list[tuple[str, bool, str]] = []

    def check(title: str, ok: bool, detail: str) -> None:
        results.append((title, ok, detail.strip()))
        (log.ok if ok else log.warn)(f"{title}: {'ok' if ok else 'FAILED'}")

    code, out = in_image(docker, recipe_img.id, "-c", "import vllm, kiln_engine; print('vllm', vllm.__version__)")
    check("import vllm, kiln_engine", code == 0, out)
    # Triton must import without a GPU; if it cannot, torch and vLLM quietly run without it
    code, out = in_image(docker, recipe_img.id, "-c", TRITON_CHECK)
    check("Triton importable (torch sees it)", code == 0, out)
    code, out = in_image(docker, recipe_img.id, "-m", "kiln_engine", "info")
    check("python -m kiln_engine info", code == 0 and "draft_trunc" in out.replace("-", "_"), out)
    code, out = in_image(docker, recipe_img.id, "-c", RUNNER_CHECK)
    check("import of the patched GPU runner", code == 0, out)

    try:
        found = argcheck.check_against_engine(loaded, docker=docker)
        check("launch args against the engine's vLLM parser", not found, "\n".join(found) or "all accepted")
    except KilnError as exc:
        check("launch args against the engine's vLLM parser", False, exc.message)
    accepted = argcheck.engine_args(docker, engine_img.id)
    bogus = argcheck.problems(_with_bogus_flag(loaded), accepted)
    check("a bogus flag is rejected (negative control)", len(bogus) == 1, "\n".join(bogus))

    labels = recipe_img.labels or {}
    try:
        enginecheck.verify_labels(loaded, recipe_img)
        ok, detail = True, ""
    except KilnError as exc:
        ok, detail = False, exc.message
    shown = {k.rsplit(".", 1)[1]: labels.get(k) for k in
             ("ai.kiln.engine.torch", "ai.kiln.engine.cuda", "ai.kiln.engine.nccl")}
    check("torch/CUDA/NCCL labels match the recipe", ok and shown["torch"] is not None,
          f"{shown}\n{detail}")

    write_doc(engine, recipe, engine_img, recipe_img, total_s, results, shown, args.cold)
    log.info(f"wrote {DOC.relative_to(REPO)}")
    return 0 if all(ok for _, ok, _ in results) else 1


def _with_bogus_flag(loaded):
    """The same recipe with one flag no vLLM has, at a real line of the real file."""
    from kiln.recipe import LoadedRecipe

    launch = loaded.recipe.launch.model_copy(
        update={"args": {**loaded.recipe.launch.args, "kiln-bogus-flag": 1}})
    return LoadedRecipe(loaded.recipe.model_copy(update={"launch": launch}), loaded.dir, loaded.source)


def _layer_sizes(docker: DockerEngine, image_id: str) -> list[tuple[int, str]]:
    rows = []
    for layer in docker.client.api.history(image_id):
        if layer.get("Size", 0) > 1e6:
            rows.append((layer["Size"], " ".join(layer.get("CreatedBy", "").split())[:90]))
    return rows


def write_doc(engine, recipe, engine_img, recipe_img, total_s, results, shown, cold) -> None:
    size = recipe_img.attrs.get("Size", 0)
    cpu = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    docker = DockerEngine()
    lines = [
        "# engine-cuda and glm53-kindling: build time and image size",
        "",
        f"Measured by `nox -s build_cuda` (`benchmarks/build_cuda.py`) on "
        f"{dt.date.today().isoformat()}, on this build host ({cpu} CPU cores, no GPU, PyPI "
        "through a TLS-intercepting proxy), with the legacy Docker builder.",
        "",
        "## This run",
        "",
        "| | image | size | build time | layer cache |",
        "|---|---|---|---|---|",
        f"| engine | `{engine_img.tags[0] if engine_img.tags else engine.tag}` | {gb(engine_img.attrs.get('Size', 0)):.2f} GB | "
        f"{'skipped (up to date)' if engine.skipped else f'{engine.seconds:.0f} s'} | "
        f"{engine.cached_steps}/{engine.steps} steps cached |",
        f"| recipe | `{recipe.tag}` | {gb(size):.2f} GB | "
        f"{'skipped (up to date)' if recipe.skipped else f'{recipe.seconds:.0f} s'} | "
        f"{recipe.cached_steps}/{recipe.steps} steps cached |",
        "",
        f"Wall time of the whole run: {total_s:.0f} s ({'cold: no layer cache' if cold else 'with the layer cache'}). "
        "Engine labels read from the image: "
        f"torch {shown['torch']}, CUDA {shown['cuda']}, NCCL {shown['nccl']}.",
        "",
        "## Against the anchors",
        "",
        "| | size | glm53-kindling relative to it |",
        "|---|---|---|",
    ]
    for name, anchor in ANCHORS_GB.items():
        lines.append(f"| {name} | {anchor:.2f} GB | {gb(size) / anchor:.2f} x |")
    verdict = "met" if gb(size) <= GOAL_GB else "NOT met"
    lines += [
        "",
        f"Goal <= 0.8 x 7.07 GB = {GOAL_GB:.2f} GB: **{verdict}** ({gb(size):.2f} GB). "
        "Sizes are uncompressed, as `docker images` shows them.",
        "",
        "## Largest layers of the recipe image",
        "",
        "| size | created by |",
        "|---|---|",
    ]
    for n, cmd in _layer_sizes(docker, recipe_img.id):
        lines.append(f"| {gb(n):.2f} GB | `{cmd.replace('|', '/')}` |")
    lines += ["", "## CPU checks inside the image", "", "| check | result |", "|---|---|"]
    for title, ok, detail in results:
        first = detail.splitlines()[-1] if detail else ""
        lines.append(f"| {title} | {'ok' if ok else 'FAILED'}: {first.replace('|', '/')[:140]} |")
    lines += ["", "## Where the size is (inside the image, `du`)", "", "| MB | path |", "|---|---|"]
    for mb, path in _du(docker, recipe_img.id):
        lines.append(f"| {mb} | `{path}` |")
    lines += ["", NOTES.strip()]
    DOC.write_text("\n".join(lines) + "\n")


DU = ("sp=$(readlink -f /opt/kiln/site-packages); "
      "{ du -sm /usr /opt/kiln/venv; du -sm $sp/* $sp/nvidia/*/lib $sp/nvidia/*/bin; } 2>/dev/null "
      "| sort -rn | head -22")


def _du(docker: DockerEngine, image_id: str) -> list[tuple[str, str]]:
    out = docker.client.containers.run(image_id, entrypoint=["sh", "-c", DU], remove=True,
                                       network_disabled=True).decode()
    return [tuple(line.split(None, 1)) for line in out.splitlines() if line.strip()]


NOTES = """
## What is in the image, what was taken out, and why the goal is missed

The engine is `pip install vllm==0.32.0` from PyPI into a venv, minus what only audio,
video and vision inputs use (torchvision, torchaudio, torchcodec, PyNvVideoCodec), plus
kiln-engine and the patch series, on Debian bookworm with python3, tini and the compilers
that GPU code compiles with at run time (gcc/g++/libc6-dev/python3-dev: Triton's launcher,
nvcc's host compiler for DeepGEMM and TileLang). Everything is installed in builder stages;
the final stage is `FROM scratch` plus two COPYs, so no pip cache, CA or wheel is in it.

`docker-images/engine-cuda/strip-venv.sh` removes, in the builder stage, only what no code
path on an NVIDIA GPU can load, each measured: DWARF debug sections of shared libraries
(`strip --strip-debug`; libtriton.so alone 441 -> 214 MB, libnccl 226 -> 187 MB),
cuSOLVER-Mg and the alternative-ABI NVRTC (linked by nothing in the venv), CUTLASS-DSL's
CUDA 12 libraries (torch here is a CUDA 13 build), and pip itself. Tried and reverted:
removing the ROCm backends of the two Triton builds (~100 MB) broke `import triton`
(its entry points name them), which the CPU checks above now catch.

What stays and dominates is what vLLM 0.32.0 itself pulls for CUDA 13: the CUDA math
libraries torch links at load time (cuBLAS/cuBLASLt, cuFFT, cuSPARSE, cuSPARSELt, cuRAND,
cuDNN, NCCL, NVSHMEM: all NEEDED by libtorch_cuda.so, so not removable), two Triton
builds (triton, and tokenspeed-triton for tokenspeed-mla), vLLM's own kernels
(FlashAttention 2 and 3, ~460 MB: FA2 is the fallback on non-Hopper GPUs and for ALiBi,
so a shared engine keeps it), CUTLASS DSL, TileLang (GLM-5's sparse-attention indexer),
FlashInfer and the nvcc toolchain that DeepGEMM/TileLang JIT needs. The 7.07 GB anchor
predates several of these dependencies; reaching 5.66 GB would mean dropping libraries
vLLM or torch load (cuFFT, cuDNN, FA2) and is not done blind, without a GPU to prove it
safe.

FlashInfer: vLLM 0.32.0 wants `flashinfer-cubin` matching flashinfer-python 0.7.0.post1,
which the index does not have (newest 0.6.13), or nvcc + ninja for JIT with network access
for cubins. Without them vLLM logs "FlashInfer kernels are disabled" and uses its other
kernels; the image is built that way on purpose (no run-time downloads).
"""


if __name__ == "__main__":
    sys.exit(main())
