"""A recipe whose base image lives in a registry, pinned by digest (how users with a
registry build): kiln pulls it by digest, with credentials, and builds on it."""

from __future__ import annotations

import io
import tarfile

import pytest
from kilntest import make_tree, remove_images, run_kiln

pytestmark = [pytest.mark.docker, pytest.mark.registry]


def _unique_base(docker_daemon, base_image: str, marker: str) -> str:
    """kiln/base plus one label: its own image id, so deleting it locally forces a pull."""
    dockerfile = f"FROM {base_image}\nLABEL ai.kiln.test.base={marker}\n".encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
    buf.seek(0)
    image, _ = docker_daemon.client.images.build(fileobj=buf, custom_context=True, rm=True)
    return image.id


def test_registry_base_by_digest_is_pulled_and_built_on(fresh_registry, docker_daemon, base_image, tmp_path):
    reg = fresh_registry
    image_id = _unique_base(docker_daemon, base_image, reg.password[-8:])
    ref = f"{reg.host}/mirror/debian"
    docker_daemon.tag(image_id, f"{ref}:bookworm")
    pushed = docker_daemon.client.api.push(
        ref, tag="bookworm", auth_config={"username": reg.user, "password": reg.password}
    )
    assert "error" not in pushed.lower(), pushed
    digest = next(d for d in docker_daemon.client.images.get(image_id).attrs["RepoDigests"] if d.startswith(ref))
    digest = digest.split("@", 1)[1]
    docker_daemon.client.images.remove(image_id, force=True)  # gone locally: the build must pull
    tree = make_tree(tmp_path / "tree")
    recipe = tree / "recipes" / "kiln-test-mini" / "recipe.yaml"
    recipe.write_text(
        recipe.read_text().replace("    ref: kiln/base:bookworm\n", f"    ref: {ref}:bookworm\n    digest: {digest}\n")
    )
    remove_images(docker_daemon, "kiln/kiln-test-mini")
    try:
        # env credentials reach a base image's registry only where KILN_REGISTRY_HOST names it
        env = {"KILN_ROOT": str(tree), "KILN_REGISTRY_HOST": reg.host, **reg.env()}
        result = run_kiln("build", "kiln-test-mini", env=env, cwd=tree)
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"pulled {ref}@{digest}" in result.stderr
        from kiln.basics import paths

        paths.repo_root.cache_clear()
        labels = docker_daemon.image("kiln/kiln-test-mini:latest").labels
        assert labels["ai.kiln.engine.input-digest"]
        engine = docker_daemon.image(labels["ai.kiln.engine.image"])
        assert engine.labels["ai.kiln.base-image"] == f"{ref}@{digest}"
        assert reg.password not in result.stderr + result.stdout
    finally:
        remove_images(docker_daemon, "kiln/kiln-test-mini")
        remove_images(docker_daemon, ref)


def test_unpullable_registry_base_is_a_clear_error(fresh_registry, tmp_path):
    tree = make_tree(tmp_path / "tree")
    recipe = tree / "recipes" / "kiln-test-mini" / "recipe.yaml"
    ref = f"{fresh_registry.host}/mirror/nothing-here"
    recipe.write_text(
        recipe.read_text().replace(
            "    ref: kiln/base:bookworm\n", f"    ref: {ref}:x\n    digest: sha256:{'0' * 64}\n"
        )
    )
    result = run_kiln("build", "kiln-test-mini", env={"KILN_ROOT": str(tree), **fresh_registry.env()}, cwd=tree)
    assert result.returncode == 4, result.stderr[-3000:]
    assert f"base image {ref}@sha256:{'0' * 64} is not local and could not be pulled" in result.stderr
