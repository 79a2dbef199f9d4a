"""build_cuda's checks inside the built images: triton, the runner, the machine, the plugin,
what `du` counts, `kiln check` on the recipe, its launch arguments against a bogus flag,
and the in-image proofs (tests/cuda/test_image_proofs.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from kiln_testkit.tree import REPO

from kiln.basics import log
from kiln.basics.errors import KilnError
from kiln.domain.imagecheck import declared_engine, launch_arg_check
from kiln.domain.locks import engine_lock
from kiln.domain.recipes.resolved import ResolvedRecipe
from kiln.infra.docker import DockerDaemon

NAME = "glm53-kindling"

TRITON_CHECK = (
    "import triton, torch.utils._triton as t; "
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

# the image's own machine (uname through Python) and the CUDA its torch was built for
MACHINE_CHECK = (
    "import platform, torch, vllm; "
    "print('machine', platform.machine(), 'torch', torch.__version__, "
    "'cuda', torch.version.cuda, 'vllm', vllm.__version__)"
)

# vLLM finds kiln-engine through its entry point (group vllm.general_plugins) and loads it;
# draft-trunc's module, its policy and its kernels' Python side import without a GPU.
PLUGIN_CHECK = (
    "import importlib.metadata as md; "
    "eps = [e for e in md.entry_points(group='vllm.general_plugins') if e.value.startswith('kiln_engine')]; "
    "assert eps, 'no kiln_engine entry point in vllm.general_plugins'; "
    "import sys; from vllm.plugins import load_general_plugins; load_general_plugins(); "
    "dt = sys.modules.get('vllm.v1.worker.gpu.spec_decode.draft_trunc'); "
    "assert dt is not None, 'the plugin did not register draft_trunc with the runner'; "
    "print('plugins', [e.name for e in eps], 'draft_trunc', dt.__file__, 'enabled', dt.ENABLED)"
)

# Where the bytes are, per top-level entry of site-packages and outside the venv.
DU = (
    "sp=$(python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'); "
    "venv=$(dirname $(dirname $(dirname $sp))); "
    'du -sm $sp/* 2>/dev/null | sed "s|$sp/||"; '
    "du -sm --exclude=/proc --exclude=/sys --exclude=\"$venv\" / 2>/dev/null | sed 's|\t/$|\toutside the venv|'; "
    "du -sm /usr/lib/gcc /usr/libexec/gcc /usr/include /var/cache/apt /var/lib/apt 2>/dev/null"
)


def in_image(docker: DockerDaemon, image_id: str, *argv: str, entrypoint: str = "python") -> tuple[int, str]:
    """Run ARGV in the image on CPU: no GPU, no network, output captured."""
    container = docker.client.containers.create(
        image_id,
        entrypoint=[entrypoint, *argv],
        network_disabled=True,
        environment={"VLLM_LOGGING_LEVEL": "WARNING"},
    )
    try:
        container.start()
        code = container.wait(timeout=900).get("StatusCode", 1)
        return code, container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)


def ip_when_serving(server, timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        server.reload()
        ip = server.attrs["NetworkSettings"].get("IPAddress")
        if ip:
            try:
                urllib.request.urlopen(f"http://{ip}:8765/", timeout=2).close()
                return ip
            except OSError:
                pass
        time.sleep(0.5)
    raise SystemExit(f"build_cuda: the wheel server did not answer within {timeout_s:.0f} s")


def du(docker: DockerDaemon, image_id: str) -> dict[str, int]:
    _code, out = in_image(docker, image_id, "-c", DU, entrypoint="sh")
    sizes = {}
    for line in out.splitlines():
        parts = line.split("\t", 1)
        if len(parts) == 2 and parts[0].isdigit():
            sizes[parts[1].strip()] = int(parts[0])
    return sizes


def run_checks(docker, loaded, engine_id: str, recipe_id: str | None, platform: str = "linux/amd64") -> list[dict]:
    results: list[dict] = []

    def check(title: str, ok: bool, detail: str) -> None:
        results.append({"check": title, "ok": ok, "detail": detail.strip()[-2000:]})
        (log.ok if ok else log.warn)(f"{title}: {'ok' if ok else 'FAILED'}")

    image = recipe_id or engine_id
    code, out = in_image(docker, image, "-c", MACHINE_CHECK)
    machine = engine_lock.platform(platform).machine
    check(
        f"import torch and vllm on {machine}: machine, torch.version.cuda",
        code == 0 and f"machine {machine} " in out,
        out,
    )
    code, out = in_image(docker, image, "-c", "import vllm, kiln_engine; print('vllm', vllm.__version__)")
    check("import vllm, kiln_engine", code == 0, out)
    code, out = in_image(docker, image, "-c", PLUGIN_CHECK)
    check("kiln-engine plugin registered with vLLM; draft-trunc loads", code == 0, out)
    # Triton must import without a GPU; if it cannot, torch and vLLM quietly run without it
    code, out = in_image(docker, image, "-c", TRITON_CHECK)
    check("Triton importable (torch sees it)", code == 0, out)
    code, out = in_image(docker, image, "-m", "kiln_engine", "info")
    check("python -m kiln_engine info", code == 0, out)
    if recipe_id:
        code, out = in_image(docker, recipe_id, "-c", RUNNER_CHECK)
        check("import of the patched GPU runner (recipe image)", code == 0, out)
    try:
        found = launch_arg_check.check_engine_image(docker, ResolvedRecipe(loaded), engine_id)  # names, values, knobs
        check("launch command against the engine's own vLLM parser", not found, "\n".join(found) or "all accepted")
    except KilnError as exc:
        check("launch command against the engine's own vLLM parser", False, exc.message)
    try:
        bogus = launch_arg_check.problems(_with_bogus_flag(loaded), launch_arg_check.engine_args(docker, engine_id))
        check("a bogus flag is rejected (negative control)", len(bogus) == 1, "\n".join(bogus))
    except KilnError as exc:
        check("a bogus flag is rejected (negative control)", False, exc.message)
    done = subprocess.run(
        ["kiln", "check", NAME, "--platform", platform], capture_output=True, text=True, timeout=3600, check=False
    )
    said = (done.stdout + done.stderr).strip()
    check(
        f"kiln check {NAME} --platform {platform} (exit {done.returncode})",
        done.returncode == 0 and "launch args not checked" not in said,
        said,
    )
    try:
        declared_engine.verify_labels(loaded, docker.client.images.get(image))
        check("torch/CUDA/NCCL labels match the recipe", True, json.dumps(_labels(docker, image)))
    except KilnError as exc:
        check("torch/CUDA/NCCL labels match the recipe", False, exc.message)
    return results


def _labels(docker, image_id: str) -> dict:
    labels = docker.client.images.get(image_id).labels or {}
    return {
        k.rsplit(".", 1)[1]: labels.get(k)
        for k in ("ai.kiln.engine.torch", "ai.kiln.engine.cuda", "ai.kiln.engine.nccl")
    }


def _with_bogus_flag(loaded):
    """The same recipe with one flag no vLLM has, at a real line of the real file."""
    from kiln.domain.recipes.recipe import LoadedRecipe

    launch = loaded.recipe.launch.model_copy(update={"args": {**loaded.recipe.launch.args, "kiln-bogus-flag": 1}})
    return LoadedRecipe(loaded.recipe.model_copy(update={"launch": launch}), loaded.dir, loaded.source)


def run_proofs(engine_id: str) -> tuple[bool, dict]:
    """tests/cuda/test_image_proofs.py against this engine image; its counts come back
    through KILN_CUDA_PROOFS_JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "proofs.json"
        env = {
            **os.environ,
            "KILN_CUDA_TESTS": "1",
            "KILN_CUDA_ENGINE_IMAGE": engine_id,
            "KILN_CUDA_PROOFS_JSON": str(out),
            "PYTHONPATH": os.pathsep.join(
                [
                    str(REPO / "src"),
                    str(REPO / "engine"),
                    str(REPO / "testkit"),
                    str(REPO / "tests"),
                    os.environ.get("PYTHONPATH", ""),
                ]
            ),
        }
        log.step("proofs inside the image: pytest tests/cuda/test_image_proofs.py (minutes: every module imports)")
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "-q",
                "-rA",
                str(REPO / "tests" / "cuda" / "test_image_proofs.py"),
            ],
            env=env,
            cwd=REPO,
            check=False,
        )
        data = json.loads(out.read_text()) if out.is_file() else {}
    return proc.returncode == 0, data
