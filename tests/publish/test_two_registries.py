"""Credentials stay with their registry: a recipe whose base image lives on registry A
(credentials in the docker config) is built and published to registry B (credentials
in KILN_REGISTRY_*). Both registries log every user that authenticated or tried to,
so each log shows its own user and never the other's."""

from __future__ import annotations

import base64
import json

import pytest
from kilntest import make_tree, passing_smoke_record, remove_images, run_kiln
from localregistry import LocalRegistry
from test_registry_base import _unique_base

pytestmark = [pytest.mark.docker, pytest.mark.registry]
NAME = "kiln-test-tworeg"


def test_base_from_a_with_docker_config_published_to_b_with_env(
    registry_tools, docker_daemon, base_image, tmp_path, monkeypatch
):
    a = LocalRegistry(tmp_path / "a", log_level="debug").start()
    b = LocalRegistry(tmp_path / "b", log_level="debug").start()
    ref = f"{a.host}/mirror/debian"
    image_id = _unique_base(docker_daemon, base_image, a.password[-8:])
    try:
        digest = _push_base(docker_daemon, a, image_id, ref)
        tree = _tree(tmp_path / "tree", f"{ref}:bookworm", digest)
        config = tmp_path / "docker-config"
        config.mkdir()
        pair = base64.b64encode(f"{a.user}:{a.password}".encode()).decode()
        (config / "config.json").write_text(json.dumps({"auths": {a.host: {"auth": pair}}}))
        env = {
            "KILN_ROOT": str(tree),
            "KILN_RESULTS_DIR": str(tmp_path / "results"),
            "DOCKER_CONFIG": str(config),
            **b.env(),
        }

        built = run_kiln("build", NAME, env=env, cwd=tree)
        assert built.returncode == 0, built.stderr[-3000:]
        assert f"pulled {ref}@{digest}" in built.stderr
        _pass_smoke(monkeypatch, tree, tmp_path / "results")
        published = run_kiln("publish", NAME, "--registry", b.host, env=env, cwd=tree)
        assert published.returncode == 0, published.stderr[-3000:]
        assert b.tags("two/mini")  # both steps really happened

        a_log, b_log = a.log_text(), b.log_text()
        assert a.user in a_log and b.user in b_log  # the logs do name users
        assert b.user not in a_log, "registry A was sent the publish credentials"
        assert a.user not in b_log, "registry B was sent the base image's credentials"
        for run in (built, published):
            assert not any(s in run.stdout + run.stderr for s in a.secrets() + b.secrets())
    finally:
        remove_images(docker_daemon, f"kiln/{NAME}")
        remove_images(docker_daemon, ref)
        a.stop()
        b.stop()


def _push_base(docker_daemon, reg: LocalRegistry, image_id: str, ref: str) -> str:
    """Push the base to `reg`, then drop it locally so the build has to pull it."""
    docker_daemon.tag(image_id, f"{ref}:bookworm")
    out = docker_daemon.client.api.push(
        ref, tag="bookworm", auth_config={"username": reg.user, "password": reg.password}
    )
    assert "error" not in out.lower(), out
    pinned = next(d for d in docker_daemon.client.images.get(image_id).attrs["RepoDigests"] if d.startswith(ref))
    docker_daemon.client.images.remove(image_id, force=True)
    return pinned.split("@", 1)[1]


def _tree(dest, base_ref: str, digest: str):
    tree = make_tree(dest)
    recipe_dir = tree / "recipes" / NAME
    (tree / "recipes" / "kiln-test-mini").rename(recipe_dir)
    recipe = recipe_dir / "recipe.yaml"
    text = recipe.read_text().replace("name: kiln-test-mini\n", f"name: {NAME}\n", 1)
    text = text.replace("    ref: kiln/base:bookworm\n", f"    ref: {base_ref}\n    digest: {digest}\n")
    recipe.write_text(text + "\npublish:\n  repository: two/mini\n")
    return tree


def _pass_smoke(monkeypatch, tree, results) -> None:
    """A smoke record for the built image (publishing needs one; the smoke run itself is
    tested elsewhere)."""
    import datetime as dt

    from kiln.basics import paths
    from kiln.domain.images.definitions import resolve
    from kiln.infra.records import write_smoke_record

    monkeypatch.setenv("KILN_ROOT", str(tree))
    monkeypatch.setenv("KILN_RESULTS_DIR", str(results))
    paths.repo_root.cache_clear()
    try:
        from kiln.infra.docker import DockerDaemon

        recipe_image = resolve(NAME).recipe_image
        image = DockerDaemon().image(recipe_image.tag)
        write_smoke_record(
            passing_smoke_record(image.id, NAME, time=dt.datetime.now(dt.UTC).isoformat(), note="test_two_registries")
        )
    finally:
        paths.repo_root.cache_clear()
