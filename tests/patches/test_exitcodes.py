"""The in-image applier's exit statuses are kiln's typed errors' exit codes, and a
failed build step that runs it becomes that typed error (no network, no Docker)."""

from __future__ import annotations

import pytest

from kiln.basics import errors
from kiln.domain.images import image_build
from kiln.domain.patching import series
from kiln.inimage import patch_applier as P
from kiln.inimage import patch_format, patch_tree

APPLY_STEP = (
    "Step 9/12 : RUN ln -s /opt/kiln/venv/site-packages /opt/kiln/site-packages"
    " && python /opt/kiln/lib/kiln_patching.py apply --root /opt/kiln/site-packages"
)


def test_applier_codes_equal_the_typed_errors():
    # patch_applier.py runs inside images with the standard library only, so it mirrors the codes
    assert patch_format._EXIT_PATCH_FAILED == patch_format.ApplyFailed.exit_code == errors.PatchFailed.exit_code
    assert patch_format._EXIT_DRIFT == patch_format.DriftError.exit_code == errors.OverrideDrift.exit_code
    assert patch_format._EXIT_INVALID == patch_format.PatchFormatError.exit_code == errors.PatchInvalid.exit_code


@pytest.mark.parametrize(
    "status, typed", [(6, errors.PatchFailed), (7, errors.OverrideDrift), (30, errors.PatchInvalid)]
)
def test_applier_step_status_picks_the_typed_error(status, typed):
    exc = errors.BuildFailed(
        "x",
        step=APPLY_STEP,
        status=status,
        tail=["vllm/a.py: does not compile after patching (0001-x.patch): bad", P._HINT_PATCH],
    )
    mapped = image_build._as_patch_failure(exc)
    assert isinstance(mapped, typed) and mapped.exit_code == status
    assert mapped.lines()[0] == "vllm/a.py: does not compile after patching (0001-x.patch): bad"
    assert P._HINT_PATCH not in mapped.lines()  # the typed error's own hint replaces the applier's


@pytest.mark.parametrize(
    "step, status",
    [
        (APPLY_STEP, 1),  # e.g. compileall after the applier: a build failure, not a patch one
        (APPLY_STEP, None),  # not a RUN exit status at all
        ("Step 3/12 : RUN exit 6", 6),  # a 6 from a step that does not run the applier
        ("Step 2/12 : COPY _kiln/kiln_patching.py /opt/kiln/lib/kiln_patching.py", 6),
    ],
)
def test_other_failures_stay_build_failures(step, status):
    assert image_build._as_patch_failure(errors.BuildFailed("x", step=step, status=status)) is None


def test_pinned_versions_follow_pep440(tmp_path, monkeypatch, capsys):
    from kiln.basics import paths

    for marker in paths._MARKERS:  # a checkout as far as repo_root() is concerned
        (tmp_path / marker).mkdir()
    for name in ("0.33.0", "0.33.0rc1", "0.9.0", "0.32.0", "latest", "0.33.0.post1"):
        (tmp_path / "patches" / "vllm" / name).mkdir(parents=True)
        (tmp_path / "patches" / "vllm" / name / "series").write_text("")
    monkeypatch.setenv("KILN_ROOT", str(tmp_path))
    paths.repo_root.cache_clear()
    try:
        assert series.pinned_versions() == ["0.9.0", "0.32.0", "0.33.0rc1", "0.33.0", "0.33.0.post1"]
    finally:
        paths.repo_root.cache_clear()
    assert "patches/vllm/latest: 'latest' is not a PEP 440 version; left out" in capsys.readouterr().err


def test_the_applier_is_stdlib_only_and_the_only_patch_files_in_engine_images():
    """It runs in images with nothing but python3, standing alone with its engine and parser: no kiln
    import, no third-party module. And host tools (diff, merge, quilt) are no engine-image input."""
    import ast
    import sys
    from pathlib import Path

    from kiln.domain.images import engine_image

    # each module, with its siblings: by their shipped names, and by their names on the host
    for module, sibling, relatives in (
        (P, {"kiln_patchformat", "kiln_patchtree"}, ["patch_format", "patch_tree"]),
        (patch_tree, {"kiln_patchformat"}, ["patch_format"]),
        (patch_format, set(), []),
    ):
        tree = ast.parse(Path(module.__file__).read_text())
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0}
        relative = [
            (n.module, [a.name for a in n.names])
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.level > 0
        ]
        assert relative == ([(None, relatives)] if relatives else []), relative
        assert imported - {"__future__"} - sibling <= set(sys.stdlib_module_names), imported
    shipped = {arc: path.resolve() for arc, path in engine_image._patcher_sources().items()}
    assert shipped == {
        engine_image.PATCHER_ARC: Path(P.__file__).resolve(),
        engine_image._PATCHTREE_ARC: Path(patch_tree.__file__).resolve(),
        engine_image._PATCHFORMAT_ARC: Path(patch_format.__file__).resolve(),
    }
    assert Path(engine_image._PATCHFORMAT_ARC).stem == "kiln_patchformat"
    assert Path(engine_image._PATCHTREE_ARC).stem == "kiln_patchtree"
