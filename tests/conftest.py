"""Shared fixtures: a real Docker daemon, the kiln base image, and throwaway kiln trees."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kilntest import assign_xdist_groups, make_tree, run_kiln

pytest_plugins = ["unitguard"]  # `pytest --unit`: the unit tier and its guard (tests/unitguard.py)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into node ids
def pytest_collection_modifyitems(config, items):
    assign_xdist_groups(config.rootpath, items)  # what may run beside what: kilntest.py


@pytest.fixture(scope="session")
def docker_daemon(request):
    if request.config.getoption("unit"):  # tests/unitguard.py
        pytest.fail(
            "the unit tier has no Docker daemon: this test uses docker_daemon, so it needs "
            "pytestmark = pytest.mark.docker",
            pytrace=False,
        )
    from kiln.basics.errors import KilnError
    from kiln.infra.docker import DockerDaemon

    try:
        engine = DockerDaemon()
        engine.ping()
    except KilnError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs a Docker daemon: {exc.message}")
        pytest.skip(f"no Docker daemon: {exc.message}")
    return engine


@pytest.fixture(scope="session")
def base_image(docker_daemon) -> str:
    from kiln.usecases.base_image import build_base as _build_base

    tag = "kiln/base:bookworm"
    if docker_daemon.image(tag) is None:
        _build_base(docker_daemon)
    return tag


@pytest.fixture(scope="session")
def tiny_moe(docker_daemon, base_image):
    """(loaded recipe, RecipeImage, docker Image) of tiny-moe, built by the real CLI (a
    no-op when the daemon already has an image for these inputs)."""
    from kiln.domain.images.definitions import require_built

    result = run_kiln("build", "tiny-moe")
    assert result.returncode == 0, result.stderr[-4000:]
    return require_built(docker_daemon, "tiny-moe")


@pytest.fixture(scope="session")
def tiny_kindling(docker_daemon, base_image):
    """BuiltRecipe (loaded recipe, RecipeImage, docker Image) of tiny-kindling (the CPU twin of
    glm53-kindling), built by the real CLI; shares engine-cpu with tiny-moe."""
    from kiln.domain.images.definitions import require_built

    result = run_kiln("build", "tiny-kindling")
    assert result.returncode == 0, result.stderr[-4000:]
    return require_built(docker_daemon, "tiny-kindling")


@pytest.fixture
def kiln_tree(tmp_path, monkeypatch) -> Path:
    from kiln.basics import paths

    root = make_tree(tmp_path / "tree")
    monkeypatch.setenv("KILN_ROOT", str(root))
    monkeypatch.setenv("KILN_RESULTS_DIR", str(tmp_path / "results"))
    paths.repo_root.cache_clear()
    yield root
    paths.repo_root.cache_clear()


@pytest.fixture(scope="module")
def no_docker(tmp_path_factory):
    """No Docker daemon, on purpose: DOCKER_HOST names a socket that does not exist, so
    kiln (and the `kiln` child processes of run_kiln) take their "daemon absent" path on
    every machine, whatever the host's daemon holds. For the daemon-optional commands
    (`check`, `run --print`, `render k8s`, `doctor`) in unit tests: the unit tier's
    guard fails a test that reaches for the host's daemon instead. Module-scoped so
    that module-scoped fixtures of those tests see it too."""
    sock = tmp_path_factory.mktemp("no-docker") / "no-docker.sock"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DOCKER_HOST", f"unix://{sock}")
        yield sock
