"""`kiln engine bump --dry-run --report`: the flags and speculative-config keys read
statically from two fixture versions of vLLM's sources (tests/fixtures/bumpreport), the
"used by the recipe" mark, each patch state of a feature series, the requirements
compared, and the Markdown rendering. No network, no wheel."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kiln.cli import main
from kiln.domain.patching import bump_report as R
from kiln.domain.patching import text_diff as D
from kiln.domain.patching.arg_surface import (
    _SPEC,
    FLAG,
    Change,
    compare,
    read_surface,
    used_changes,
)
from kiln.domain.patching.bump import PortedEngine, Row, port_series
from kiln.inimage import patch_format, patch_tree

FIXTURES = Path(__file__).parent / "fixtures" / "bumpreport"
HEADER = b"Test\n\nWhy: test\nUpstream: no, test\n\n"


@pytest.fixture(scope="module")
def changes() -> dict[tuple[str, str], Change]:
    old, new = read_surface(FIXTURES / "old"), read_surface(FIXTURES / "new")
    assert old.read == ["vllm/engine/arg_utils.py", "vllm/config/speculative.py"]  # no frontend file: left out
    return {(c.kind, c.name): c for c in compare(old, new)}


def test_removed_added_and_default_changed_flags(changes):
    assert changes[FLAG, "old-switch"].change == "removed"
    # the new sources' own deprecation line is quoted; nothing is guessed
    assert (
        changes[FLAG, "old-switch"].note == "new sources: --old-switch was deprecated and is removed: use --new-switch."
    )
    assert changes[FLAG, "legacy-mode"].change == "removed"
    assert changes[FLAG, "legacy-mode"].note == (
        "deprecated before: --legacy-mode is deprecated and will be removed in v0.2.0."
    )
    assert changes[FLAG, "old-extra"].change == changes[FLAG, "old-extra-alias"].change == "removed"
    assert changes[FLAG, "old-extra"].note is None
    assert changes[FLAG, "new-switch"].change == changes[FLAG, "new-extra"].change == "added"
    # resolved through CacheConfig in vllm/config/cache.py, not the text `CacheConfig.gpu_memory_utilization`
    gmu = changes[FLAG, "gpu-memory-utilization"]
    assert (gmu.change, gmu.old, gmu.new) == ("default", "0.92", "None")
    for same in ("model", "max-model-len", "tensor-parallel-size", "kernel-config", "seed"):
        assert (FLAG, same) not in changes


def test_config_references_resolve_to_the_config_class_default():
    flags = read_surface(FIXTURES / "old").flags
    assert flags["tensor-parallel-size"].default == "1"
    assert flags["tensor-parallel-size"].expression == "ParallelConfig.tensor_parallel_size"
    assert flags["max-model-len"].default == "None"  # Field(default=None, ge=1)
    assert flags["kernel-config"].default == "dict()"  # get_field(...) -> field(default_factory=dict)
    assert flags["old-extra-alias"].default is None  # an add_argument flag with no field behind it


def test_speculative_config_keys(changes):
    assert changes[_SPEC, "padded_batch"].change == "removed"
    assert changes[_SPEC, "draft_topk"].change == "added"
    assert changes[_SPEC, "prompt_lookup_max"].old == "5" and changes[_SPEC, "prompt_lookup_max"].new == "4"
    assert changes[_SPEC, "suffix_factor"].change == "deprecated"
    assert changes[_SPEC, "suffix_factor"].note == "Deprecated and has no effect."
    # ClassVar and init=False fields are no keys a user can pass
    spec = read_surface(FIXTURES / "new").speculative
    assert "KINDS" not in spec and "custom_method" not in spec
    assert spec["draft_topk"].default == "(lambda: 8)()"


def test_used_by_the_recipe_mark(changes):
    every = list(changes.values())
    used = used_changes(every, {"gpu-memory-utilization", "old-switch", "port"}, {"padded_batch", "method"})
    assert {(c.kind, c.name) for c in used} == {
        (FLAG, "gpu-memory-utilization"),
        (FLAG, "old-switch"),
        (_SPEC, "padded_batch"),
    }
    # a flag and a key of the same name are told apart
    assert not used_changes(every, {"padded-batch"}, {"old_switch"})


# -- patch states ---------------------------------------------------------------------------------
def _tree(tmp: Path, name: str, files: dict[str, bytes]) -> patch_tree.Tree:
    for rel, data in files.items():
        (tmp / name / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name / rel).write_bytes(data)
    return patch_tree.Tree(tmp / name)


def _lines(*items: str) -> bytes:
    return "".join(f"{x}\n" for x in items).encode()


def test_a_feature_series_gets_one_row_per_state(tmp_path):
    body = [f"line {i}" for i in range(20)]
    old = {
        "vllm/a.py": _lines(*body),
        "vllm/b.py": _lines(*body),
        "vllm/c.py": _lines(*body),
        "vllm/d.py": _lines(*body),
        "vllm/e.py": _lines(*body),
    }
    new = {
        "vllm/a.py": _lines(*body),  # unchanged: clean
        "vllm/b.py": _lines("new 1", "new 2", *body),  # moved down: offset
        "vllm/c.py": _lines(*body[:4], "line 4 upstream", *body[5:]),  # context changed: 3-way
        "vllm/d.py": _lines(*body[:10], "line 10 kiln", *body[11:]),  # the change is there: moot
        "vllm/e.py": _lines(*body[:10], "line 10 upstream", *body[11:]),
    }  # the same line changed: conflict

    def patch(name: str, rel: str, before: str, after: str) -> patch_format.Patch:
        data = old[rel]
        diff = D.file_diff(rel, data, data.replace(f"{before}\n".encode(), f"{after}\n".encode(), 1))
        return patch_format.parse_patch(HEADER + diff, name, name)

    series = patch_format.Series(
        "series",
        [
            patch("1.patch", "vllm/a.py", "line 10", "line 10 kiln"),
            patch("2.patch", "vllm/b.py", "line 10", "line 10 kiln"),
            patch("3.patch", "vllm/c.py", "line 6", "line 6 kiln"),
            patch("4.patch", "vllm/d.py", "line 10", "line 10 kiln"),
            patch("5.patch", "vllm/e.py", "line 10", "line 10 kiln"),
        ],
    )
    engine = PortedEngine([], _tree(tmp_path, "new", new), _tree(tmp_path, "old", old))
    rows = port_series(engine, series)
    assert [R.state(r) for r in rows] == ["clean", "offset", "3-way", "made moot upstream", "conflict"]
    assert engine.tree.read("vllm/a.py") == new["vllm/a.py"]  # the engine's trees are left alone
    report = R.SeriesReport("feature r/f", rows)
    assert report.counts() == {"clean": 1, "offset": 1, "3-way": 1, "made moot upstream": 1, "conflict": 1}


# -- requirements, sizes, rendering --------------------------------------------------------------
def test_requirements_compared_with_torch_cuda_and_flashinfer_first():
    old = [
        "torch==2.14.0",
        "nvidia-cutlass-dsl==4.8.0",
        "flashinfer-python==0.7.2.post1",
        "aiohttp>=3",
        "gone>=1",
        'numba==0.61 ; python_version == "3.11"',
    ]
    new = ["torch==2.15.0", "nvidia-cutlass-dsl==4.8.0", "flashinfer-python==0.7.3", "aiohttp>=3", "fresh"]
    got = [(c.name, c.change, c.old, c.new) for c in R.requirement_changes(old, new)]
    assert got == [
        ("torch", "moved", "==2.14.0", "==2.15.0"),
        ("nvidia-cutlass-dsl", "unchanged", "==4.8.0", "==4.8.0"),  # always shown, moved or not
        ("flashinfer-python", "moved", "==0.7.2.post1", "==0.7.3"),
        ("fresh", "added", None, "any"),
        ("gone", "removed", ">=1", None),
        ("numba", "removed", '==0.61 ; python_version == "3.11"', None),
    ]


def test_measured_sizes_say_not_built_for_the_new_version(tmp_path):
    for name, doc in {
        "a.json": {"engine": "0.33.0", "engine_build": {"size": 7 * 2**30}},
        "b.json": {"engine": "0.33.0", "platform": "linux/arm64", "engine_build": {"size": 2**30}},
        "c.json": {"engine": "0.31.0", "engine_build": {"size": 1}},
    }.items():
        (tmp_path / name).write_text(json.dumps(doc))
    sizes = R.measured_sizes(sorted(tmp_path.glob("*.json")), "0.33.0", "0.34.0")
    assert sizes == [R._ImageSize("linux/amd64", 7 * 2**30, None), R._ImageSize("linux/arm64", 2**30, None)]


def _report() -> R.BumpReport:
    changes = [
        Change(FLAG, "gpu-memory-utilization", "default", "0.92", "None"),
        Change(FLAG, "old-switch", "removed", "False", None, "new sources: --old-switch is deprecated"),
        Change(FLAG, "new-extra", "added", None, "False"),
        Change(_SPEC, "padded_batch", "removed", "False", None),
    ]
    recipes = [
        R.RecipeUse("big", frozenset({"gpu-memory-utilization", "port"}), frozenset({"padded_batch"}), ("f",)),
        R.RecipeUse("small", frozenset({"port"}), frozenset()),
    ]
    series = [
        R.SeriesReport("engine series patches/vllm/0.33.0", [Row("0001-a.patch", "clean", "applies cleanly")]),
        R.SeriesReport(
            "feature big/f", [Row("0001-b.patch", "fails", "fails: vllm/x.py hunk #1 | y")], "on vllm 0.34.0"
        ),
    ]
    reqs = [R._RequirementChange("torch", "moved", "==2.14.0", "==2.15.0")]
    return R.BumpReport(
        "0.33.0",
        "0.34.0",
        "cuda",
        "kiln engine bump --to 0.34.0 --dry-run --report x.md",
        "2026-12-07",
        changes,
        recipes,
        series,
        reqs,
        [R._ImageSize("linux/amd64", 7833645385, None)],
        ["vllm/engine/arg_utils.py"],
    )


def test_markdown_rendering():
    md = R.render_markdown(_report())
    assert md.startswith("# vllm 0.33.0 -> 0.34.0 (cuda): bump report\n")
    assert "Generated by `kiln engine bump --to 0.34.0 --dry-run --report x.md` on 2026-12-07" in md
    assert (
        "- Used and changed: --gpu-memory-utilization default 0.92 -> None [big] (each sets it: its own value stays)"
        in md
    )
    assert "- Used and changed: padded_batch removed (no deprecation note in the new sources) [big]" in md
    assert "- New defaults for the recipes that do not set them: --gpu-memory-utilization 0.92 -> None" in md
    assert "- torch: ==2.14.0 -> ==2.15.0" in md
    assert "- Engine image (linux/amd64): 7.30 GiB (7,833,645,385 bytes) -> not built" in md
    assert "| big | f | `--gpu-memory-utilization` (default), `padded_batch` (removed) |" in md
    assert "| small | — | none |" in md
    assert ("| **yes** | `--gpu-memory-utilization` | default | `0.92` | `None` | big | — |") in md
    assert "|  | `--old-switch` | removed | `False` | — | — | new sources: --old-switch is deprecated |" in md
    assert "| `0001-b.patch` | conflict | fails: vllm/x.py hunk #1 \\| y |" in md  # a pipe cannot break the table
    assert "| torch | moved | ==2.14.0 | ==2.15.0 |" in md
    # used ones first in the table
    assert md.index("`--gpu-memory-utilization` | default") < md.index("`--new-extra`")


def test_text_rendering_marks_what_a_recipe_uses():
    text = R.render_text(_report())
    assert "  --gpu-memory-utilization: default 0.92 -> None  USED by big\n" in text
    assert "  --new-extra: added\n" in text
    assert "feature big/f: 1 conflict (on vllm 0.34.0)\n" in text
    assert "  0001-b.patch  conflict: fails: vllm/x.py hunk #1 | y\n" in text


def test_report_needs_a_dry_run(capsys):
    assert main(["engine", "bump", "--to", "0.34.0", "--report", "x.md"]) != 0
    assert "--report goes with --dry-run" in capsys.readouterr().err
