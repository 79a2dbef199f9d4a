"""Same inputs, same image: a small image built twice (layer cache off, files of other
mtimes, a RUN step writing files at build time) gets the same image id and layers."""

from __future__ import annotations

import json
import os
import time

import pytest
from kilntest import remove_images, run_kiln

pytestmark = pytest.mark.docker

NAME = "kiln-test-mini"


def _build(tree) -> dict:
    result = run_kiln("build", NAME, "--force", "--no-cache", "--json", env={"KILN_ROOT": str(tree)}, cwd=tree)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def _records(tree, image_id: str) -> list[dict]:
    path = tree.parent / "results" / "builds" / f"{image_id.split(':')[1]}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_two_builds_of_the_same_inputs_give_the_same_image_id(kiln_tree, base_image, docker_daemon):
    recipe = kiln_tree / "recipes" / NAME
    dockerfile = recipe / "Dockerfile"
    # files made at build time, with the build's clock in their mtimes and in history
    dockerfile.write_text(
        dockerfile.read_text() + "RUN mkdir -p /opt/gen && date +%s%N > /dev/null && echo made > /opt/gen/file\n"
    )
    remove_images(docker_daemon, f"kiln/{NAME}")
    try:
        first = _build(kiln_tree)
        for path in recipe.rglob("*"):  # other mtimes on the host: not an input
            os.utime(path, (time.time() - 86400, time.time() - 86400))
        time.sleep(1.1)  # the second build's clock is a whole second later
        second = _build(kiln_tree)
        assert first["image_id"] == second["image_id"]
        rec1, rec2 = _records(kiln_tree, second["image_id"])
        # the builder itself made two different images (times): normalising made them one
        assert rec1["built_id"] != rec2["built_id"]
        assert rec2["layers"] == docker_daemon.image(second["image_id"]).attrs["RootFS"]["Layers"]
        img = docker_daemon.image(second["image_id"])
        assert img.attrs["Created"].startswith("1970-01-01T00:00:00")  # no git here: SOURCE_DATE_EPOCH or 0
        assert not img.attrs.get("Container")

        # a real change of content is a different image
        (recipe / "payload.txt").write_text("another payload\n")
        third = _build(kiln_tree)
        assert third["image_id"] != second["image_id"]
    finally:
        remove_images(docker_daemon, f"kiln/{NAME}")
