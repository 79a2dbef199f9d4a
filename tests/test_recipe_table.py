"""README.md's recipe table is generated from the recipes and must match them."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

from kilntest import REPO

from kiln.domain.catalogue import readme_table as catalogue


def test_readme_table_is_in_sync_with_the_recipes():
    text = (REPO / "README.md").read_text()
    assert catalogue.replace_in(text) == text, "run scripts/recipe_table.py --write"


def test_every_recipe_has_a_row_with_its_engine_and_gpus():
    table = catalogue._table()
    rows = {
        line.split(" | ")[0].lstrip("| "): line
        for line in table.splitlines()
        if line.startswith("| ") and "---" not in line
    }
    for folder in sorted(p.parent.name for p in (REPO / "recipes").glob("*/recipe.yaml")):
        assert folder in rows, folder
    assert "| vLLM 0.34.0 | cuda | linux/amd64 | 2 nodes x 8 x H100 |" in rows["deepseek-v32-mtp-2node"]
    assert rows["qwen3-30b-a3b"].endswith("| A100, H100, H200, B200, GB200 |")  # not L40S: 58 GiB of bf16 weights
    assert "| none (CPU) | any x86-64 host with Docker |" in rows["tiny-moe"]


def test_platforms_come_from_engine_platforms():
    loaded = SimpleNamespace(recipe=SimpleNamespace(engine=SimpleNamespace(platforms=["linux/amd64", "linux/arm64"])))
    assert catalogue._platforms(loaded) == "linux/amd64, linux/arm64"
    # glm53-kindling declares both (GH200/GB200 nodes are aarch64); the default is amd64 alone
    assert catalogue._row("glm53-kindling").platforms == "linux/amd64, linux/arm64"
    assert catalogue._row("tiny-moe").platforms == "linux/amd64"


def test_the_script_fails_on_a_stale_table(tmp_path, monkeypatch):
    script = REPO / "scripts" / "recipe_table.py"
    ok = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    stale = (REPO / "README.md").read_text().replace("| tiny-moe | vLLM 0.32.0 |", "| tiny-moe | vLLM 0.31.0 |")
    assert catalogue.replace_in(stale) != stale
