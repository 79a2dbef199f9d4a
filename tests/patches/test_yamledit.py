"""yaml_edits.set_value: one scalar changes and no other byte of the file moves."""

from __future__ import annotations

from pathlib import Path

import pytest
from ruamel.yaml import YAML

from kiln.domain.patching.yaml_edits import set_value

RECIPE = """\
# a comment that stays
engine:
  name: vllm
  version: 0.33.0   # pinned
  cuda: "13.0"
model:
  layer_types: [sliding_attention, full_attention,
                sliding_attention, full_attention]
  note: >-
    folded
    text
"""


@pytest.mark.parametrize(
    ("path", "value", "line", "want"),
    [
        (("engine", "version"), "0.34.0", 3, "  version: 0.34.0   # pinned"),
        (("engine", "cuda"), "13.1", 4, '  cuda: "13.1"'),
    ],
)
def test_one_line_scalar_changes_in_place(tmp_path: Path, path, value, line, want) -> None:
    f = tmp_path / "recipe.yaml"
    f.write_text(RECIPE)
    assert set_value(f, path, value)
    before, after = RECIPE.splitlines(), f.read_text().splitlines()
    assert after[line] == want
    # every other line, the flow sequence over two lines included, is as written
    assert [a for i, a in enumerate(after) if i != line] == [b for i, b in enumerate(before) if i != line]


def test_unchanged_value_writes_nothing(tmp_path: Path) -> None:
    f = tmp_path / "recipe.yaml"
    f.write_text(RECIPE)
    assert not set_value(f, ("engine", "version"), "0.33.0")
    assert f.read_text() == RECIPE


def test_folded_scalar_goes_through_the_round_trip(tmp_path: Path) -> None:
    f = tmp_path / "recipe.yaml"
    f.write_text(RECIPE)
    assert set_value(f, ("model", "note"), "one line")
    assert YAML(typ="safe").load(f.read_text())["model"]["note"] == "one line"


def test_a_scalar_in_a_flow_mapping_keeps_the_mapping(tmp_path: Path) -> None:
    f = tmp_path / "override.yaml"
    f.write_text("name: feat\nengine: {version: 0.32.0}\npatches: patches/series\n")
    assert set_value(f, ("engine", "version"), "0.33.0")
    assert f.read_text() == "name: feat\nengine: {version: 0.33.0}\npatches: patches/series\n"
