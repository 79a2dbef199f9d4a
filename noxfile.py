"""kiln's test and benchmark sessions.

Sessions run in the environment `make setup` prepared (system packages, a running
Docker daemon, `pip install -e .[dev] -e engine -e testkit`), not in fresh virtualenvs: the tests
drive the real daemon, registry and vLLM images, which no venv can isolate anyway.
`nox` with no arguments runs the default sessions; that is what `make test` and CI run.
"""

import os

import nox

nox.options.default_venv_backend = "none"
nox.options.sessions = ["lint", "tests", "e2e"]
if os.environ.get("CI"):  # a CI machine's daemon is ours to restart; a developer's is not
    nox.options.sessions.append("disruptive")
nox.options.error_on_missing_interpreters = True

PYTEST = ["python", "-m", "pytest", "-p", "no:cacheprovider"]


@nox.session
def lint(session):
    """ruff over the harness, the engine package and the tests; the import contract."""
    session.run("ruff", "check", "src", "engine", "tests", "noxfile.py", "benchmarks")
    session.run("lint-imports")  # the layers of docs/architecture.md
    session.run("mypy")  # src/, engine/, testkit/ as [tool.mypy] in pyproject.toml says, 0 errors


@nox.session
def tests(session):
    """Unit tests plus real-daemon builds of small images, patches against real vLLM
    sources, registry tests (everything except the vLLM end-to-end run)."""
    session.run(*PYTEST, "-m", "not e2e and not gpu and not disruptive", *session.posargs)


@nox.session
def e2e(session):
    """Build engine-cpu and tiny-moe from scratch (reusing the daemon's layer cache),
    serve it, smoke it with the OpenAI client, publish it to a local registry."""
    session.run(*PYTEST, "-m", "e2e", *session.posargs)


@nox.session
def disruptive(session):
    """Opt-in: restarts the Docker daemon in the middle of a build (stops every running
    container on it), as root, where scripts/setup.sh started dockerd."""
    session.run(*PYTEST, "-m", "disruptive", *session.posargs)


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


if os.environ.get("KILN_NOX_DEBUG"):
    nox.options.verbose = True


# --- draft_trunc sessions (issue 5) ---
# Opt-in (not in nox.options.sessions): they need a CUDA GPU and run with the
# current interpreter, whose torch/triton are the GPU machine's own.
@nox.session(python=False)
def gpu(session):
    """draft_trunc's GPU tests (kernel at size, exactness vs vLLM 0.32.0's and 0.33.0's
    rejection samplers, CUDA-graph replay); skipped cleanly without a GPU.
    KILN_VLLM_SRC_0_32_0 / KILN_VLLM_SRC_0_33_0 may point at each version's sources."""
    session.run("python", "-m", "pytest", "tests/draft_trunc", "-m", "gpu", "-q", *session.posargs)


@nox.session(python=False)
def bench_gpu(session):
    """draft_trunc's MoE-layer and mark_dead benchmark on the local GPU (JSON out)."""
    session.run(
        "python", "benchmarks/draft_trunc/bench_moe.py", *session.posargs,
        env={"PYTHONUNBUFFERED": "1"},
    )


@nox.session(python=False)
def sim_trunc(session):
    """draft_trunc policies replayed on acceptance traces (synthetic + recorded):
    tokens/s and accepted tokens per step at 1-512 requests; JSON + PNG in
    benchmarks/draft_trunc/results/, ratios printed. CPU only, ~45 s."""
    session.run(
        "python", "benchmarks/draft_trunc/sim_trunc.py", *session.posargs,
        env={"PYTHONUNBUFFERED": "1"},
    )
# --- end draft_trunc sessions ---
