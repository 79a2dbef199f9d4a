"""declared_engine's label rules and engine_stamp's label mapping (no Docker)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kiln.basics.errors import EngineMismatch
from kiln.domain.imagecheck import declared_engine, engine_stamp


def _image(version="0.33.0", **found):
    return SimpleNamespace(
        labels={
            "ai.kiln.engine.version": version,
            **engine_stamp._labels_for({"torch": None, "cuda": None, "nccl": None, **found}),
        }
    )


def test_probe_labels_keep_cuda_major_minor_and_skip_what_is_absent():
    labels = engine_stamp._labels_for({"torch": "2.13.0", "cuda": "13.0.96", "nccl": "2.29.7"})
    assert labels["ai.kiln.engine.torch"] == "2.13.0"
    assert labels["ai.kiln.engine.cuda"] == "13.0"
    assert labels["ai.kiln.engine.nccl"] == "2.29.7"
    cpu = engine_stamp._labels_for({"torch": "2.13.0+cpu", "cuda": None, "nccl": None})
    assert "ai.kiln.engine.cuda" not in cpu and "ai.kiln.engine.nccl" not in cpu
    assert engine_stamp.is_stamped(SimpleNamespace(labels=cpu))


def test_matching_engine_passes(glm):
    e = glm.recipe.engine
    declared_engine.verify_labels(glm, _image(e.version, torch=e.torch, cuda=f"{e.cuda}.96", nccl="2.29.7"))


def test_wrong_torch_fails_naming_the_recipe_line(glm):
    with pytest.raises(EngineMismatch) as exc:
        declared_engine.verify_labels(glm, _image(torch="2.12.1", cuda="13.0"))
    assert f"recipe.yaml:{glm.line_of('engine', 'torch')}: engine.torch" in exc.value.message
    assert "2.12.1" in exc.value.message


def test_cpu_torch_contradicts_a_declared_cuda(glm):
    with pytest.raises(EngineMismatch) as exc:
        declared_engine.verify_labels(glm, _image(torch="2.13.0+cpu"))
    assert "engine.cuda" in exc.value.message and "has none" in exc.value.message


def test_unprobed_image_is_not_judged_on_missing_labels(glm):
    declared_engine.verify_labels(glm, SimpleNamespace(labels={"ai.kiln.engine.version": glm.recipe.engine.version}))
