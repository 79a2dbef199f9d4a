"""requirements/dev.lock: the locked dev and test toolchain agrees with the pyproject.toml
files, hashes every pin, and is what this test process runs on."""

import shutil
import sys
from importlib import metadata
from pathlib import Path

import pytest
from kiln_testkit import devlock

ROOT = Path(__file__).resolve().parents[1]
LOCK_TEXT = (ROOT / devlock.LOCK).read_text()


def test_lock_was_resolved_from_the_current_pyprojects():
    assert devlock.recorded_digest(LOCK_TEXT) == devlock.inputs_digest(ROOT), (
        "a pyproject.toml's requirements changed since requirements/dev.lock was resolved: run `make lock-dev`"
    )


def test_every_declared_requirement_is_met_by_a_pin():
    assert devlock.unmet(ROOT, LOCK_TEXT) == []


def test_every_pin_is_exact_and_hashed():
    locked = devlock.pins(LOCK_TEXT)
    assert len(locked) > 50, "the lock parser found too few pins to be reading the lock"
    assert {name for name, (version, hashes) in locked.items() if not version or not hashes} == set()
    # the tools whose versions decide lint's answer are among them
    assert {"ruff", "mypy", "pydantic", "import-linter", "pytest", "uv", "pip", "setuptools"} <= set(locked)


def _tree_with(tmp_path: Path, edit) -> Path:
    for rel in devlock.PYPROJECTS.values():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    path = tmp_path / "pyproject.toml"
    path.write_text(edit(path.read_text()))
    return tmp_path


def test_a_new_dev_requirement_is_caught(tmp_path):
    tree = _tree_with(tmp_path, lambda t: t.replace('"pytest>=8,<9.2",', '"pytest>=8,<9.2",\n    "tomli-w>=1",', 1))
    assert devlock.inputs_digest(tree) != devlock.recorded_digest(LOCK_TEXT)
    assert devlock.unmet(tree, LOCK_TEXT) == [f"kiln: tomli-w>=1 is not in {devlock.LOCK}"]


def test_a_raised_bound_is_caught(tmp_path):
    tree = _tree_with(tmp_path, lambda t: t.replace('"pydantic>=2.6,<3"', '"pydantic>=2.6,<2.7"', 1))
    pinned = devlock.pins(LOCK_TEXT)["pydantic"][0]
    assert devlock.unmet(tree, LOCK_TEXT) == [
        f"kiln: pydantic<2.7,>=2.6 is not met by pydantic=={pinned} in {devlock.LOCK}"
    ]


def test_layout_alone_does_not_change_the_inputs(tmp_path):
    tree = _tree_with(tmp_path, lambda t: t.replace('"pydantic>=2.6,<3"', '"pydantic <3, >=2.6"', 1))
    assert devlock.inputs_digest(tree) == devlock.recorded_digest(LOCK_TEXT)


@pytest.mark.skipif(
    Path(sys.prefix).resolve() != (ROOT / ".venv").resolve(),
    reason="runs in this checkout's .venv (make setup; make test)",
)
def test_this_process_runs_on_the_lock():
    differ = {}
    for name, (version, _) in devlock.pins(LOCK_TEXT).items():
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            have = None
        if have != version:
            differ[name] = (version, have)
    assert differ == {}, "installed versions differ from requirements/dev.lock (locked, installed)"
