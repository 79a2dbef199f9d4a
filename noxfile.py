"""kiln's test and benchmark sessions.

Sessions run in the environment `make setup` prepared (system packages, a running
Docker daemon, `.venv` with requirements/dev.lock and kiln editable; make puts its bin/ first
on PATH), not in fresh virtualenvs per session: the tests
drive the real daemon, registry and vLLM images, which no venv can isolate anyway.

`nox` with no arguments runs the default sessions in this order, and stops at the first
one that fails (what `make test` and CI run):

    lint         ruff, the import contract                          (seconds)
    unit         `pytest --unit`: no Docker, registry, network or server (minutes)
    integration  real-daemon builds of small images, registries, vLLM wheels
    e2e          engine-cpu + tiny-moe + tiny-kindling, served by a real vLLM; and the
                 kernels tier (draft_trunc against vLLM's own samplers, full sweep, in
                 Triton's interpreter) on the core the serving tests leave idle

so a broken test or a lint error is reported before anything is built. Tiers are
pytest markers (pyproject.toml); an unmarked test is a unit test, and the unit tier's
guard (tests/unitguard.py) fails it if it reaches Docker, a registry or the network.
`nox -s kernels` runs the kernels tier alone. Opt-in: `e2e_full` (the full-size twin
check), `disruptive` (CI adds it), benchmarks, `schemas` (regenerates the `--json`
documents' JSON Schemas).
Every pytest session ends with one line giving its own wall time.
"""

import os
import time

import nox

nox.options.default_venv_backend = "none"
# no "kernels": e2e runs its tests (see e2e); `nox -s kernels` runs them alone
nox.options.sessions = ["lint", "unit", "integration", "e2e"]
if os.environ.get("CI"):  # a CI machine's daemon is ours to restart; a developer's is not
    nox.options.sessions.append("disruptive")
nox.options.stop_on_first_error = True  # lint and unit gate everything that builds
nox.options.error_on_missing_interpreters = True

PYTEST = ["python", "-m", "pytest", "-p", "no:cacheprovider"]
# in-image Python under docker-images/common (most have no .py suffix, so ruff and mypy are told)
IMAGE_SCRIPTS = [
    f"docker-images/common/{name}"
    for name in ("engine-deps.py", "kiln-health", "kiln-lock-tool", "kiln-prewarm", "kiln-serve")
]
# kiln's other Python that images run (make_models.py builds the twin recipes' models);
# recipes' experimental files are vLLM's own modules, linted but not typed (pyproject.toml)
SHIPPED_SCRIPTS = ["docker-images/engine-cuda/strip-symbols.py", "recipes/_shared/make_models.py"]
# what only opt-in sessions run
NEVER_BY_DEFAULT = "gpu or disruptive or full or emulation"
# the kernels tier: tests/draft_trunc's `kernels` tests (vLLM's sources, the slow seeds)
KERNELS = f"kernels and not ({NEVER_BY_DEFAULT})"


def _pytest(session, *args):
    """pytest, then one line with this session's wall time (the numbers docs/benchmarks.md keeps)."""
    t0 = time.monotonic()
    try:
        session.run(*PYTEST, *args, *session.posargs)
    finally:
        session.log(f"{session.name}: wall time {time.monotonic() - t0:.0f} s")


def _base_image(session):
    """kiln/base:bookworm, built from Debian (a no-op when present): after lint and unit."""
    session.run("kiln", "base", "build")


@nox.session
def lint(session):
    """ruff over the whole tree and the in-image scripts; mypy over the harness, the engine
    package, the test kit and the in-image scripts; the import contract."""
    # select = ALL less the exceptions pyproject.toml lists with their reasons (README.md, "Lint")
    session.run("ruff", "check", ".", *IMAGE_SCRIPTS)
    # one layout everywhere (pyproject.toml's line-length 120): a diff here is a formatting fix
    session.run("ruff", "format", "--check", ".", *IMAGE_SCRIPTS)
    session.run("lint-imports")  # the layers of docs/architecture.md
    session.run("mypy")  # src/, engine/, testkit/ as [tool.mypy] in pyproject.toml says, 0 errors
    # the Python scripts shipped into images, read by the same tools; their imports that
    # exist only inside an image (huggingface_hub, kiln_hfcache, transformers) are unknown here
    session.run("mypy", "--scripts-are-modules", "--ignore-missing-imports", *IMAGE_SCRIPTS, *SHIPPED_SCRIPTS)


@nox.session
def unit(session):
    """Every unmarked test (schema, contexts, CLI, errors, draft_trunc's kernels on a
    representative subset of seeds, hostile recipes, docs `run` blocks), with the unit
    tier's guard: a test that reaches the Docker daemon, any TCP/UDP peer, a DNS name,
    or starts docker/dockerd/docker-registry/debootstrap/apt-get/pip install fails.
    Under 3 minutes on 2 cores."""
    # the guard's own tests first, in this process: their inner pytest was seen to block
    # in communicate() after a child exited, from an xdist worker and (1 run in 5 to 10)
    # from here; the cause was a server thread one inner test left polling an fd number
    # that a later pipe reused (fixed in tests/test_unitguard.py, 0 hangs in 20 runs after)
    t0 = time.monotonic()
    try:
        session.run(*PYTEST, "--unit", "-q", "tests/test_unitguard.py")
        # -n: pytest-xdist, one worker per core (pytest-benchmark, unused here, would warn about it)
        session.run(
            *PYTEST,
            "--unit",
            "-n",
            "auto",
            "-p",
            "no:benchmark",
            "-q",
            "--durations=15",
            "--deselect",
            "tests/test_unitguard.py",
            *session.posargs,
        )
    finally:
        session.log(f"unit: wall time {time.monotonic() - t0:.0f} s")


@nox.session
def integration(session):
    """Real-daemon builds of a small stand-in engine (labels, skip-if-built, failed
    builds, CA absence, contexts), every daemon endpoint kiln uses failed in turn through
    a fault-injecting proxy, publishing to real `docker-registry`s on 127.0.0.1
    (faults, two registries, credentials), patches against real vLLM 0.32.0 and 0.33.0
    sources (wheels downloaded once into ~/.cache/kiln), docs `network` blocks."""
    _base_image(session)
    # two or more xdist workers, whole groups each (tests/kilntest.py assign_xdist_groups): the daemon tests in
    # one serial group, the engine-parser checks, patches and docs beside it; these tests
    # mostly wait on the daemon, registries and downloads, so 2 cores run two at once
    _pytest(
        session,
        "-m",
        f"(docker or registry or network) and not (e2e or kernels or {NEVER_BY_DEFAULT})",
        "--ignore=tests/draft_trunc",
        "-n",
        "auto",
        "--dist",
        "loadgroup",
        "-p",
        "no:benchmark",
        "--durations=15",
    )


@nox.session
def kernels(session):
    """The kernels tier alone: draft_trunc beyond the unit tier, under TRITON_INTERPRET=1
    on CPU: exactness against vLLM 0.32.0's, 0.33.0's and 0.34.0's own rejection samplers (every
    mode, dead fill and policy), the patched runner hooks, and the slowest policy seeds
    (4096 experts). `nox` runs these tests inside e2e instead (its second worker).
    `KILN_DT_VLLM_VERSIONS=0.34.0 nox -s kernels` tests one version only."""
    # one xdist worker per core: the interpreter is CPU-bound and these tests share no
    # daemon or registry (the vLLM sources come from the wheel cache integration filled)
    _pytest(session, "tests/draft_trunc", "-m", KERNELS, "-n", "auto", "-p", "no:benchmark", "--durations=15")


@nox.session
def e2e(session):
    """Build engine-cpu, tiny-moe and tiny-kindling from scratch (reusing the daemon's
    layer cache); serve them; the serving contract, smoke, serve loop, two-node run,
    publish to a local registry; tiny-kindling with draft-trunc on (shipped cost policy
    and fixed tau 0.25) against off, on a smaller request set (`e2e_full` runs the full one);
    and the kernels tier (see kernels), on the worker the serving tests leave free."""
    _base_image(session)
    # engine-cpu (when missing) and tiny-moe-hf before the workers start: each worker's
    # first build would otherwise build a missing engine too, both at once
    session.run("kiln", "build", "tiny-moe-hf")
    # two xdist workers, whole groups each, in the order tests/kilntest.py gives them
    # (--no-loadscope-reorder: xdist would start the groups with the most tests first):
    # the tiny-moe tests in the serial daemon group on one; tiny-kindling's servers, the
    # hub-cache module, then the kernels tier's modules on the other. Most of the daemon
    # group is one busy process (a build, a vLLM start), so the second core is free for them;
    # tiny-kindling's four busy servers are not, so they run alone (tests/e2e/conftest.py)
    _pytest(
        session,
        "-m",
        f"(e2e and not ({NEVER_BY_DEFAULT})) or ({KERNELS})",
        "-n",
        "2",
        "--dist",
        "loadgroup",
        "--no-loadscope-reorder",
        "-p",
        "no:benchmark",
        "--durations=15",
    )


@nox.session
def e2e_full(session):
    """Opt-in (~25 min): the full-size tiny-kindling check, three servers (cost policy,
    fixed tau 0.25, off) on 64 prompts x 3 request sets each (docs/benchmarks.md)."""
    _base_image(session)
    _pytest(session, "-m", "full and not gpu", "--durations=15")


@nox.session
def disruptive(session):
    """Opt-in: restarts the Docker daemon in the middle of a build (stops every running
    container on it), as root, where scripts/setup.sh started dockerd."""
    _pytest(session, "-m", "disruptive")


@nox.session
def arm64(session):
    """Opt-in (qemu; minutes to tens of minutes on 2 cores): linux/arm64 under emulation
    on an x86-64 host (`scripts/setup.sh --arm64` first): the arm64 base from debootstrap,
    a recipe built for both platforms with `kiln build --platform all`, and tiny-moe's
    arm64 refusal naming the wheels it lacks (tests/arm64; times in docs/benchmarks.md)."""
    _base_image(session)
    _pytest(session, "tests/arm64", "-m", "emulation", "--durations=15")


@nox.session
def schemas(session):
    """Opt-in: regenerate src/kiln/schemas/*.json, the `--json` documents' JSON Schemas,
    from their TypedDicts (the unit tier fails while a file is stale)."""
    session.run("python", "-m", "kiln.commands.json_schemas")


@nox.session
def smoke(session):
    """`nox -s smoke -- NAME`: build (if needed) and smoke-test one recipe."""
    names = session.posargs or ["tiny-moe"]
    for name in names:
        session.run("kiln", "smoke", name, "--build")


@nox.session
def bench_build(session):
    """Cold build, no-op rebuild and launch-config-only rebuild of a small recipe."""
    session.run("python", "benchmarks/bench_build.py", *session.posargs)


@nox.session
def repro(session):
    """Opt-in (~25 min on 2 cores): base, engine-cpu, tiny-moe and tiny-kindling built twice
    with the layer cache off and the first round's images untagged; prints both image ids
    and a same/different line per layer, and the first differing file if any (in its own
    local namespace, $KILN_IMAGE_NAMESPACE, default kilnrepro: others' images untouched)."""
    session.run("python", "benchmarks/repro.py", *session.posargs, env={"PYTHONUNBUFFERED": "1"})


@nox.session
def bench_cpu(session):
    """engine-cpu + tiny-moe (build times, image size, time to healthy, tokens/s with and without
    speculation) and tiny-kindling (draft-trunc on/off); `-- --reuse`, `--moe-only`, `--twin-only`."""
    session.run("python", "benchmarks/bench_cpu.py", *session.posargs)


@nox.session
def build_cuda(session):
    """Opt-in (multi-GB downloads): build engine-cuda, glm53-kindling and the plain
    `pip install vllm` anchor here, prove inside the image that what kiln removed is not
    needed (tests/cuda/test_image_proofs.py), record both sizes in docs/build-cuda.*."""
    session.run("python", "benchmarks/build_cuda.py", *session.posargs, env={"PYTHONUNBUFFERED": "1"})


@nox.session
def build_cuda_arm64(session):
    """Opt-in (qemu; multi-GB downloads; ~42 GB of disk): engine-cuda and glm53-kindling
    for linux/arm64 on an x86-64 host, wheels placed by the host's uv, and the plain arm64
    `pip install vllm` anchor; in-image proofs under qemu (imports, machine, CUDA build,
    launch command, kiln-engine and draft-trunc); figures into docs/build-cuda.*.
    Needs `scripts/setup.sh --arm64` (docs/multiarch.md)."""
    session.run("kiln", "base", "build")
    session.run("kiln", "base", "build", "--platform", "linux/arm64")
    session.run(
        "python",
        "benchmarks/build_cuda.py",
        "--platform",
        "linux/arm64",
        *session.posargs,
        env={"PYTHONUNBUFFERED": "1"},
    )


if os.environ.get("KILN_NOX_DEBUG"):
    nox.options.verbose = True


# --- draft_trunc sessions ---
# Opt-in (not in nox.options.sessions): they need a CUDA GPU and run with the
# current interpreter, whose torch/triton are the GPU machine's own.
@nox.session(python=False)
def gpu(session):
    """draft_trunc's GPU tests (kernel at size, exactness vs vLLM 0.32.0's, 0.33.0's and
    0.34.0's rejection samplers, CUDA-graph replay); skipped cleanly without a GPU.
    KILN_VLLM_SRC_0_32_0 / _0_33_0 / _0_34_0 may point at each version's sources."""
    session.run("python", "-m", "pytest", "tests/draft_trunc", "-m", "gpu", "-q", *session.posargs)


@nox.session(python=False)
def bench_gpu(session):
    """draft_trunc's MoE-layer and mark_dead benchmark on the local GPU (JSON out)."""
    session.run(
        "python",
        "benchmarks/draft_trunc/bench_moe.py",
        *session.posargs,
        env={"PYTHONUNBUFFERED": "1"},
    )


@nox.session(python=False)
def sim_trunc(session):
    """draft_trunc policies replayed on acceptance traces (synthetic + recorded):
    tokens/s and accepted tokens per step at 1-512 requests; JSON + PNG in
    benchmarks/draft_trunc/results/, ratios printed. CPU only, ~45 s."""
    session.run(
        "python",
        "benchmarks/draft_trunc/sim_trunc.py",
        *session.posargs,
        env={"PYTHONUNBUFFERED": "1"},
    )


@nox.session(python=False)
def sim_adaptive(session):
    """draft-trunc against vLLM's own adaptive speculation: the same steps
    under vLLM's batch-size schedule, its best K, its adaptive verification, a confidence
    exit, draft-trunc on top of each and with its drafting depth, and adaptive
    verification fed draft-trunc's calibration (kiln-av, its hook priced from
    bench_av.py's measurement: `-- --av-hook eager|compiled|fused|none`), drafting priced
    (results-draft-fit.json); ratios printed, JSON + PNG in
    benchmarks/draft_trunc/results/. CPU only, ~5 min per drafter."""
    session.run(
        "python",
        "benchmarks/draft_trunc/sim_adaptive.py",
        *session.posargs,
        env={"PYTHONUNBUFFERED": "1"},
    )


@nox.session(python=False)
def gpu_twin(session):
    """Opt-in: everything the lent GPU needs to serve a CUDA recipe (default glm53-kindling)
    with its patched vLLM: sources through kiln's applier, the stable-ABI op libraries,
    kiln-engine and requirements/gpu-twin.lock's wheels, split into .gpu-twin/call-N folders
    that each fit one device call; prints the calls to make (docs/draft-trunc.md, "The GPU
    twin"). `-- RECIPE --relock` re-resolves the lock first."""
    session.run("python", "benchmarks/gpu_twin/prepare.py", *session.posargs, env={"PYTHONUNBUFFERED": "1"})


@nox.session(python=False)
def gpu_twin_report(session):
    """A GPU-twin run's gpu-twin-results.json judged with the CPU twin's lossless rules:
    Markdown table, JSON summary and PNG plot in benchmarks/gpu_twin/results/."""
    session.run("python", "benchmarks/gpu_twin/analyse.py", *session.posargs)


@nox.session(python=False)
def gpu_twin_model(session):
    """sim_adaptive's step accounting against a GPU-twin run: step costs fitted
    to its spec-off and spec loads, every other configuration's tokens/s predicted from
    what it verified, compared with what it served; JSON, Markdown and PNG (`-model`) in
    benchmarks/gpu_twin/results/. `-- RESULTS.json[.xz]`; CPU only, seconds."""
    session.run("python", "benchmarks/gpu_twin/model_check.py", *session.posargs)


@nox.session(python=False)
def gpu_scale(session):
    """The scale twin: one rank's slice of each named CUDA recipe (default glm53-kindling),
    its own launch command adapted with every change listed, into .gpu-scale/plan.json;
    prints the device command (benchmarks/gpu_twin/scale_runner.py) that serves it on the
    GPU twin's parts (`nox -s gpu_twin` first). `-- RECIPE ... [--attention mla]`."""
    session.run("python", "benchmarks/gpu_twin/scale_plan.py", *session.posargs)


# --- end draft_trunc sessions ---
