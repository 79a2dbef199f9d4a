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
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from kiln_testkit.import_allowlist import UPSTREAM
from kiln_testkit.tree import REPO

from kiln.basics import log
from kiln.basics.errors import KilnError
from kiln.domain.imagecheck import declared_engine, launch_arg_check
from kiln.domain.images import wheelhouse
from kiln.domain.images.build_context import BuildContext
from kiln.domain.images.ca_bundle import add_to_context
from kiln.domain.images.definitions import resolve
from kiln.domain.images.engine_image import LOCK_ARC
from kiln.domain.images.image_naming import platform_suffix
from kiln.domain.locks import engine_lock
from kiln.domain.recipes.resolved import ResolvedRecipe, resolve_recipe
from kiln.infra.docker import DockerDaemon
from kiln.usecases.build import build_engine, build_recipe

NAME = "glm53-kindling"
DOC = REPO / "docs" / "build-cuda.md"
DATA = REPO / "docs" / "build-cuda.json"  # linux/amd64; another platform: build-cuda-<arch>.json
GOAL_RATIO = 0.8
PLAIN_REPOSITORY = "kiln/vllm-plain"
PLAIN_LABEL = "ai.kiln.plain.wheels"  # the wheels stage the anchor was installed from


def data_file(platform: str) -> Path:
    return DATA if platform == "linux/amd64" else DATA.with_name(f"build-cuda-{platform.split('/')[1]}.json")


def markers(platform: str) -> tuple[str, str]:
    """The generated block of docs/build-cuda.md for `platform` (amd64's as it always was)."""
    if platform == "linux/amd64":
        return "<!-- build_cuda: begin (generated from docs/build-cuda.json) -->", "<!-- build_cuda: end -->"
    arch = platform.split("/")[1]
    return (
        f"<!-- build_cuda {arch}: begin (generated from docs/{data_file(platform).name}) -->",
        f"<!-- build_cuda {arch}: end -->",
    )


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


def gb(n: float) -> float:
    return n / 1e9


def _plain_context(engine_image) -> BuildContext:
    """plain.Dockerfile in a context holding exactly the files its shared `wheels` stage
    COPYs, byte for byte as engine-cuda's context holds them (so the cache matches): the
    in-image lock tools, the lock's derived files and every locked wheel, the plain
    anchor's extra ones included."""
    ctx = BuildContext()
    ctx.add_bytes("Dockerfile", (engine_image.dir / "plain.Dockerfile").read_bytes())
    for tool in ("with-ca", "kiln-apt-install", "kiln-lock-tool"):
        ctx.add_file(f"_kiln/common/{tool}", REPO / "docker-images" / "common" / tool)
    lock = engine_image.lock
    # the target's own lock files: a cross-placed engine's context also carries the
    # host's pins and uv for its builder stages; the anchor runs every step on the target
    for name, data in engine_lock.context_files(lock, engine_image.platform).items():
        ctx.add_bytes(f"_kiln/lock/{name}", data)
    ctx.add_file(LOCK_ARC, engine_image.lock_file)
    wheels = wheelhouse.fetch_locked(
        lock, engine_image.platform, lock_file=engine_image.lock_file, cafile=engine_image.ca.get().path, plain=True
    )
    for whl in wheels:
        ctx.add_file(f"_kiln/wheels/{whl.name}", whl, in_digest=False)
    add_to_context(ctx, engine_image.ca.get())
    return ctx


def _build_wheels_stage(
    docker: DockerDaemon, ctx: BuildContext, buildargs: dict, nocache: bool, platform: str | None = None
) -> str:
    """The id of the shared `wheels` stage (a layer-cache hit after the engine build)."""
    image_id = None
    with tempfile.TemporaryFile() as tar:
        ctx.write_tar(tar)
        tar.seek(0)
        for chunk in docker.client.api.build(
            fileobj=tar,
            custom_context=True,
            buildargs=buildargs,
            target="wheels",
            rm=True,
            forcerm=True,
            decode=True,
            nocache=nocache,
            pull=False,
            platform=platform,
        ):
            if "error" in chunk:
                raise SystemExit(f"build_cuda: the wheels stage failed: {chunk['error'].strip()}")
            text = chunk.get("stream", "")
            if text.startswith("Step ") or "wheels:" in text:
                log.info(f"  wheels {text.strip()[:150]}")
            image_id = chunk.get("aux", {}).get("ID", image_id)
    if not image_id:
        raise SystemExit("build_cuda: the daemon reported no id for the wheels stage")
    return image_id


def build_plain(docker: DockerDaemon, engine_image, nocache: bool, force: bool):
    """The anchor image, installed by pip from the shared wheels, served over HTTP from a
    container on the default bridge (where the legacy builder's RUN steps run)."""
    ctx = _plain_context(engine_image)
    # the anchor builds every step for its platform (under qemu for another architecture)
    buildargs = {"BASE_IMAGE": engine_image.buildargs()["BASE_IMAGE"], "ENGINE_VERSION": engine_image.engine.version}
    plat = engine_image.platform
    wheels_id = _build_wheels_stage(docker, ctx, buildargs, nocache, platform=plat)
    tag = f"{PLAIN_REPOSITORY}:{engine_image.engine.version}{platform_suffix(plat)}"
    old = docker.image(tag)
    if old is not None and not force and (old.labels or {}).get(PLAIN_LABEL) == wheels_id:
        log.ok(f"{tag} is up to date (built from wheels {wheels_id[:19]})")
        return old.id, tag, 0.0, "skipped (up to date)"
    server = docker.client.containers.run(
        wheels_id,
        entrypoint=["python3", "-m", "http.server", "8765", "--directory", "/wheels"],
        detach=True,
        name=f"kiln-cuda-wheels-{os.getpid()}",
    )
    try:
        url = f"http://{_ip_when_serving(server)}:8765/"
        log.step(
            f"building the plain anchor: pip install vllm=={engine_image.engine.version} on "
            f"{engine_image.engine.base_image.pinned} (wheels from {url})"
        )
        result = docker.build(
            ctx,
            label="vllm-plain",
            buildargs={**buildargs, "WHEELS_URL": url},
            labels={PLAIN_LABEL: wheels_id},
            nocache=nocache,
            platform=plat,
        )
    finally:
        server.remove(force=True)
    docker.tag(result.image_id, tag)
    return result.image_id, tag, result.seconds, f"{result.cached_steps}/{result.steps}"


def _ip_when_serving(server, timeout_s: float = 60) -> str:
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="rebuild the images (layer cache still used)")
    ap.add_argument("--cold", action="store_true", help="rebuild without the layer cache (downloads again)")
    ap.add_argument("--no-proofs", action="store_true", help="skip the in-image proofs (minutes)")
    ap.add_argument("--render-only", action="store_true", help=f"re-render {DOC.name} from {DATA.name}")
    ap.add_argument(
        "--platform",
        choices=sorted(engine_lock.PLATFORMS),
        default="linux/amd64",
        help="build and check this platform's images (linux/arm64 on x86-64: under qemu where "
        "it must run; scripts/setup.sh --arm64 and kiln base build --platform linux/arm64 first)",
    )
    args = ap.parse_args()
    if args.render_only:
        render(json.loads(data_file(args.platform).read_text()), args.platform)
        return 0
    args.force = args.force or args.cold
    docker = DockerDaemon()
    resolved = resolve(NAME, platform=args.platform)
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
    log.ok(f"engine {engine.tag}: {gb(engine.size):.2f} GB")

    plain_id, plain_tag, plain_s, plain_cache = build_plain(docker, engine_image, nocache=args.cold, force=args.force)
    plain_size = docker.client.images.get(plain_id).attrs.get("Size", 0)
    run["plain_build"] = {
        "tag": plain_tag,
        "image_id": plain_id,
        "size": plain_size,
        "seconds": round(plain_s),
        "cached_steps": plain_cache,
    }
    log.ok(f"plain {plain_tag}: {gb(plain_size):.2f} GB")

    recipe_id = None
    try:
        recipe = build_recipe(
            resolve_recipe(NAME),
            docker=docker,
            force=args.force,
            quiet_summary=True,
            nocache=args.cold,
            platform=args.platform,
        )
        recipe_id = recipe.image_id
        run["recipe_build"] = {"tag": recipe.tag, "size": recipe.size, "skipped": recipe.skipped}
    except KilnError as exc:  # the engine and the anchor are still measured
        log.warn(f"{NAME} did not build: {exc.message}")
        run["recipe_build"] = {"error": exc.message}

    ratio = engine.size / plain_size
    run["ratio"] = round(ratio, 3)
    run["goal_met"] = ratio <= GOAL_RATIO
    (log.ok if run["goal_met"] else log.warn)(
        f"engine-cuda {gb(engine.size):.2f} GB / plain {gb(plain_size):.2f} GB = {ratio:.3f} x (goal <= {GOAL_RATIO})"
    )
    run["du_mb"] = {"kiln": du(docker, engine.image_id), "plain": du(docker, plain_id)}
    run["checks"] = run_checks(docker, loaded, engine.image_id, recipe_id, args.platform)
    if not args.no_proofs:
        ok, proofs = run_proofs(engine.image_id)
        run["proofs_ok"], run["proofs"] = ok, proofs
    run["wall_s"] = round(time.monotonic() - t0)
    data = data_file(args.platform)
    data.write_text(json.dumps(run, indent=1, sort_keys=True) + "\n")
    render(run, args.platform)
    log.summary(
        "build_cuda",
        {
            "engine-cuda": f"{gb(engine.size):.2f} GB",
            "plain": f"{gb(plain_size):.2f} GB",
            "ratio": f"{ratio:.3f} x (goal <= {GOAL_RATIO}: {'met' if run['goal_met'] else 'NOT met'})",
            "checks": f"{sum(c['ok'] for c in run['checks'])}/{len(run['checks'])} ok",
            "proofs": "skipped" if args.no_proofs else ("ok" if run.get("proofs_ok") else "FAILED"),
            "written": f"{data.relative_to(REPO)}, {DOC.relative_to(REPO)}",
        },
    )
    failed = not all(c["ok"] for c in run["checks"]) or (not args.no_proofs and not run.get("proofs_ok"))
    return 1 if failed else 0


def render(run: dict, platform: str = "linux/amd64") -> None:
    """Replace the generated block of docs/build-cuda.md for `platform` with this run's numbers."""
    BEGIN, END = markers(platform)  # the two markers, constants of the file  # noqa: N806
    text = DOC.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOC.relative_to(REPO)}: the markers {BEGIN!r} and {END!r} are missing")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(head + BEGIN + "\n" + "\n".join(generated(run)) + "\n" + END + tail)


def generated(run: dict) -> list[str]:
    e, p = run["engine_build"], run["plain_build"]
    lines = [
        "",
        (
            f"Measured by `nox -s {_session(run)}` on {run['date']} ({run['cpus']} CPU cores, no GPU), vLLM "
            f"{run['engine']} on `{run['base_image']}`, legacy Docker builder"
            f"{', cold (no layer cache)' if run['cold'] else ''}{_where(run)}. "
            "Sizes are uncompressed, as `docker images` shows them."
        ),
        "",
        "| image | size | build | layer cache |",
        "|---|---|---|---|",
        (
            f"| `{p['tag']}`: plain `pip install vllm=={run['engine']}` in a venv | {gb(p['size']):.2f} GB | "
            f"{p['seconds']} s | {p['cached_steps']} |"
        ),
        (
            f"| `{e['tag']}`: kiln engine-cuda | {gb(e['size']):.2f} GB | "
            f"{'up to date' if e['skipped'] else str(e['seconds']) + ' s'} | {e['cached_steps']} steps cached |"
        ),
    ]
    r = run.get("recipe_build", {})
    if "size" in r:
        lines.append(f"| `{r['tag']}`: glm53-kindling (engine + recipe tail) | {gb(r['size']):.2f} GB | | |")
    else:
        lines.append(f"| glm53-kindling | not built: {r.get('error', '?')[:160]} | | |")
    lines += [
        "",
        (
            f"**engine-cuda / plain = {run['ratio']:.3f} x** (goal <= {GOAL_RATIO}: "
            f"{'met' if run['goal_met'] else 'NOT met'})."
        ),
        "",
    ]
    lines += _du_table(run["du_mb"])
    lines += ["", "Checks in the image (CPU, no network):", "", "| check | result |", "|---|---|"]
    for c in run["checks"]:
        last = c["detail"].splitlines()[-1] if c["detail"] else ""
        lines.append(f"| {c['check']} | {'ok' if c['ok'] else 'FAILED'}: {last.replace('|', '/')[:140]} |")
    lines += _proof_lines(run)
    return lines


def _session(run: dict) -> str:
    plat = run.get("platform", "linux/amd64")
    return "build_cuda" if plat == "linux/amd64" else "build_cuda_" + plat.split("/")[1]


def _where(run: dict) -> str:
    """Which steps ran on which machine, for a platform other than the host's."""
    plat, builder = run.get("platform", "linux/amd64"), run.get("builder_platform", "linux/amd64")
    if plat == builder:
        return ""
    return (
        f"; image for {plat}, its wheels placed, stripped and byte-compiled on {builder} (cross placement), "
        "the runtime OS's apt, the plain anchor and every check under qemu"
    )


def _kinds(upstream: dict[str, int]) -> str:
    """'needs the GPU driver: 21, optional dependencies: 80 (lmcache, ...), other: 6'."""
    driver = sum(n for k, n in upstream.items() if "driver" in k)
    optional = {k.rsplit(": ", 1)[1]: n for k, n in upstream.items() if k.startswith("optional dependency")}
    other = sum(upstream.values()) - driver - sum(optional.values())
    names = ", ".join(sorted(optional, key=lambda k: -optional[k])[:8])
    return (
        f"needs the GPU driver: {driver}; optional dependencies not installed: {sum(optional.values())}"
        f"{f' ({names}, ...)' if names else ''}; other upstream errors: {other}"
    )


def _du_table(du_mb: dict) -> list[str]:
    kiln, plain = du_mb["kiln"], du_mb["plain"]
    # ties by name: set order differs between runs, and the generated block must not churn
    names = sorted(set(kiln) | set(plain), key=lambda n: (-max(kiln.get(n, 0), plain.get(n, 0)), n))
    rows = [
        "Where the bytes are (`du -sm`, MB; site-packages entries, then the OS):",
        "",
        "| path | plain | kiln | kiln - plain |",
        "|---|---:|---:|---:|",
    ]
    for name in names:
        a, b = plain.get(name, 0), kiln.get(name, 0)
        if max(a, b) >= 20 or (a and not b):
            if name.endswith((".dist-info", ".pth")) and max(a, b) < 20:
                continue
            rows.append(f"| `{name}` | {a or '-'} | {b or '-'} | {b - a:+d} |")
    return rows


def _proof_lines(run: dict) -> list[str]:
    if "proofs" not in run:
        return ["", "Proofs: not run (--no-proofs)."]
    p = run["proofs"]
    lines = [
        "",
        (
            f"Proofs inside the image (`tests/cuda/test_image_proofs.py`): "
            f"**{'all passed' if run['proofs_ok'] else 'FAILED'}**."
        ),
        "",
    ]
    if "elf" in p:
        c = p["elf"]["counts"]
        lines.append(
            f"- ELF: {c['elf_files']} files, {c['needed_entries']} DT_NEEDED entries: "
            f"{c['by_search_path']} by the loader's search path, {c['by_soname_preloaded']} by a "
            f"library loaded first (by soname), {c['driver']} driver libraries "
            f"({', '.join(p['elf']['driver']) or 'none'}), **{c['unresolved']} unresolved**."
        )
    for package, r in p.get("imports", {}).items():
        upstream = {w.split(": ", 1)[1]: n for w, n in r["allowed"].items() if w.startswith(UPSTREAM)}
        ours = {w: n for w, n in r["allowed"].items() if not w.startswith(UPSTREAM)}
        lines.append(
            f"- `import` every module of {package}: {r['imported']}/{r['modules']} imported; "
            f"{sum(upstream.values())} fail exactly as in the plain image ({_kinds(upstream)}); "
            f"{sum(ours.values())} fail only here, as intended "
            f"({'; '.join(f'{n}: {w}' for w, n in ours.items()) or 'none'}); "
            f"**{len(r['unexpected'])} unexpected**; {r['programs']} `__main__` not run."
        )
    if "dlopen" in p:
        d = p["dlopen"]
        lines.append(
            f"- dlopen: {d['loaded_count']} libraries of torch/lib and nvidia/ loaded without a GPU "
            f"(torch {d['torch']}, CUDA {d['cuda']}; {', '.join(f'{k} {v}' for k, v in d.get('calls', {}).items())}), "
            f"{len(d['driver_only'])} need only the driver, **{len(d['failed'])} failed**."
        )
    if "removed_symbols" in p:
        r = p["removed_symbols"]
        control = ", ".join(u.split("site-packages/")[-1] for u in r["control_users"]) or "none"
        lines.append(
            f"- removed cuDNN sub-libraries ({', '.join(x.rsplit('/', 1)[-1] for x in r['libraries'])}): "
            f"their {r['entry_points']} exported symbols (read in the plain image) are imported by "
            f"**{len(r['users'])} ELF files** here (control: `cudnnGetVersion` is imported by {control})"
        )
    if "compilers" in p:
        for name, detail in p["compilers"]["ok"].items():
            lines.append(f"- compiler `{name}`: {detail}")
        for name, detail in p["compilers"]["failed"].items():
            flat = re.sub(r"\s+", " ", detail)[:200]
            lines.append(f"- compiler `{name}`: **FAILED**: {flat}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
