"""`kiln plan`'s KV-cache arithmetic against what vLLM itself reports: tiny-moe served on
CPU logs "CPU KV cache size: N tokens" at start; the plan, reading the model configs out
of the built image (the weights at hand), must say the same N, at two KV spaces."""

from __future__ import annotations

import dataclasses
import re

import pytest
from kilntest import REPO

from kiln.domain.images.image_files import recipe_image_reader
from kiln.domain.planning.model_shape import plan_input
from kiln.domain.planning.plan import Layout, compute
from kiln.domain.recipes.recipe import load_recipe
from kiln.domain.serving.serving_container import ServingContainer, free_port, run_spec

pytestmark = [pytest.mark.e2e, pytest.mark.docker]

KV_LINE = re.compile(r"CPU KV cache size: ([\d,]+) tokens")


def _reported_tokens(docker_daemon, image_id: str, loaded, space: str) -> int:
    spec = run_spec(loaded, image_id, host_port=free_port(), host_ip="127.0.0.1", env={"VLLM_CPU_KVCACHE_SPACE": space})
    with ServingContainer(docker_daemon, spec) as box:
        box.start()
        box.wait_healthy(loaded.recipe.smoke.startup_timeout_s)
        log = box.logs(tail=100000)
    found = KV_LINE.findall(log)
    assert found, "no 'CPU KV cache size' line in the server log"
    return int(found[-1].replace(",", ""))


@pytest.mark.parametrize("space", ["1", "2"])
def test_plan_kv_tokens_equal_what_vllm_reports(tiny_moe, docker_daemon, space):
    loaded, img = tiny_moe.loaded, tiny_moe.image
    inp = plan_input(loaded, image_json=recipe_image_reader(loaded.name, docker_daemon))
    assert inp.target.source.startswith("/models/tiny-qwen3moe/config.json in kiln/tiny-moe:")
    inp = dataclasses.replace(inp, env={**inp.env, "VLLM_CPU_KVCACHE_SPACE": space})
    planned = compute(inp, None, Layout()).kv_tokens
    reported = _reported_tokens(docker_daemon, img.id, loaded, space)
    print(f"VLLM_CPU_KVCACHE_SPACE={space}: vLLM {reported:,} tokens, kiln plan {planned:,} tokens")
    assert planned == reported


def test_the_hf_variants_shape_block_plans_the_same_kv_cache(tiny_moe, docker_daemon):
    """tiny-moe-hf plans from its recipe's shape: block, tiny-moe from the image's configs."""
    from_image = compute(
        plan_input(tiny_moe.loaded, image_json=recipe_image_reader(tiny_moe.loaded.name, docker_daemon)), None, Layout()
    )
    from_shape = compute(plan_input(load_recipe(REPO / "recipes" / "tiny-moe-hf")), None, Layout())
    assert from_shape.kv_tokens == from_image.kv_tokens and from_shape.kv_per_seq == from_image.kv_per_seq
