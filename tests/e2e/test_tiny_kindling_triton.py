"""tiny-kindling's triton came in the one way every wheel does: locked in
recipes/tiny-kindling/recipe.lock.json, fetched and hash-checked on the host, installed
from the build context offline. The built image has triton 3.9.0 where the old
Dockerfile put it (the engine venv's site-packages), keeps neither the wheels nor the
lock's files, and its SBOM gives triton the lock's wheel hash and names the lock; the
stage that installs it builds with networking off. (test_twin_metrics.py serves the
same image.)"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

# with test_tiny_kindling.py, beside the daemon group (tests/kilntest.py)
pytestmark = [pytest.mark.e2e, pytest.mark.docker, pytest.mark.xdist_group("tiny-kindling")]

SITE = "/opt/kiln/venv/lib/python3.11/site-packages"
PROBE = f"""
import glob, json, os, triton
print(json.dumps({{
    "version": triton.__version__, "file": triton.__file__,
    "record_missing": [p for p in (ln.split(",")[0] for ln in open("{SITE}/triton-3.9.0.dist-info/RECORD"))
                       if not os.path.exists(os.path.normpath(os.path.join("{SITE}", p)))],
    "left": sorted(glob.glob("/tmp/wheels") + glob.glob("/tmp/kiln-lock") + glob.glob("/tmp/uv")
                   + glob.glob("/opt/**/*.whl", recursive=True) + glob.glob("/tmp/**/*.whl", recursive=True)),
}}))
"""


def test_triton_3_9_0_is_in_the_engine_venv_and_nothing_of_its_install_is_left(tiny_kindling):
    out = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python", tiny_kindling.image.id, "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["version"] == "3.9.0"
    assert found["file"] == f"{SITE}/triton/__init__.py"
    assert found["record_missing"] == [], "every file uv recorded is where its RECORD says"
    assert found["left"] == [], "the wheels, the lock's files and uv stay in the builder stage"


def test_the_sbom_hashes_triton_from_the_recipe_lock(tiny_kindling, docker_daemon):
    from kiln.domain.locks import recipe_lock
    from kiln.domain.supplychain import sbom

    loaded = tiny_kindling.loaded
    lock = recipe_lock.committed(loaded)
    assert lock is not None
    wheel = lock.lock.locked_wheel("linux/amd64", "triton", "3.9.0")
    assert wheel is not None
    doc = sbom.build_sbom(docker_daemon, loaded, tiny_kindling.image)
    (triton,) = [c for c in doc["components"] if c["name"] == "triton"]
    props = {p["name"]: p["value"] for p in triton["properties"]}
    assert triton["hashes"] == [{"alg": "SHA-256", "content": wheel.sha256}]
    assert props["kiln:lock:file"] == "recipes/tiny-kindling/recipe.lock.json"
    assert props["kiln:lock:wheel"] == wheel.file
    assert props["kiln:python:location"] == SITE
    meta = {p["name"]: p["value"] for p in doc["metadata"]["properties"]}
    assert meta["kiln:recipe-lock"] == f"recipes/tiny-kindling/recipe.lock.json sha256:{lock.sha256}"


def test_the_triton_stage_builds_with_no_network_at_all(tiny_kindling, tmp_path):
    """Air-gapped: tiny-kindling's build context as kiln makes it (the locked wheels
    fetched and hash-checked on the host), its triton stage built by the legacy builder
    with networking off and no layer cache: every wheel comes from the context."""
    from kiln.domain.images.definitions import resolve

    recipe_image = resolve("tiny-kindling").recipe_image
    assert next(w.name for w in recipe_image.add_wheels()).startswith("triton-3.9.0-")
    tar = tmp_path / "context.tar"
    with tar.open("wb") as fh:
        recipe_image.context.write_tar(fh)
    tag = "kiln-test/tiny-kindling-triton-offline:stage"
    try:
        with tar.open("rb") as fh:
            out = subprocess.run(
                [
                    "docker",
                    "build",
                    "--network",
                    "none",
                    "--no-cache",
                    "--target",
                    "triton",
                    "-t",
                    tag,
                    "--build-arg",
                    f"KILN_ENGINE_IMAGE={recipe_image.buildargs()['KILN_ENGINE_IMAGE']}",
                    "-",
                ],
                stdin=fh,
                capture_output=True,
                text=True,
                timeout=900,
                env={**os.environ, "DOCKER_BUILDKIT": "0"},
                check=False,
            )
        assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
        assert "kiln-lock-tool: 2 wheels match the lock" in out.stdout
        listed = subprocess.run(
            [
                "docker",
                "run",
                "--rm",
                "--network",
                "none",
                "--entrypoint",
                "python",
                tag,
                "-c",
                "import os; print(sorted(os.listdir('/opt/triton/lib/python3.11/site-packages')))",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert listed.returncode == 0, listed.stderr[-2000:]
        assert listed.stdout.strip() == "['triton', 'triton-3.9.0.dist-info']"
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=300, check=False)
