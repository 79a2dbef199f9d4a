"""The README states the tiny-moe image id a fresh machine gets for tiny-moe's current
inputs; the tiny-moe the e2e session builds (from `kiln base build` up) must be that
image. No build of its own: it reuses the session's tiny-moe."""

from __future__ import annotations

import re

import pytest
from kilntest import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.docker]

ROW = re.compile(r"^\| tiny-moe \| `(sha256:[0-9a-f]{64})` \| `(sha256:[0-9a-f]{64})` \|", re.MULTILINE)


def stated() -> tuple[str, str]:
    found = ROW.search((REPO / "README.md").read_text())
    assert found, "README.md has no `| tiny-moe | `input digest` | `image id` |` row"
    return found.group(1), found.group(2)


def test_tiny_moe_is_the_image_id_the_readme_states(tiny_moe):
    digest, image_id = stated()
    assert tiny_moe.recipe_image.digest == digest, (
        f"README.md states the image id for input digest {digest[:19]}, tiny-moe's inputs are now "
        f"{tiny_moe.recipe_image.digest[:19]}: run `nox -s repro` and update the row"
    )
    assert tiny_moe.image.id == image_id, (
        f"tiny-moe built here is {tiny_moe.image.id[:19]}, README.md says {image_id[:19]}: "
        f"`kiln rebuild --verify kiln/tiny-moe:latest` and docs/reproducibility.md say what to check"
    )
