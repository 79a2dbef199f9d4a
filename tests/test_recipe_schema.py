"""Recipe validation: every problem is one `file:line: field: message` line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from kilntest import REPO, run_kiln, write_recipe

from kiln.basics.errors import RecipeInvalid
from kiln.domain.recipes.recipe import load_recipe

# daemon-optional commands run with no daemon, on purpose (conftest no_docker): unit tests
pytestmark = pytest.mark.usefixtures("no_docker")

GOOD = (REPO / "recipes" / "tiny-moe" / "recipe.yaml").read_text()


def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(RecipeInvalid) as info:
        load_recipe(write_recipe(tmp_path, text))
    return info.value.problems


def edit(path: list, value) -> str:
    """The good recipe with one field replaced (or removed when value is ...)."""
    data = yaml.safe_load(GOOD)
    node = data
    for key in path[:-1]:
        node = node[key]
    if value is ...:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return yaml.safe_dump(data, sort_keys=False)


def line_of_path(text: str, path: list) -> int:
    """Line of a nested key in block-style YAML (each level indented 2 more)."""
    lines = text.splitlines()
    start = 0
    for depth, key in enumerate(path):
        prefix = "  " * depth + f"{key}:"
        start = next(i for i in range(start, len(lines)) if lines[i].startswith(prefix))
    return start + 1


def line_of(text: str, needle: str) -> int:
    for i, line in enumerate(text.splitlines(), 1):
        if needle in line:
            return i
    raise AssertionError(needle)


def test_good_recipe_loads(tmp_path):
    loaded = load_recipe(write_recipe(tmp_path, GOOD))
    assert loaded.recipe.launch.served_model_name == "tiny-moe"
    assert loaded.recipe.engine.flavour == "cpu"


@pytest.mark.parametrize(
    ("path", "value", "field", "message"),
    [
        (["launch", "port"], 80000, "launch.port", "must be an integer in 1..65535"),
        (["launch", "port"], "8000", "launch.port", "must be an integer in 1..65535"),
        (["launch", "port"], True, "launch.port", "must be an integer in 1..65535"),
        (["engine", "flavour"], "tpu", "engine.flavour", "must be 'cpu' or 'cuda'"),
        (["engine", "name"], "sglang", "engine.name", "must be 'vllm'"),
        (["engine", "version"], 0.32, "engine.version", "must be a valid string"),
        (["engine", "version"], "latest", "engine.version", "must match"),
        # fits the pattern, but no index serves it and no lock can record it (PEP 440)
        (["engine", "version"], "0.32.0-test", "engine.version", "'0.32.0-test' is not a PEP 440 version"),
        (["engine", "torch"], "2.13.0-cpu-x", "engine.torch", "is not a PEP 440 version"),
        (["engine", "base_image", "digest"], "sha256:xyz", "engine.base_image.digest", "must match"),
        (["smoke", "max_tokens"], 0, "smoke.max_tokens", "greater than or equal to 1"),
        (["smoke", "prompts"], [], "smoke.prompts", "at least 1 item"),
        (["smoke", "prompts"], "hello", "smoke.prompts", "must be a valid list"),
        (["smoke", "expect_spec_decode"], "yes", "smoke.expect_spec_decode", "must be a valid boolean"),
        (["launch", "env"], {"A": 1}, "launch.env.A", "must be a valid string"),
        (["launch", "args"], ["--x"], "launch.args", "must be a valid dictionary"),
        (["budgets", "max_image_size_gb"], -1, "budgets.max_image_size_gb", "greater than 0"),
        (["model", "target", "source"], "hub", "model.target.source", "must be 'baked', 'host_path' or 'hf'"),
        (["model", "target", "path"], "relative/path", "model.target.path", "must match"),
        (["description"], ..., "description", "required field is missing"),
        (["launch", "served_model_name"], ..., "launch.served_model_name", "required field is missing"),
        (["name"], "Bad Name", "name", "must match"),
    ],
)
def test_field_errors_name_file_line_and_field(tmp_path, path, value, field, message):
    text = edit(path, value)
    found = problems(tmp_path, text)
    matching = [p for p in found if f": {field}: " in p]
    assert matching, found
    assert message in matching[0], matching[0]
    file_part, line_part = matching[0].split(":")[:2]
    assert file_part.endswith("recipes/tiny-moe/recipe.yaml")
    if value is not ...:
        assert int(line_part) == line_of_path(text, field.split(".")), matching[0]


def test_unknown_keys_rejected_with_their_line(tmp_path):
    text = GOOD.replace("  port: 8000\n", "  port: 8000\n  serverd_model_name: typo\n")
    found = problems(tmp_path, text)
    assert found == [
        f"{found[0].split(':')[0]}:{line_of(text, 'serverd_model_name')}: launch.serverd_model_name: unknown key"
    ]


def test_unknown_top_level_key(tmp_path):
    found = problems(tmp_path, GOOD + "extra_thing: 1\n")
    assert any(": extra_thing: unknown key" in p for p in found), found


def test_host_path_source_needs_host_path(tmp_path):
    text = edit(["model", "draft"], {"source": "host_path", "path": "/models/d"})
    found = problems(tmp_path, text)
    assert any("model.draft" in p and "host_path is required" in p for p in found), found


def test_duplicate_keys_are_errors(tmp_path):
    text = GOOD.replace("  port: 8000\n", "  port: 8000\n  port: 9000\n")
    found = problems(tmp_path, text)
    assert len(found) == 1
    assert f":{line_of(text, 'port: 9000')}: (yaml): duplicate key 'port'" in found[0]


def test_bad_yaml_syntax_names_the_line(tmp_path):
    text = GOOD.replace("  port: 8000\n", "  port: [8000\n")
    found = problems(tmp_path, text)
    assert len(found) == 1 and "(yaml): invalid YAML" in found[0]
    assert int(found[0].split(":")[1]) >= line_of(text, "port: [8000")


def test_missing_dockerfile_and_overlay(tmp_path):
    d = write_recipe(tmp_path, GOOD.replace("budgets:", "experimental: [nope]\nbudgets:"))
    (d / "Dockerfile").unlink()
    found = problems_dir(d)
    assert any("missing file" in p and p.rstrip().endswith("recipes/tiny-moe/Dockerfile") for p in found), found
    assert any(": experimental[0]: no overlay at" in p for p in found), found


def problems_dir(d: Path) -> list[str]:
    with pytest.raises(RecipeInvalid) as info:
        load_recipe(d)
    return info.value.problems


def test_name_must_match_folder(tmp_path):
    d = write_recipe(tmp_path, GOOD, name="other")
    assert any("must equal its folder name 'other'" in p for p in problems_dir(d))


def test_smoke_served_model_name_must_be_served(tmp_path):
    text = edit(["smoke", "served_model_name"], "nope")
    found = problems(tmp_path, text)
    assert found == [
        (
            f"{found[0].split(':')[0]}:{line_of_path(text, ['smoke', 'served_model_name'])}: smoke.served_model_name: "
            f"'nope' is not served (launch.served_model_name is 'tiny-moe')"
        )
    ]


def test_missing_recipe_file(tmp_path):
    d = tmp_path / "recipes" / "ghost"
    d.mkdir(parents=True)
    assert problems_dir(d)[0].endswith("recipes/ghost/recipe.yaml:1: (file): not found")


def test_cli_check_exit_code_2_one_line_each(tmp_path):
    root = tmp_path / "tree"
    (root / "docker-images").mkdir(parents=True)
    (root / "engine").mkdir()
    write_recipe(root, edit(["launch", "port"], 0).replace("flavour: cpu", "flavour: gpu"))
    result = run_kiln("check", "tiny-moe", env={"KILN_ROOT": str(root)}, cwd=root)
    assert result.returncode == 2, result.stderr
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("kiln: error:")]
    assert len(errors) == 2, result.stderr
    assert "recipes/tiny-moe/recipe.yaml:" in errors[0]
    assert "Traceback" not in result.stderr


def test_schema_is_json_schema_for_editors():
    result = run_kiln("schema")
    assert result.returncode == 0
    schema = json.loads(result.stdout)
    assert schema["additionalProperties"] is False
    assert {"name", "engine", "model", "launch", "smoke"} <= set(schema["required"])
    import jsonschema

    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(yaml.safe_load(GOOD), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**yaml.safe_load(GOOD), "bogus": 1}, schema)


@pytest.mark.parametrize(
    "launch_edit, kiln_refuses",
    [
        ({"env": {"X": "x\nRUN touch /pwned"}}, "launch.env.X: control character U+000A at offset 1"),
        ({"env": {"X": "a\u2028b"}}, "launch.env.X: control character U+2028 at offset 1"),
        (
            {"env": {"LD_PRELOAD": "/x.so"}, "allow_unsafe_env": {"LD_PRELOAD": " "}},
            "launch.allow_unsafe_env.LD_PRELOAD: must say why",
        ),
        (
            {"env": {"LD_PRELOAD": "/x.so"}, "allow_unsafe_env": {"LD_PRELOAD": "why\nnot"}},
            "launch.allow_unsafe_env.LD_PRELOAD: control character U+000A",
        ),
        ({"allow_unsafe_env": ["LD_PRELOAD"]}, "launch.allow_unsafe_env: must be a valid dictionary"),
    ],
)
def test_editor_schema_and_kiln_refuse_the_same_env(tmp_path, launch_edit, kiln_refuses):
    """`kiln schema` spells the env rules as patterns, so an editor flags what kiln refuses."""
    import jsonschema

    schema = json.loads(run_kiln("schema").stdout)
    data = yaml.safe_load(GOOD)
    data["launch"].update(launch_edit)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, schema)
    found = problems(tmp_path, yaml.safe_dump(data, sort_keys=False))
    assert len(found) == 1 and kiln_refuses in found[0], found
    # a reason, and a value with spaces and non-ASCII text, are fine in both
    data["launch"] = {
        **yaml.safe_load(GOOD)["launch"],
        "env": {"LD_PRELOAD": "/x.so", "X": "a b ñ"},
        "allow_unsafe_env": {"LD_PRELOAD": "jemalloc, see docs/x.md"},
    }
    jsonschema.validate(data, schema)
    assert (
        load_recipe(write_recipe(tmp_path / "ok", yaml.safe_dump(data, sort_keys=False))).recipe.launch.env["X"]
        == "a b ñ"
    )


def test_every_shipped_recipe_is_valid():
    result = run_kiln("check", "--all")
    assert result.returncode == 0, result.stderr
