"""Porting a series by hand with checkout/refresh, on a made-up engine (no wheel, no
network): `checkout --series-from` ports a hunk whose context changed upstream by a
3-way merge, as `kiln engine bump` does (0001/0005/0006 of draft-trunc's
0.33.0 series needed it on 0.34.0); `refresh --patch NAME` puts a hand-ported hunk
into the patch it belongs to, not into the last patch touching its file, and adds
an edited file no patch touches to it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kiln.cli import main
from kiln.domain.patching import text_diff as D
from kiln.infra import wheel_cache
from kiln.inimage import patch_format
from kiln.inimage import patch_tree as P

HEADER = b"Test\n\nWhy: test\nUpstream: no, test\n\n"
A = "vllm/a.py"
B = "vllm/b.py"
OLD = b"".join(f"v{i} = {i}\n".encode() for i in range(1, 13))
# 2.0.0: a line on top (every hunk moves) and v2 changed: the context of a hunk after v4
NEW = b"v0 = 0\n" + OLD.replace(b"v2 = 2\n", b"v2 = 22\n")


@pytest.fixture
def engine(tmp_path, monkeypatch) -> Path:
    """A checkout with series for vllm 1.0.0 and 2.0.0 and both versions' "sources"."""
    from kiln.basics import paths

    if not shutil.which("git"):
        pytest.skip("git not available (git merge-file)")
    root = tmp_path / "kiln"
    for marker in paths._MARKERS:
        (root / marker).mkdir(parents=True)
    cache = tmp_path / "cache"
    for version, a in (("1.0.0", OLD), ("2.0.0", NEW)):
        src = cache / "sources" / f"vllm-{version}-cpu"
        (src / "vllm").mkdir(parents=True)
        (src / A).write_bytes(a)
        (src / B).write_bytes(b"b = 1\n")
        (src / wheel_cache.MARKER).write_text("made up\n")
    monkeypatch.setenv("KILN_ROOT", str(root))
    monkeypatch.setenv("KILN_CACHE_DIR", str(cache))
    paths.repo_root.cache_clear()
    yield root
    paths.repo_root.cache_clear()


def kiln(capsys, *args: str) -> tuple[int, str]:
    """Exit code and stderr; stdout (checkout prints the scratch tree) is in SCRATCH."""
    code = main(list(args))
    out, err = capsys.readouterr()
    SCRATCH[:] = out.strip().splitlines()[-1:]
    return code, err


SCRATCH: list[str] = []


def series(root: Path, version: str, patches: dict[str, bytes]) -> Path:
    d = root / "patches" / "vllm" / version
    d.mkdir(parents=True, exist_ok=True)
    for name, data in patches.items():
        (d / name).write_bytes(data)
    (d / "series").write_text("".join(f"{n}\n" for n in patches))
    return d


def edited(before: bytes, old: bytes, new: bytes) -> bytes:
    assert old in before
    return before.replace(old, new, 1)


def test_checkout_series_from_ports_a_changed_context_by_3way_merge(engine, capsys):
    patch = HEADER + D.file_diff(A, OLD, edited(OLD, b"v4 = 4\n", b"v4 = 4\nkiln = 1\n"))
    series(engine, "1.0.0", {"0001-x.patch": patch})
    # as written, the hunk no longer applies on 2.0.0 (its context line v2 changed)
    res = P.apply_patch(P.Tree(wheel_cache.cached_sources("2.0.0", "cpu")), patch_format.parse_patch(patch, "x", "x"))
    assert not res.ok
    code, err = kiln(capsys, "patches", "checkout", "--engine", "vllm==2.0.0", "--series-from", "1.0.0")
    assert code == 0, err
    assert "0001-x.patch: vllm/a.py: ported by 3-way merge (hunk(s) #1" in err
    code, err = kiln(capsys, "patches", "refresh", "--engine", "vllm==2.0.0")
    assert code == 0, err
    ported = (engine / "patches/vllm/2.0.0/0001-x.patch").read_bytes()
    assert ported.startswith(HEADER) and b"+kiln = 1\n" in ported and b" v2 = 22\n" in ported
    tree = P.Tree(wheel_cache.cached_sources("2.0.0", "cpu"))
    [res] = P.apply_series(tree, [patch_format.load_series(engine / "patches/vllm/2.0.0/series")])
    assert res.ok and not res.offsets
    assert tree.read(A) == edited(NEW, b"v4 = 4\n", b"v4 = 4\nkiln = 1\n")


def test_a_conflicting_hunk_still_gets_a_rej(engine, capsys):
    patch = HEADER + D.file_diff(A, OLD, edited(OLD, b"v2 = 2\n", b"v2 = 3\n"))  # upstream changed v2 too
    series(engine, "1.0.0", {"0001-x.patch": patch})
    code, err = kiln(capsys, "patches", "checkout", "--engine", "vllm==2.0.0", "--series-from", "1.0.0")
    assert code == 6 and "0001-x.patch: vllm/a.py: hunk #1" in err
    code, err = kiln(
        capsys, "patches", "checkout", "--engine", "vllm==2.0.0", "--series-from", "1.0.0", "--force-apply"
    )
    assert code == 0 and "ported by 3-way merge" not in err
    scratch = Path(SCRATCH[0])
    assert (scratch / f"{A}.rej").is_file()


def test_refresh_patch_puts_the_edit_into_the_named_patch(engine, capsys):
    first = HEADER + D.file_diff(A, NEW, edited(NEW, b"v4 = 4\n", b"v4 = 4\nfirst = 1\n"))
    after_first = edited(NEW, b"v4 = 4\n", b"v4 = 4\nfirst = 1\n")
    second = HEADER + D.file_diff(A, after_first, edited(after_first, b"v11 = 11\n", b"v11 = 11\nsecond = 1\n"))
    d = series(engine, "2.0.0", {"0001-first.patch": first, "0002-second.patch": second})
    code, err = kiln(capsys, "patches", "checkout", "--engine", "vllm==2.0.0")
    assert code == 0, err
    scratch = Path(SCRATCH[0])
    # the hand port of a hunk of 0001 (say, from a .rej), above 0002's hunk; and a file no patch touches
    (scratch / A).write_bytes(edited((scratch / A).read_bytes(), b"v6 = 6\n", b"v6 = 6\nported = 1\n"))
    (scratch / B).write_bytes(b"b = 1\nalso_first = 1\n")
    code, err = kiln(capsys, "patches", "refresh", "--engine", "vllm==2.0.0", "--patch", "0001-first.patch")
    assert code == 0, err
    p1, p2 = (d / "0001-first.patch").read_bytes(), (d / "0002-second.patch").read_bytes()
    assert b"+ported = 1\n" in p1 and b"+first = 1\n" in p1
    assert b"--- a/vllm/b.py\n+++ b/vllm/b.py\n" in p1 and b"+also_first = 1\n" in p1
    assert b"ported" not in p2.replace(b" ported = 1\n", b"") and b"+second = 1\n" in p2
    tree = P.Tree(wheel_cache.cached_sources("2.0.0", "cpu"))
    results = P.apply_series(tree, [patch_format.load_series(d / "series")])
    assert all(r.ok and not r.offsets for r in results)
    assert tree.read(A) == (scratch / A).read_bytes() and tree.read(B) == b"b = 1\nalso_first = 1\n"
    # the tree is the new baseline: refreshing again changes nothing
    assert kiln(capsys, "patches", "refresh", "--engine", "vllm==2.0.0")[1].count("every patch is up to date") == 1
    # without --patch the edit goes into the last patch touching the file, as quilt's refresh
    (scratch / A).write_bytes(edited((scratch / A).read_bytes(), b"v7 = 7\n", b"v7 = 7\ntop = 1\n"))
    assert kiln(capsys, "patches", "refresh", "--engine", "vllm==2.0.0")[0] == 0
    assert b"+top = 1\n" in (d / "0002-second.patch").read_bytes()
    assert b"top" not in (d / "0001-first.patch").read_bytes()


def test_refresh_patch_refuses_an_unknown_patch(engine, capsys):
    series(engine, "2.0.0", {"0001-first.patch": HEADER + D.file_diff(A, NEW, NEW + b"x = 1\n")})
    assert kiln(capsys, "patches", "checkout", "--engine", "vllm==2.0.0")[0] == 0
    code, err = kiln(capsys, "patches", "refresh", "--engine", "vllm==2.0.0", "--patch", "0009-nope.patch")
    assert code == 64 and "--patch 0009-nope.patch: not in the checked-out series (0001-first.patch)" in err
