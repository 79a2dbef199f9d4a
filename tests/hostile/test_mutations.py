"""Property: whatever is done to a valid recipe's bytes, `kiln check` either accepts it
(exit 0) or refuses it (exit 2) with one-line `file:line: field: message` errors; never a
traceback, another exit code, or a line that is not in that shape."""

from __future__ import annotations

import shutil

import pytest
from hostilekit import make_root, run_inprocess, shape_problems
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from recipe_edits import GLM, OVERLAY, TINY

TARGETS = [
    (TINY, f"recipes/{TINY}/recipe.yaml"),
    (GLM, f"recipes/{GLM}/recipe.yaml"),
    (GLM, f"{OVERLAY}/override.yaml"),
]

# fragments that reach the loader's corners: YAML syntax, aliases, tags, encodings
TOKENS = [
    "&a ",
    "*a",
    "<<: ",
    "!!python/object:os.system ",
    "!!binary ",
    "!foo ",
    "? ",
    "- ",
    ": ",
    "[",
    "]",
    "{",
    "}",
    ",",
    "\t",
    "---\n",
    "...\n",
    "%YAML 1.1\n",
    "|\n",
    ">-\n",
    '"',
    "'",
    "#",
    "~",
    "null",
    "yes",
    "on",
    "1e999",
    "0x1F",
    "2024-01-01",
    '"\\0"',
    '"\\e"',
    '"\\ud800"',
    '"\\u202e"',
    "\ufeff",
    "\u2028",
    "\x00",
    "\x1b[31m",
    "9" * 5000,
    "\n",
    "  ",
    "../../../etc/passwd",
    "/etc/passwd",
]
RAW = [b"\xff", b"\xc3\x28", b"\xef\xbb\xbf", b"\x00", b"\r", b"\r\n"]


@st.composite
def mutation(draw, size: int):
    kind = draw(st.sampled_from(["insert", "raw", "delete", "duplicate", "truncate", "byte"]))
    pos = draw(st.integers(0, size))
    if kind == "insert":
        text = draw(st.one_of(st.sampled_from(TOKENS), st.text(max_size=12)))
        return kind, pos, text.encode("utf-8", "surrogatepass")
    if kind == "raw":
        return kind, pos, draw(st.sampled_from(RAW))
    if kind == "byte":
        return kind, pos, bytes([draw(st.integers(0, 255))])
    return kind, pos, draw(st.integers(1, 200))


def apply(data: bytes, mut) -> bytes:
    kind, pos, arg = mut
    pos = min(pos, len(data))
    if kind in ("insert", "raw"):
        return data[:pos] + arg + data[pos:]
    if kind == "byte":
        return data[:pos] + arg + data[pos + 1 :]
    if kind == "delete":
        return data[:pos] + data[pos + arg :]
    if kind == "duplicate":
        return data[:pos] + data[pos : pos + arg] + data[pos:]
    return data[:pos]  # truncate


@st.composite
def mutated(draw):
    name, rel = draw(st.sampled_from(TARGETS))
    return name, rel, draw(st.lists(mutation(4096), min_size=1, max_size=4))


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = make_root(tmp_path_factory.mktemp("mutations") / "tree")
    return root, {rel: (root / rel).read_bytes() for _, rel in TARGETS}


@settings(max_examples=200, deadline=2000, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(case=mutated())
def test_mutated_recipe_exits_0_or_2_with_one_line_errors(tree, case):
    root, originals = tree
    for rel, data in originals.items():
        (root / rel).write_bytes(data)
    shutil.rmtree(root / ".cache", ignore_errors=True)
    name, rel, mutations = case
    data = originals[rel]
    for mut in mutations:
        data = apply(data, mut)
    (root / rel).write_bytes(data)
    outcome = run_inprocess(root, ["check", name])
    assert shape_problems(outcome) == [], outcome.stderr[-2000:]
