"""The real CUDA engine and glm53-kindling, built on this machine (opt-in: multi-GB)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.docker]


@pytest.fixture(scope="module")
def built(cuda_build_enabled, docker_daemon, base_image):
    from kiln.domain.images.definitions import resolve
    from kiln.domain.recipes.resolved import resolve_recipe
    from kiln.usecases.build import build_recipe

    outcome = build_recipe(resolve_recipe("glm53-kindling"), docker=docker_daemon, quiet_summary=True)
    resolved = resolve("glm53-kindling")
    loaded, engine_image = resolved.loaded, resolved.engine_image
    return loaded, engine_image, docker_daemon.client.images.get(outcome.image_id)


def test_labels_are_read_from_the_image_and_match_the_recipe(built):
    loaded, _, image = built
    labels = image.labels
    assert labels["ai.kiln.engine.torch"].split("+")[0] == loaded.recipe.engine.torch
    assert labels["ai.kiln.engine.cuda"] == loaded.recipe.engine.cuda
    assert labels["ai.kiln.engine.nccl"].count(".") == 2


def test_patched_runner_and_kiln_engine_import_on_cpu(built, docker_daemon):
    _, _, image = built
    out = docker_daemon.client.containers.run(
        image.id,
        entrypoint=[
            "python",
            "-c",
            # workers load kiln-engine's plugin (it registers draft_trunc) first
            (
                "from vllm.plugins import load_general_plugins; load_general_plugins(); "
                "import vllm, kiln_engine, vllm.v1.worker.gpu.model_runner as m, inspect; "
                "assert 'draft_trunc' in inspect.getsource(m); print('ok')"
            ),
        ],
        remove=True,
        network_disabled=True,
    )
    assert out.decode().strip().endswith("ok")


def test_launch_args_accepted_by_the_built_engine(built):
    from kiln.domain.imagecheck import launch_checker
    from kiln.domain.recipes.resolved import ResolvedRecipe

    loaded, _, _ = built
    checked = launch_checker.check_launch(ResolvedRecipe(loaded))
    assert checked.problems == []
    assert checked.checked_by is not None and checked.checked_by.startswith("engine image ")


def test_image_runs_as_non_root_without_ca_or_pip(built, docker_daemon):
    _, _, image = built
    assert image.attrs["Config"]["User"] == "kiln"
    out = docker_daemon.client.containers.run(
        image.id,
        entrypoint=[
            "sh",
            "-c",
            (
                "ls -d /tmp/kiln-ca.crt /tmp/wheels /root/.cache/pip "
                "/home/kiln/.cache/pip 2>&1; python -c 'import pip' 2>&1 | tail -1; true"
            ),
        ],
        remove=True,
        network_disabled=True,
        user="root",
    ).decode()  # root: /root is not kiln's to read
    assert out.count("No such file") == 4, out
    assert "No module named 'pip'" in out
