"""A custom CA bundle in real builds: trusted while building, in no layer of the image; a bad
bundle refused."""

from __future__ import annotations

import subprocess

import pytest
from kilntest import remove_images, run_kiln, saved_image
from mini_build import NAME, resolve

pytestmark = pytest.mark.docker


def _make_ca(tmp_path):
    """A throwaway CA whose PEM must never appear in an image layer."""
    key, crt = tmp_path / "ca.key", tmp_path / "ca.crt"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=kiln-test-proxy-ca",
            "-keyout",
            str(key),
            "-out",
            str(crt),
        ],
        check=True,
        capture_output=True,
    )
    return crt


def _layer_blobs(docker_daemon, ref: str):
    """Every file of every layer of `docker save REF`, as (layer, path, bytes)."""
    with saved_image(docker_daemon, ref) as image:
        yield "config", "config.json", image.config
        for layer, member, tar in image.members():
            if member.isfile():
                yield layer, member.name, tar.extractfile(member).read()


def test_custom_ca_is_trusted_in_builds_and_absent_from_every_layer(kiln_tree, base_image, docker_daemon, tmp_path):
    ca = _make_ca(tmp_path)
    system = (
        subprocess.run(
            ["python3", "-m", "pip", "config", "get", "global.cert"], capture_output=True, text=True, check=False
        ).stdout.strip()
        or "/etc/ssl/certs/ca-certificates.crt"
    )
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(ca.read_bytes() + open(system, "rb").read())
    pem_body = b"".join(ca.read_bytes().splitlines()[1:-1])[:120]
    remove_images(docker_daemon, f"kiln/{NAME}")
    env = {"KILN_ROOT": str(kiln_tree), "KILN_CA_BUNDLE": str(bundle)}
    result = run_kiln("build", NAME, "--force", "--force-engine", env=env, cwd=kiln_tree)
    try:
        assert result.returncode == 0, result.stderr[-3000:]
        assert "CA: KILN_CA_BUNDLE" in result.stderr
        resolved = resolve()
        engine_image, recipe_image = resolved.engine_image, resolved.recipe_image
        for ref in (recipe_image.tag, engine_image.tag):
            for layer, path, data in _layer_blobs(docker_daemon, ref):
                flat = b"".join(data.splitlines())
                assert pem_body not in flat, f"CA found in {ref} {layer}:{path}"
                assert "kiln-ca" not in path, f"CA file left in {ref} {layer}:{path}"
    finally:
        remove_images(docker_daemon, f"kiln/{NAME}")


def test_bad_ca_bundle_is_refused(kiln_tree, tmp_path):
    bad = tmp_path / "not-a-cert.pem"
    bad.write_text("hello\n")
    result = run_kiln(
        "build", NAME, "--force", "--ca-bundle", str(bad), env={"KILN_ROOT": str(kiln_tree)}, cwd=kiln_tree
    )
    assert result.returncode == 19, result.stderr
    assert "not a PEM certificate bundle" in result.stderr
