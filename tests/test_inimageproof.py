"""`kiln smoke --in-image`: the facts a GPU image reports about itself without a GPU
(kiln.inimage.engine_facts, run here by the dev venv's own Python) and how they are judged
against the recipe (domain.imagecheck.in_image_smoke)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kiln.domain.imagecheck import in_image_smoke
from kiln.domain.imagecheck.in_image_smoke import Expected, judge

MODULES = ["triton", "vllm", "kiln_engine"]
GOOD = {
    "machine": "aarch64",
    "torch": "2.14.0+cu130",
    "cuda": "13.0",
    "vllm": "0.33.0",
    "imports": dict.fromkeys(MODULES, "ok"),
    "plugins": [in_image_smoke._PLUGIN],
    "draft_trunc": "vllm.v1.worker.gpu.spec_decode.draft_trunc",
}
WANT = Expected(machine="aarch64", cuda="13.0", modules=MODULES, draft_trunc=True)


def _failed(facts: dict, want: Expected = WANT) -> dict[str, str]:
    return {name: detail for name, ok, detail in judge(facts, want) if not ok}


def test_an_image_with_every_fact_right_passes_every_proof():
    checks = judge(GOOD, WANT)
    assert [name for name, _, _ in checks] == [
        "machine",
        "torch_cuda",
        "imports",
        "kiln_engine_plugin",
        "draft_trunc_registered",
    ]
    assert all(ok for _, ok, _ in checks)


def test_each_wrong_fact_fails_its_own_proof_and_says_why():
    assert _failed({**GOOD, "machine": "x86_64"}) == {"machine": "runs on x86_64, platform needs aarch64"}
    assert list(_failed({**GOOD, "cuda": "12.8"})) == ["torch_cuda"]
    assert list(_failed({**GOOD, "cuda": None, "torch": "2.14.0+cpu"})) == ["torch_cuda"]
    broken = {**GOOD, "imports": {**GOOD["imports"], "vllm": "ImportError: libcudart.so.13: cannot open"}}
    assert "vllm: ImportError: libcudart.so.13" in _failed(broken)["imports"]
    assert "triton: not tried" in _failed({**GOOD, "imports": {}})["imports"]
    assert list(_failed({**GOOD, "plugins": []})) == ["kiln_engine_plugin"]
    assert list(_failed({**GOOD, "plugins_error": "RuntimeError: x"})) == ["kiln_engine_plugin"]
    assert list(_failed({**GOOD, "draft_trunc": None})) == ["draft_trunc_registered"]
    # a recipe without draft-trunc does not ask for it; one without engine.cuda takes any CUDA build
    relaxed = Expected(machine="aarch64", cuda=None, modules=MODULES, draft_trunc=False)
    assert _failed({**GOOD, "draft_trunc": None, "cuda": "12.8"}, relaxed) == {}


def test_the_script_as_sent_runs_alone_and_reports_what_it_found():
    """The in-image script is the module's source plus one appended call: run it with
    `python -c` as a throwaway container does. Here torch is the dev venv's CPU build
    and vLLM is absent, so the facts are real and some proofs must fail."""
    from kiln import inimage

    script = inimage.source("engine_facts").read_text() + "\nreport(['json', 'kiln_no_such_module'])\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    [line] = [ln for ln in done.stdout.splitlines() if ln.startswith(in_image_smoke._MARKER + " ")]
    facts = json.loads(line.split(" ", 1)[1])
    import platform

    import torch

    assert facts["machine"] == platform.machine() and facts["torch"] == torch.__version__
    assert facts["imports"]["json"] == "ok"
    assert facts["imports"]["kiln_no_such_module"].startswith("ModuleNotFoundError")
    assert facts["vllm"] is None and facts["draft_trunc"] is None and "plugins_error" in facts
    failed = _failed(facts, Expected(machine=platform.machine(), cuda="13.0", modules=["json"], draft_trunc=True))
    assert set(failed) >= {"kiln_engine_plugin", "draft_trunc_registered"} and "machine" not in failed


def _published(smoke: dict, platforms: dict) -> object:
    from kiln.domain.publishing.publish_records import PublishResult

    return PublishResult(
        recipe="glm53-kindling",
        image_id="sha256:" + "a" * 64,
        input_digest="sha256:" + "b" * 64,
        manifest_digest="sha256:" + "c" * 64,
        registry="127.0.0.1:5000",
        repository="kiln/glm",
        channel="experimental",
        tags=[],
        pushed=True,
        smoke=smoke,
        platforms=platforms,
    )


@pytest.mark.parametrize(
    "smoke, platforms, says",
    [
        ({"status": "passed", "level": "served"}, {}, "passed"),
        ({"status": "passed", "level": "in-image"}, {}, "passed in-image (proved inside the image, not served)"),
        (
            {"status": "passed"},
            {"linux/amd64": {"smoke_level": "served"}, "linux/arm64": {"smoke_level": "in-image"}},
            "passed in-image on linux/arm64 (proved inside the image, not served)",
        ),
        ({"status": "skipped"}, {}, "SKIPPED (--skip-smoke-check"),
    ],
)
def test_the_publish_summary_says_when_a_pass_was_only_proved_inside_the_image(smoke, platforms, says):
    from kiln.commands.publishing.publish import _smoke_said

    got = _smoke_said(_published(smoke, platforms))
    assert got.startswith(says) and (got == says or says.endswith("check"))
