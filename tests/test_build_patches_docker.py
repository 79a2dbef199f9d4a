"""Patches that fail in the image during a real build (a hunk that does not apply, broken
syntax, conflict markers) and those that fail before Docker is asked."""

from __future__ import annotations

import pytest
from kilntest import REPO, remove_images, run_kiln
from mini_build import NAME, resolve

pytestmark = pytest.mark.docker

BROKEN = (
    "Why: a hunk that cannot apply\nUpstream: no - test only\n\n"
    "--- a/kiln_note.txt\n+++ b/kiln_note.txt\n@@ -1,3 +1,3 @@\n context that is not there\n-old\n+new\n more\n"
)
CREATES_NOTE = (
    "Why: creates the file\nUpstream: no\n\n--- /dev/null\n+++ b/kiln_note.txt\n@@ -0,0 +1,3 @@\n+a\n+b\n+c\n"
)


def _break_series(tree, patches: dict[str, str]) -> None:
    series_dir = tree / "patches" / "vllm" / "0.0.1.dev0"
    for name, text in patches.items():
        (series_dir / name).write_text(text)
    (series_dir / "series").write_text("".join(f"{name}\n" for name in patches))


def _assert_failed_patch_step(result, docker_daemon, code: int, *wanted: str) -> None:
    """Exit `code` and the typed error's hint (not BuildFailed's), one error line naming
    the problem, and neither the recipe nor the engine image tagged."""
    from kiln.basics.errors import BuildFailed, PatchFailed

    assert result.returncode == code, result.stderr[-3000:]
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("kiln: error:")]
    assert len(errors) == 1, errors
    for text in wanted:
        assert text in errors[0], errors[0]
    assert f"hint: {PatchFailed.hint}" in result.stderr and BuildFailed.hint not in result.stderr
    assert docker_daemon.client.images.list(name=f"kiln/{NAME}") == []
    engine_image = resolve().engine_image  # the engine's input digest includes the broken series
    assert docker_daemon.image(engine_image.tag) is None, "a failed patch step tagged the engine"
    assert (
        docker_daemon.image(engine_image.alias_tag) is None
        or docker_daemon.image(engine_image.alias_tag).labels.get("ai.kiln.input-digest") != engine_image.digest
    )


def test_patch_that_does_not_apply_in_the_image_fails_with_its_hunk(kiln_tree, base_image, docker_daemon):
    """The stand-in engine pin has no wheel to pre-check on the host, so the in-image
    step is what fails: the RUN step's exit status (the applier's 6) picks the error, its
    per-hunk line reaches the user, no tag is left."""
    _break_series(kiln_tree, {"0001-broken.patch": CREATES_NOTE, "0002-broken.patch": BROKEN})
    remove_images(docker_daemon, f"kiln/{NAME}")
    result = run_kiln("build", NAME, env={"KILN_ROOT": str(kiln_tree)}, cwd=kiln_tree)
    _assert_failed_patch_step(
        result,
        docker_daemon,
        6,
        "0002-broken.patch: kiln_note.txt: hunk #1 @@ -1,3 +1,3 @@",
        '(first context line: "context that is not there") does not apply',
    )


def test_patch_that_breaks_syntax_in_the_image_is_a_patch_failure(kiln_tree, base_image, docker_daemon):
    """Not a hunk failure, so no phrase to grep for: only the applier's exit status says
    it is a patch problem (this exited 5 when build.py matched output text)."""
    _break_series(
        kiln_tree,
        {
            "0001-syntax.patch": (
                "Why: a patch that applies but leaves Python that does not compile\nUpstream: no\n\n"
                "--- /dev/null\n+++ b/kiln_broken.py\n@@ -0,0 +1,2 @@\n+def f(:\n+    pass\n"
            )
        },
    )
    remove_images(docker_daemon, f"kiln/{NAME}")
    result = run_kiln("build", NAME, env={"KILN_ROOT": str(kiln_tree)}, cwd=kiln_tree)
    _assert_failed_patch_step(
        result, docker_daemon, 6, "kiln_broken.py: does not compile after patching (0001-syntax.patch)"
    )


def test_override_with_conflict_markers_is_drift_in_the_image(kiln_tree, base_image, docker_daemon):
    """A replacement left with `kiln override rebase`'s conflict markers: the overlay step's
    status 7 makes it OverrideDrift (it exited 5 when build.py matched output text)."""
    import hashlib

    from kiln.basics.errors import BuildFailed, OverrideDrift

    upstream = "def f():\n    return 1\n"
    _break_series(
        kiln_tree,
        {
            "0001-module.patch": (
                "Why: a module for the override to fork\nUpstream: no\n\n--- /dev/null\n+++ b/vllm/kiln_mod.py\n"
                "@@ -0,0 +1,2 @@\n" + "".join(f"+{ln}\n" for ln in upstream.splitlines())
            )
        },
    )
    recipe = kiln_tree / "recipes" / NAME
    feature = recipe / "experimental" / "forked"
    (feature / "files").mkdir(parents=True)
    (feature / "files" / "kiln_mod.py").write_text(
        "def f():\n<<<<<<< ours\n    return 2\n||||||| base\n    return 1\n=======\n    return 3\n>>>>>>> theirs\n"
    )
    (feature / "override.yaml").write_text(
        "name: forked\ndescription: a fork left mid-rebase\nengine:\n  name: vllm\n  version: 0.0.1.dev0\n"
        "replacements:\n  - target: vllm/kiln_mod.py\n    file: files/kiln_mod.py\n"
        f"    upstream_sha256: {hashlib.sha256(upstream.encode()).hexdigest()}\n"
    )
    (recipe / "recipe.yaml").write_text((recipe / "recipe.yaml").read_text() + "experimental: [forked]\n")
    remove_images(docker_daemon, f"kiln/{NAME}")
    result = run_kiln("build", NAME, env={"KILN_ROOT": str(kiln_tree)}, cwd=kiln_tree)
    assert result.returncode == OverrideDrift.exit_code, result.stderr[-3000:]
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("kiln: error:")]
    assert len(errors) == 1, errors
    assert "feature forked:" in errors[0] and "kiln_mod.py: unresolved conflict markers" in errors[0]
    assert f"hint: {OverrideDrift.hint}" in result.stderr and BuildFailed.hint not in result.stderr
    assert docker_daemon.client.images.list(name=f"kiln/{NAME}") == []


def test_patch_without_its_header_fails_before_docker(kiln_tree, base_image, docker_daemon):
    """Malformed patches never reach the in-image applier (its status 30 is unit-tested):
    the host parses the series with the same code and refuses it before any step runs."""
    from kiln.basics.errors import PatchInvalid

    _break_series(kiln_tree, {"0001-noheader.patch": CREATES_NOTE.split("\n\n", 1)[1]})
    remove_images(docker_daemon, f"kiln/{NAME}")
    result = run_kiln("build", NAME, env={"KILN_ROOT": str(kiln_tree)}, cwd=kiln_tree)
    assert result.returncode == PatchInvalid.exit_code, result.stderr[-3000:]
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("kiln: error:")]
    assert errors and all("0001-noheader.patch: header has no" in ln for ln in errors), errors
    assert "Step 1/" not in result.stderr
    assert docker_daemon.client.images.list(name=f"kiln/{NAME}") == []


def test_real_series_broken_fails_before_docker(tmp_path, docker_daemon):
    """Against the real vLLM 0.32.0 sources the host pre-flight catches it in seconds,
    before any build step runs."""
    import shutil

    tree = tmp_path / "tree"
    for part in ("recipes", "docker-images", "engine", "patches"):
        shutil.copytree(REPO / part, tree / part, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    series = tree / "patches" / "vllm" / "0.32.0"
    patch = min(series.glob("*.patch"))
    text = patch.read_text()
    body = text[text.index("\n@@ ") :]  # header lines may be indented too: look past the first hunk header
    first_context = next(ln for ln in body.splitlines() if ln.startswith(" ") and ln.strip())
    patch.write_text(text.replace(first_context, " this line is not in vLLM 0.32.0", 1))
    result = run_kiln("build", "tiny-moe", env={"KILN_ROOT": str(tree)}, cwd=tree)
    assert result.returncode == 6, result.stderr[-3000:]
    assert f"{patch.name}:" in result.stderr and "does not apply" in result.stderr
    assert "Step 1/" not in result.stderr
