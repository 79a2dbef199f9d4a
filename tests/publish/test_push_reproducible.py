"""A push of the same image gives the same manifest digest: the image is built, pushed
to registry A, removed, rebuilt with the layer cache off, and pushed to registry B
(another host, so the daemon cannot mount or reuse A's blobs: it compresses every layer
again). Same image id, same compressed blobs, same manifest digest."""

from __future__ import annotations

import json

import pytest
from kilntest import remove_images, run_kiln
from localregistry import LocalRegistry

pytestmark = [pytest.mark.docker, pytest.mark.registry]
NAME = "kiln-test-mini"


def _build(tree) -> str:
    result = run_kiln("build", NAME, "--force", "--no-cache", "--json", env={"KILN_ROOT": str(tree)}, cwd=tree)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)["image_id"]


def _push(docker_daemon, reg: LocalRegistry, image_id: str) -> tuple[str, dict]:
    ref = f"{reg.host}/repro/mini"
    docker_daemon.tag(image_id, f"{ref}:v1")
    pushed = docker_daemon.push(f"{ref}:v1", auth_config={"username": reg.user, "password": reg.password}, quiet=True)
    assert pushed.layers_existing == 0  # every layer compressed and uploaded here
    found = reg.manifest("repro/mini", "v1")
    assert found is not None
    digest, manifest = found
    assert digest == pushed.digest
    return digest, manifest


def test_the_same_image_pushed_after_a_rebuild_has_the_same_manifest_digest(
    registry_tools, kiln_tree, base_image, docker_daemon, tmp_path
):
    a = LocalRegistry(tmp_path / "a").start()
    b = LocalRegistry(tmp_path / "b").start()
    try:
        first = _build(kiln_tree)
        digest_a, manifest_a = _push(docker_daemon, a, first)
        remove_images(docker_daemon, f"kiln/{NAME}")
        docker_daemon.remove_image(f"{a.host}/repro/mini:v1")
        second = _build(kiln_tree)
        assert second == first
        digest_b, manifest_b = _push(docker_daemon, b, second)
        assert manifest_b["config"]["digest"] == first
        assert [ly["digest"] for ly in manifest_b["layers"]] == [ly["digest"] for ly in manifest_a["layers"]]
        assert digest_b == digest_a
    finally:
        remove_images(docker_daemon, f"kiln/{NAME}")
        for reg in (a, b):
            docker_daemon.remove_image(f"{reg.host}/repro/mini:v1")
            reg.stop()
