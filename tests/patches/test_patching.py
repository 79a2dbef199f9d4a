"""The patch engine (kiln/inimage/patch_tree.py, text_diff.py) against the real vLLM 0.32.0 sources."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kiln import inimage
from kiln.domain.patching import text_diff as D
from kiln.inimage import patch_format
from kiln.inimage import patch_tree as P

pytestmark = pytest.mark.network  # the fixtures download the engine wheel once

SERIES = Path(__file__).resolve().parents[2] / "patches" / "vllm" / "0.32.0" / "series"
MAIN = "vllm/entrypoints/cli/main.py"
RUN_BATCH = "vllm/entrypoints/cli/run_batch.py"


def shipped_patcher(where: Path) -> Path:
    """The applier as an engine build ships it (kiln.domain.images.engine_image): kiln_patching.py
    with its engine and parser beside it as kiln_patchtree.py and kiln_patchformat.py, run as a
    script by the image's python."""
    where.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(inimage.source("patch_applier"), where / "kiln_patching.py")
    shutil.copyfile(inimage.source("patch_tree"), where / "kiln_patchtree.py")
    shutil.copyfile(inimage.source("patch_format"), where / "kiln_patchformat.py")
    return where / "kiln_patching.py"


def real_series() -> patch_format.Series:
    return patch_format.load_series(SERIES, "patches/vllm/0.32.0/series")


def make_patch(
    root: Path,
    edits: dict[str, tuple[bytes, bytes]],
    name="0001-test.patch",
    header=b"Test\n\nWhy: test\nUpstream: no, test\n\n",
) -> bytes:
    """A patch made of real files: each target gets one bytes.replace(old, new)."""
    parts = [header]
    for target, (old, new) in edits.items():
        before = (root / target).read_bytes()
        assert old in before, f"{old!r} not in {target}"
        parts.append(D.file_diff(target, before, before.replace(old, new, 1)))
    return b"".join(parts)


def test_real_series_applies_with_headers(src032):
    series = real_series()
    assert series.patches, "patches/vllm/0.32.0/series lists no patch"
    assert [line for p in series.patches for line in p.header_problems()] == []
    tree = P.Tree(src032)
    results = P.apply_series(tree, [series])
    assert all(r.ok and not r.offsets for r in results)
    main = tree.read(MAIN)
    assert b'importlib.metadata.version("vllm")' not in main and b"version=vllm.__version__" in main
    assert b"importlib" not in tree.read(RUN_BATCH)
    assert (src032 / MAIN).read_bytes() != main, "nothing may be written before commit()"


def test_matches_gnu_patch(src032, tmp_path):
    # required, not skipped: scripts/setup.sh installs it, and without it nothing checks
    # that the applier agrees with GNU patch
    assert shutil.which("patch"), "GNU patch is not installed (scripts/setup.sh installs it)"
    work = tmp_path / "gnu"
    touched = sorted({rel for p in real_series().patches for rel in p.targets})
    assert MAIN in touched and RUN_BATCH in touched
    for rel in touched:
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src032 / rel, work / rel)
    tree = P.Tree(src032)
    P.apply_series(tree, [real_series()])
    for p in real_series().patches:
        subprocess.run(["patch", "-p1", "-s", "--fuzz=0", "-i", str(SERIES.parent / p.name)], cwd=work, check=True)
    for rel in touched:
        assert (work / rel).read_bytes() == tree.read(rel)


def test_broken_hunk_reports_patch_file_hunk_and_context(src032, tmp_path):
    good = (SERIES.parent / real_series().patches[0].name).read_bytes()
    broken = good.replace(b'         action="version",\n', b'         action="versions",\n', 1)
    assert broken != good
    (tmp_path / "series").write_text("0001-broken.patch\n")
    (tmp_path / "0001-broken.patch").write_bytes(broken)
    series = patch_format.load_series(tmp_path / "series", "p/series")
    with pytest.raises(patch_format.ApplyFailed) as exc:
        P.apply_series(P.Tree(src032), [series])
    assert exc.value.exit_code == 6
    assert exc.value.lines == [
        (
            "p/0001-broken.patch: vllm/entrypoints/cli/main.py: hunk #2 @@ -96,7 +95,7 @@ "
            '(first context line: ""-v",") does not apply'
        )
    ]


def test_offsets_are_found_and_reported(src032):
    data = make_patch(src032, {MAIN: (b'action="version",', b'action="version",  # x')})
    # state the hunk 7 lines too low, as if made against an older file
    data = re.sub(rb"@@ -(\d+),7 \+(\d+),7 @@", lambda m: b"@@ -%d,7 +%d,7 @@" % (int(m[1]) + 7, int(m[2]) + 7), data)
    res = P.apply_patch(P.Tree(src032), patch_format.parse_patch(data, "x.patch"))
    assert res.ok and res.offsets == [(MAIN, 1, -7)]


def test_hunk_with_less_leading_context_is_anchored_to_file_start(src032):
    # like GNU patch at fuzz 0: a hunk at line 1 cannot float down the file
    hunk = patch_format.Hunk(
        1,
        3,
        1,
        4,
        b"",
        [
            (b"+", b"# new first line\n"),
            (b" ", b"import argparse\n"),
            (b" ", b"import asyncio\n"),
            (b" ", b"import importlib.metadata\n"),
        ],
    )
    lines = patch_format.split_lines((src032 / RUN_BATCH).read_bytes())
    assert P.locate_hunk(lines, hunk, 0, 0) is None
    assert P.locate_hunk(lines[3:], hunk, 0, 0) == 0


def test_new_and_deleted_files_and_missing_newline(src032, tmp_path):
    text = (src032 / "vllm/version.py").read_bytes()
    new_file = D.file_diff("vllm/kiln_extra.py", None, text.rstrip(b"\n"))  # no final newline
    assert patch_format._NO_NEWLINE in new_file
    delete = D.file_diff("vllm/version.py", text, None)
    patch = patch_format.parse_patch(b"Why: t\nUpstream: no\n" + new_file + delete, "nd.patch")
    assert [f.creates for f in patch.files] == [True, False] and patch.files[1].deletes
    tree = P.Tree(src032)
    assert P.apply_patch(tree, patch).ok
    assert tree.read("vllm/kiln_extra.py") == text.rstrip(b"\n") and tree.read("vllm/version.py") is None
    assert P.apply_patch(tree, patch, reverse=True).ok
    assert tree.read("vllm/kiln_extra.py") is None and tree.read("vllm/version.py") == text
    # creating a file that exists is a file-level failure, not a silent overwrite
    res = P.apply_patch(
        P.Tree(src032), patch_format.parse_patch(D.file_diff("vllm/version.py", None, b"x\n"), "c.patch")
    )
    assert res.failure_lines() == ["c.patch: vllm/version.py: already exists, but the patch creates it"]


def test_header_is_required_and_parse_errors_name_the_line(src032):
    data = make_patch(src032, {MAIN: (b'action="version",', b'action="version",  # x')}, header=b"just text\n")
    problems = patch_format.parse_patch(data, "p/x.patch").header_problems()
    assert problems[0].startswith("p/x.patch: header has no `Why:` line")
    assert problems[1].startswith("p/x.patch: header has no `Upstream:` line")
    with pytest.raises(patch_format.PatchFormatError) as exc:
        patch_format.parse_patch(re.sub(rb"@@ -(\d+),7", rb"@@ -\1,9", data), "p/x.patch")
    assert exc.value.exit_code == 30 and exc.value.lines[0].startswith("p/x.patch:")


def test_all_or_nothing_in_image_cli(src032, tmp_path):
    root = tmp_path / "site"
    for rel in (MAIN, RUN_BATCH):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src032 / rel, root / rel)
    good = (SERIES.parent / real_series().patches[0].name).read_bytes()
    bad = make_patch(src032, {RUN_BATCH: (b"import typing\n", b"import typing  # kiln\n")})
    bad = bad.replace(b" import asyncio\n", b" import asyncioo\n")
    pdir = tmp_path / "patches"
    pdir.mkdir()
    (pdir / "0001-good.patch").write_bytes(good)
    (pdir / "0002-bad.patch").write_bytes(bad)
    (pdir / "series").write_text("0001-good.patch\n0002-bad.patch\n")
    cmd = [
        sys.executable,
        str(shipped_patcher(tmp_path / "lib")),
        "apply",
        "--root",
        str(root),
        "--series",
        str(pdir / "series"),
        "--manifest",
        str(tmp_path / "m.json"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 6
    err = proc.stderr.splitlines()
    assert err[0] == (
        f"{pdir}/0002-bad.patch: {RUN_BATCH}: hunk #1 @@ -4,7 +4,7 @@ "
        f'(first context line: "import argparse") does not apply'
    )
    assert err[-1] == "hint: reproduce without Docker: kiln patches check / kiln engine bump --to VERSION --dry-run"
    assert (root / MAIN).read_bytes() == (src032 / MAIN).read_bytes(), "patch 1 must not be written"
    assert not (tmp_path / "m.json").exists()

    (pdir / "series").write_text("0001-good.patch\n")
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((tmp_path / "m.json").read_text())
    assert manifest["patches"] == [
        {
            "name": "0001-good.patch",
            "sha256": patch_format.sha256_bytes(good),
            "source": "series",
            "files": [MAIN, RUN_BATCH],
        }
    ]
    assert b"version=vllm.__version__" in (root / MAIN).read_bytes()


def test_apply_overlays_and_drift(src032, tmp_path):
    root = tmp_path / "site"
    (root / MAIN).parent.mkdir(parents=True)
    shutil.copyfile(src032 / MAIN, root / MAIN)
    shutil.copyfile(src032 / RUN_BATCH, root / RUN_BATCH)
    upstream = (root / RUN_BATCH).read_bytes()
    feat = tmp_path / "overlays" / "feat"
    (feat / "patches").mkdir(parents=True)
    (feat / "patches" / "0001-f.patch").write_bytes(
        make_patch(src032, {MAIN: (b'action="version",', b'action="version",  # f')})
    )
    (feat / "patches" / "series").write_text("0001-f.patch\n")
    (feat / "files").mkdir()
    (feat / "files" / "run_batch.py").write_bytes(upstream + b"# replaced\n")
    spec = {
        "name": "feat",
        "series": "patches/series",
        "replacements": [
            {"target": RUN_BATCH, "file": "files/run_batch.py", "upstream_sha256": patch_format.sha256_bytes(upstream)}
        ],
    }
    (feat / "overlay.json").write_text(json.dumps(spec))
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"patches": [{"name": "0001-engine.patch"}], "replacements": []}))
    cmd = [
        sys.executable,
        str(shipped_patcher(tmp_path / "lib")),
        "apply-overlays",
        "--root",
        str(root),
        "--overlays",
        str(tmp_path / "overlays"),
        "--manifest-append",
        str(manifest),
    ]
    spec["replacements"][0]["upstream_sha256"] = "0" * 64
    (feat / "overlay.json").write_text(json.dumps(spec))
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 7
    assert (
        f"feature feat: {RUN_BATCH}: forked from a different upstream file (expected sha256 {'0' * 64}, "
        f"the engine has {patch_format.sha256_bytes(upstream)})" in proc.stderr
    )
    assert (root / MAIN).read_bytes() == (src032 / MAIN).read_bytes()

    spec["replacements"][0]["upstream_sha256"] = patch_format.sha256_bytes(upstream)
    (feat / "overlay.json").write_text(json.dumps(spec))
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(manifest.read_text())
    assert [p["name"] for p in doc["patches"]] == ["0001-engine.patch", "0001-f.patch"]
    assert doc["patches"][1]["source"] == "feature:feat"
    assert doc["replacements"][0]["target"] == RUN_BATCH
    assert (root / RUN_BATCH).read_bytes().endswith(b"# replaced\n")


def test_patch_that_breaks_syntax_is_a_failure(src032):
    data = make_patch(src032, {MAIN: (b"def main():\n", b"def main(:\n")})
    with pytest.raises(patch_format.ApplyFailed) as exc:
        P.apply_series(
            P.Tree(src032), [patch_format.Series("s", [patch_format.parse_patch(data, "s.patch", "s.patch")])]
        )
    assert exc.value.lines[0].startswith(f"{MAIN}: does not compile after patching (s.patch):")


def test_merge3_takes_one_sided_changes_and_marks_conflicts():
    base = b"a\nb\nc\nd\ne\n"
    ok = D.merge3(base, b"a\nB\nc\nd\ne\n", b"a\nb\nc\nd\nE\n", ("o", "b", "t"))
    assert ok.data == b"a\nB\nc\nd\nE\n" and ok.conflicts == []
    bad = D.merge3(base, b"a\nX\nc\nd\ne\n", b"a\nY\nc\nd\ne\n", ("o", "b", "t"))
    assert bad.conflicts == [(2, 8)]
    assert bad.data == b"a\n<<<<<<< o\nX\n||||||| b\nb\n=======\nY\n>>>>>>> t\nc\nd\ne\n"
