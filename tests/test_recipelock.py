"""A recipe's own Python packages (build.python_packages) through a lock, as the engine's
wheels come (unit tier, no network): tiny-kindling's committed recipe.lock.json, what
its build context carries from it, what `kiln check` and a build say when it is missing,
stale or at odds with the engine lock, the hash check of its wheels on the host, and the
recipe fields' own validation."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml
from kilntest import REPO

from kiln.basics.errors import LockInvalid, LockMissing, RecipeInvalid, WheelHashMismatch
from kiln.domain.images.definitions import RecipeImage
from kiln.domain.images.engine_image import EngineImage
from kiln.domain.locks import engine_lock as L
from kiln.domain.locks import recipe_lock
from kiln.domain.recipes.recipe import LoadedRecipe, load_recipe
from kiln.domain.recipes.resolved import ResolvedRecipe

AMD64 = "linux/amd64"
NAME = "tiny-kindling"
# the wheel the old Dockerfile fetched by URL, with the sha256 it pinned there
TRITON = (
    "triton-3.9.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
    "1622118a038b0c6e16fa4a0305da62c8b3c15904ee1cc4d4e65846a25969e41e",
)


def _engine_lock():
    return L.load(L.lock_path(L.engine_image_dir("cpu"), "vllm", "0.32.0"))


def _context(loaded: LoadedRecipe):
    return RecipeImage(ResolvedRecipe(loaded), EngineImage(loaded.recipe.engine, None)).context


# -- the committed lock ------------------------------------------------------------------
def test_tiny_kindling_locks_the_triton_wheel_the_dockerfile_used_to_fetch():
    loaded = load_recipe(REPO / "recipes" / NAME)
    assert loaded.recipe.build.python_packages == ["triton==3.9.0"]
    path = recipe_lock.lock_path(loaded.dir)
    lock = recipe_lock.for_recipe(loaded)
    assert lock is not None and path.read_text() == lock.dumps(), "canonical form (re-lock)"
    (triton,) = lock.python_packages
    assert (triton.name, triton.version) == ("triton", "3.9.0")
    assert (triton.wheels[AMD64].file, triton.wheels[AMD64].sha256) == TRITON
    # installed by the engine's own uv, and onto the engine it was resolved against
    engine = _engine_lock()
    assert lock.tools["uv"] == engine.tools["uv"]
    assert (lock.engine_name, lock.engine_version) == (engine.engine_name, engine.engine_version)
    assert "triton" in engine.excluded and engine.package("triton") is None
    assert recipe_lock.problems(loaded) == []


def test_the_context_carries_the_lock_and_its_requirement_files_in_the_digest():
    loaded = load_recipe(REPO / "recipes" / NAME)
    files = {name: sha for name, _, sha in _context(loaded).manifest()}
    assert files["recipe.lock.json"] == hashlib.sha256(recipe_lock.lock_path(loaded.dir).read_bytes()).hexdigest()
    entries = {e.arcname: e for e in _context(loaded).entries}
    assert entries["_kiln/lock/python.txt"].content().decode() == f"triton==3.9.0 --hash=sha256:{TRITON[1]}\n"
    wheels = entries["_kiln/lock/wheels.txt"].content().decode().splitlines()
    assert wheels[0] == f"{TRITON[0]} {TRITON[1]} triton 3.9.0" and wheels[1].startswith("uv-0.13.9-")
    assert entries["_kiln/lock/uv.txt"].content().decode().startswith("uv-0.13.9-")
    assert {"_kiln/lock/python.txt", "_kiln/lock/wheels.txt", "_kiln/lock/uv.txt"} <= set(files)


def test_a_recipe_without_packages_gets_nothing_of_it():
    """tiny-moe's context (and so its input digest and the README's image id) stays as it was."""
    loaded = load_recipe(REPO / "recipes" / "tiny-moe")
    assert recipe_lock.for_recipe(loaded) is None and recipe_lock.problems(loaded) == []
    assert not [e.arcname for e in _context(loaded).entries if e.arcname.startswith(("_kiln/lock", "_kiln/wheels"))]
    image = RecipeImage(ResolvedRecipe(loaded), EngineImage(loaded.recipe.engine, None))
    assert image.add_wheels() == [] and "ai.kiln.recipe-lock" not in image.labels()


# -- a copy of the recipe, broken one way at a time ---------------------------------------
@pytest.fixture
def twin(tmp_path) -> Path:
    """tiny-kindling in a recipes/ folder of its own (with the recipe it shares its override
    with, and the shared generator)."""
    root = tmp_path / "recipes"
    for name in (NAME, "glm53-kindling", "_shared"):
        shutil.copytree(REPO / "recipes" / name, root / name)
    return root / NAME


def _edit_lock(folder: Path, change) -> None:
    """The lock with one change, its requirements' digest recomputed as a re-lock would
    write it (the reader refuses a digest that does not match)."""
    from kiln.domain.locks.lock_records import Resolved

    path = folder / recipe_lock._FILE
    doc = json.loads(path.read_text())
    change(doc)
    doc["resolved_from"]["sha256"] = Resolved(doc["resolved_from"]["requirements"]).sha256
    path.write_text(json.dumps(doc, indent=2) + "\n")


def _edit_recipe(folder: Path, packages) -> None:
    path = folder / "recipe.yaml"
    doc = yaml.safe_load(path.read_text())
    if packages is None:
        del doc["build"]["python_packages"]
    else:
        doc["build"]["python_packages"] = packages
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def test_a_missing_lock_is_named_by_check_and_stops_the_build_before_docker(twin):
    (twin / recipe_lock._FILE).unlink()
    loaded = load_recipe(twin)
    (problem,) = recipe_lock.problems(loaded)
    assert problem.startswith(f"{L.shown(twin / recipe_lock._FILE)}: no lock for build.python_packages")
    assert problem.endswith("(kiln engine lock tiny-kindling --recipe-only)")
    with pytest.raises(LockMissing) as err:
        _context(loaded)
    assert err.value.exit_code == 29 and "\n" not in err.value.message
    assert "triton==3.9.0" in err.value.message and "recipe.yaml:" in err.value.message
    assert "kiln engine lock tiny-kindling --recipe-only" in err.value.hint


def test_a_package_named_since_the_lock_was_made_is_named(twin):
    _edit_recipe(twin, ["triton==3.8.0"])
    loaded = load_recipe(twin)
    (problem,) = recipe_lock.problems(loaded)
    assert (
        "resolved_from: build.python_packages changed since the lock was made: now names triton==3.8.0; "
        "no longer names triton==3.9.0" in problem
    )
    with pytest.raises(LockInvalid) as err:
        _context(loaded)
    assert err.value.exit_code == 27 and err.value.message == problem.removesuffix(
        " (kiln engine lock tiny-kindling --recipe-only)"
    )


def test_a_lock_left_behind_by_a_recipe_that_names_no_packages_is_named(twin):
    _edit_recipe(twin, None)
    loaded = load_recipe(twin)
    assert recipe_lock.problems(loaded) == [
        f"{L.shown(twin / recipe_lock._FILE)}: the recipe names no build.python_packages; remove the lock or name them"
    ]
    assert recipe_lock.for_recipe(loaded) is None


@pytest.mark.parametrize(
    "change,expected",
    [
        (
            lambda d: d["engine"].update(version="0.31.0"),
            "engine: resolved against vllm 0.31.0's lock, the recipe pins vllm 0.32.0",
        ),
        (lambda d: d.update(image="tiny-moe"), "image: locks 'tiny-moe''s packages, not 'tiny-kindling''s"),
        (
            lambda d: (
                d["python_packages"][0].update(version="3.8.0")
                or d["python_packages"][0]["wheels"][AMD64].update(
                    file="triton-3.8.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"
                )
            ),
            "python_packages: triton 3.8.0 (linux/amd64) violates triton==3.9.0",
        ),
        (lambda d: d.update(python_packages=[]), "python_packages: triton is not locked for linux/amd64"),
        (lambda d: d.update(tools={}), "tools: no uv wheel for linux/amd64"),
        (
            lambda d: d.update(platforms=["linux/arm64"], python_packages=[], tools={}),
            "platforms: no linux/amd64 entries",
        ),
    ],
)
def test_a_stale_or_hand_edited_lock_is_one_line_naming_file_and_field(twin, change, expected):
    _edit_lock(twin, change)
    problems = recipe_lock.problems(load_recipe(twin))
    assert any(p.startswith(f"{L.shown(twin / recipe_lock._FILE)}: {expected}") for p in problems), problems
    assert all("\n" not in p for p in problems)


def test_a_package_the_engine_lock_installs_already_is_refused(twin):
    numpy = _engine_lock().package("numpy")
    assert numpy is not None
    _edit_recipe(twin, ["triton==3.9.0", "numpy"])
    _edit_lock(
        twin,
        lambda d: (
            d["resolved_from"].update(requirements=["numpy", "triton==3.9.0"]),
            d["python_packages"].insert(0, numpy.to_json()),
        ),
    )
    problems = recipe_lock.problems(load_recipe(twin))
    assert problems == [
        (
            f"{L.shown(twin / recipe_lock._FILE)}: python_packages: numpy {numpy.version}: the engine "
            f"lock installs numpy {numpy.version} already (kiln engine lock tiny-kindling --recipe-only)"
        )
    ]


def test_an_unreadable_lock_is_the_reader_s_one_line(twin):
    (twin / recipe_lock._FILE).write_text("{not json")
    (problem,) = recipe_lock.problems(load_recipe(twin))
    assert problem.startswith(f"{L.shown(twin / recipe_lock._FILE)}: not JSON")


# -- the wheels on the host ----------------------------------------------------------------
def test_a_tampered_cached_wheel_is_refused_naming_the_package_and_the_recipe_lock(tmp_path, monkeypatch):
    """What the build does before Docker: every locked wheel from the cache, hashed against
    the recipe lock (files already cached: nothing is downloaded)."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    loaded = load_recipe(REPO / "recipes" / NAME)
    lock = recipe_lock.for_recipe(loaded)
    assert lock is not None
    cache = tmp_path / "cache" / "wheels" / "locked"
    cache.mkdir(parents=True)
    for pkg in [*lock.python_packages, *lock.tools.values()]:
        (cache / pkg.wheels[AMD64].file).write_bytes(b"PK\x03\x04 not the locked file")
    with pytest.raises(WheelHashMismatch) as err:
        RecipeImage(ResolvedRecipe(loaded), EngineImage(loaded.recipe.engine, None)).add_wheels()
    got = hashlib.sha256(b"PK\x03\x04 not the locked file").hexdigest()
    assert err.value.exit_code == 26 and "\n" not in err.value.message
    assert err.value.message.startswith(
        f"triton 3.9.0: {TRITON[0]} has sha256 {got}, recipes/{NAME}/recipe.lock.json locks {TRITON[1]}"
    )


# -- the recipe field ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "packages,message",
    [
        (["triton @ https://example.org/triton.whl"], "names a URL"),
        (["triton==="], "is not a requirement"),
        (["triton==3.9.0", "Triton>=3"], "triton is named twice"),
    ],
)
def test_bad_python_packages_are_recipe_lines(twin, packages, message):
    _edit_recipe(twin, packages)
    with pytest.raises(RecipeInvalid) as err:
        load_recipe(twin)
    (problem,) = err.value.problems
    assert "recipe.yaml:" in problem and "build.python_packages" in problem and message in problem, problem


# -- against the real index ------------------------------------------------------------------
@pytest.mark.network
def test_re_locking_tiny_kindling_from_the_index_gives_the_committed_lock():
    """uv and the index's JSON API, with the engine lock's versions as constraints: the
    same bytes as committed (nothing written here)."""
    from kiln.domain.images.ca_bundle import resolve_ca
    from kiln.domain.locks import lock_resolver

    loaded = load_recipe(REPO / "recipes" / NAME)
    lock = lock_resolver.make_recipe_lock(
        NAME,
        list(loaded.recipe.build.python_packages),
        _engine_lock(),
        list(loaded.recipe.engine.platforms),
        cafile=resolve_ca(None).path,
    )
    assert lock.dumps() == recipe_lock.lock_path(loaded.dir).read_text()


@pytest.mark.network
def test_recipe_only_check_asks_the_index_about_the_recipe_lock_alone_and_changes_nothing():
    from kilntest import run_kiln

    path = REPO / "recipes" / NAME / recipe_lock._FILE
    engine = L.lock_path(L.engine_image_dir("cpu"), "vllm", "0.32.0")
    before = path.read_bytes(), engine.read_bytes()
    result = run_kiln("engine", "lock", NAME, "--recipe-only", "--check")
    assert result.returncode == 0, result.stderr
    assert (path.read_bytes(), engine.read_bytes()) == before
    reports = [line for line in result.stdout.splitlines() if not line.startswith(" ")]
    assert len(reports) == 1 and reports[0].startswith(f"recipes/{NAME}/recipe.lock.json: 2 locked, "), reports


def test_recipe_only_on_a_recipe_without_packages_is_a_usage_error():
    from kilntest import run_kiln

    result = run_kiln("engine", "lock", "tiny-moe", "--recipe-only")
    assert result.returncode == 64, result.stderr
    assert "--recipe-only: tiny-moe names no build.python_packages" in result.stderr


def test_the_sbom_cites_the_recipe_lock_only_when_the_image_was_built_from_it():
    """The image's `ai.kiln.recipe-lock` label names the lock file's sha256 at build time:
    another lock (edited since, or none at all) lends the SBOM no hash."""
    from kiln.domain.supplychain import sbom

    loaded = load_recipe(REPO / "recipes" / NAME)
    labels = RecipeImage(ResolvedRecipe(loaded), EngineImage(loaded.recipe.engine, None)).labels()
    label = labels["ai.kiln.recipe-lock"]
    committed = recipe_lock.committed(loaded)
    assert committed is not None and label == f"recipes/{NAME}/{recipe_lock._FILE}@sha256:{committed.sha256}"
    assert sbom._recipe_lock(loaded, labels) == committed
    assert sbom._recipe_lock(loaded, {**labels, "ai.kiln.recipe-lock": label[:-64] + "0" * 64}) is None
    assert sbom._recipe_lock(loaded, {k: v for k, v in labels.items() if k != "ai.kiln.recipe-lock"}) is None


def test_the_provenance_lists_the_recipe_lock_and_its_wheels():
    from kiln.domain.supplychain import resolved_dependencies

    loaded = load_recipe(REPO / "recipes" / NAME)
    image = RecipeImage(ResolvedRecipe(loaded), EngineImage(loaded.recipe.engine, None))
    deps = resolved_dependencies._lock_dependencies(None, image, AMD64, loaded.recipe.engine.base_image.ref)
    committed = recipe_lock.committed(loaded)
    assert committed is not None
    lock_entry, triton = deps[0], deps[1]
    assert lock_entry == {
        "name": f"recipes/{NAME}/{recipe_lock._FILE}",
        "digest": {"sha256": committed.sha256},
        "annotations": {"kiln_role": "recipe-lock"},
    }
    assert (triton["name"], triton["uri"], triton["digest"]) == (
        TRITON[0],
        "pkg:pypi/triton@3.9.0",
        {"sha256": TRITON[1]},
    )
    assert triton["annotations"] == {"kiln_role": "locked-python", "kiln_lock": f"recipes/{NAME}/{recipe_lock._FILE}"}
    # tiny-moe's provenance has no such entry
    moe = load_recipe(REPO / "recipes" / "tiny-moe")
    plain = resolved_dependencies._lock_dependencies(
        None,
        RecipeImage(ResolvedRecipe(moe), EngineImage(moe.recipe.engine, None)),
        AMD64,
        moe.recipe.engine.base_image.ref,
    )
    assert not [d for d in plain if d["annotations"]["kiln_role"] == "recipe-lock"]
