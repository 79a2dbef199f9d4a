"""`kiln rebuild --verify`: an honest image rebuilds to itself; an image built from a
tree that differs from its recorded commit by one byte is caught, with the layer and
the file named."""

from __future__ import annotations

import json
import subprocess

import pytest
from kilntest import remove_images, run_kiln

pytestmark = pytest.mark.docker

NAME = "kiln-test-mini"


def _git(tree, *args):
    subprocess.run(["git", "-C", str(tree), *args], check=True, capture_output=True)


def _build(tree) -> str:
    result = run_kiln("build", NAME, "--force", "--json", env={"KILN_ROOT": str(tree)}, cwd=tree)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)["image_id"]


def test_rebuild_verify_passes_an_honest_image_and_names_a_changed_file(kiln_tree, base_image, docker_daemon):
    _git(kiln_tree, "init", "-q")
    _git(kiln_tree, "-c", "user.name=t", "-c", "user.email=t@e", "add", "-A")
    _git(kiln_tree, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "inputs")
    remove_images(docker_daemon, f"kiln/{NAME}")
    try:
        honest = _build(kiln_tree)
        labels = docker_daemon.image(honest).labels
        commit = subprocess.run(
            ["git", "-C", str(kiln_tree), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
        assert labels["org.opencontainers.image.revision"] == commit
        ok = run_kiln("rebuild", honest, "--verify", "--reuse-engine", env={"KILN_ROOT": str(kiln_tree)}, cwd=kiln_tree)
        assert ok.returncode == 0, ok.stderr[-3000:]
        assert "the same image" in ok.stderr

        # a build host whose tree is not the commit it claims: one byte of the payload
        payload = kiln_tree / "recipes" / NAME / "payload.txt"
        data = bytearray(payload.read_bytes())
        data[0] ^= 0x20
        payload.write_bytes(bytes(data))
        _git(kiln_tree, "update-index", "--assume-unchanged", f"recipes/{NAME}/payload.txt")
        tampered = _build(kiln_tree)
        assert tampered != honest
        assert docker_daemon.image(tampered).labels["org.opencontainers.image.revision"] == commit
        bad = run_kiln(
            "rebuild", tampered, "--verify", "--reuse-engine", env={"KILN_ROOT": str(kiln_tree)}, cwd=kiln_tree
        )
        assert bad.returncode == 31, bad.stderr[-3000:]
        line = next(ln for ln in bad.stderr.splitlines() if ln.startswith("kiln: error:"))
        assert "first difference: layer" in line and "opt/payload.txt" in line and "content" in line, line
        assert not [t for img in docker_daemon.images() for t in img.tags if t.startswith("kiln-verify/")]
    finally:
        remove_images(docker_daemon, f"kiln/{NAME}")
