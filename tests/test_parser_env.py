"""The parser environment's inputs (domain/imagecheck/parser_env.py) and the probe's
batching of a pin's command lines (launch_arg_check.ask), without a daemon: what it
installs from the lock, what names it, and which answers one container run fills."""

from __future__ import annotations

import pytest

from kiln.domain.imagecheck import launch_arg_check, launch_checker, parser_env
from kiln.domain.images.definitions import resolve
from kiln.domain.recipes.resolved import resolve_recipe


@pytest.fixture
def env():
    found = parser_env.parser_env(resolve(resolve_recipe("glm53-kindling"), platform="linux/amd64").engine_image)
    assert found is not None
    return found


def test_it_installs_the_parsers_wheels_of_the_lock_and_leaves_the_gpu_runtime_out(env):
    names = {f.name for f in env.wanted}
    assert {"vllm", "torch", "transformers", "pydantic", "uv"} <= names
    assert not {n for n in names if n.startswith("nvidia-")}
    assert not names & {"triton", "flashinfer-python", "cuda-toolkit"}
    lock = env.engine_image.lock
    for f in env.wanted:  # every file is the lock's own, hash included
        assert lock.package(f.name) is not None or f.name == "uv"


def test_its_tag_is_the_digest_of_its_inputs_and_a_cpu_engine_has_none(env, monkeypatch):
    assert env.tag == f"kiln/argcheck-cuda:{env.digest.removeprefix('sha256:')[:12]}"
    assert env.folder.name == f"env-{env.tag.rsplit(':', 1)[1]}"
    again = parser_env.parser_env(resolve(resolve_recipe("glm53-kindling-2node"), platform="linux/amd64").engine_image)
    assert again is not None and again.digest == env.digest  # one environment per pin
    cpu = resolve(resolve_recipe("tiny-moe"), platform="linux/amd64").engine_image
    assert parser_env.parser_env(cpu) is None


def test_one_container_run_answers_the_other_recipes_of_the_pin(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    recipe = resolve_recipe("glm53-kindling")
    sent: list[list[launch_arg_check.Job]] = []

    def probe(docker, image_id, *, dump, jobs, mounts=None):
        sent.append(jobs)
        return {
            "version": "0.34.0",
            "kiln_engine": "0.1.0",
            "flags": {},
            "jobs": [{"problems": [], "stages": ["parse"]}] * len(jobs),
        }

    monkeypatch.setattr(launch_arg_check, "_probe", probe)
    job = launch_arg_check.Job.of(recipe)
    others = launch_checker._same_pin_jobs(recipe)
    assert others and job.digest not in {j.digest for j in others}
    launch_arg_check.ask(None, "sha256:" + "a" * 64, job, also=lambda: others)
    assert [j.digest for j in sent[0]] == [job.digest, *dict.fromkeys(j.digest for j in others)]
    for other in others:  # answered from the cache now: no second run
        launch_arg_check.ask(None, "sha256:" + "a" * 64, other, also=lambda: pytest.fail("asked again"))
    assert len(sent) == 1
