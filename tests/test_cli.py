"""The command line as scripts see it: exit codes, --json documents, --quiet, --version,
completion, and where kiln looks for its checkout and records."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from clijson import SCHEMAS, validated
from kilntest import REPO, run_kiln

import kiln

# daemon-optional commands run with no daemon, on purpose (conftest no_docker): unit tests
pytestmark = pytest.mark.usefixtures("no_docker")


def test_version():
    r = run_kiln("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"kiln {kiln.__version__}"


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["bogus"], "invalid choice: 'bogus'"),
        (["build"], "the following arguments are required: name"),
        (["list", "--nope"], "unrecognized arguments: --nope"),
    ],
)
def test_usage_errors_exit_64_with_one_prefix(argv, needle):
    r = run_kiln(*argv)
    assert r.returncode == 64, r.stderr
    first = r.stderr.splitlines()[0]
    assert first.startswith("kiln: error: ") and needle in first
    assert first.count("kiln") == 1, first  # not `kiln: error: kiln: ...`
    assert "hint: see `kiln" in r.stderr


def test_list_json():
    doc = validated("list", run_kiln("list", "--json").stdout)
    assert {"tiny-moe", "glm53-kindling"} <= {r["name"] for r in doc["recipes"]}


def test_show_is_human_and_json_is_the_document():
    human = run_kiln("show", "tiny-moe")
    assert human.returncode == 0, human.stderr
    assert human.stdout.startswith("tiny-moe\n") and "input digest" in human.stdout
    assert "vllm serve /models/tiny-qwen3moe" in human.stdout
    doc = validated("show", run_kiln("show", "tiny-moe", "--json").stdout)
    assert doc["recipe"]["name"] == "tiny-moe"
    assert doc["tag"].split(":")[1] == doc["input_digest"][7:19]
    assert doc["tag"] in human.stdout
    assert doc["platforms"] == {"linux/amd64": {"tag": doc["tag"], "input_digest": doc["input_digest"]}}
    glm = validated("show", run_kiln("show", "glm53-kindling", "--json").stdout)
    amd, arm = glm["platforms"]["linux/amd64"], glm["platforms"]["linux/arm64"]
    assert amd["input_digest"] == glm["input_digest"] != arm["input_digest"]


def test_check_json_valid_and_invalid(tmp_path):
    doc = validated("check", run_kiln("check", "--all", "--json").stdout)
    assert doc["valid"] is True and all(r["valid"] for r in doc["recipes"])

    tree = _tree_copy(tmp_path)
    recipe = tree / "recipes" / "tiny-moe" / "recipe.yaml"
    recipe.write_text(recipe.read_text().replace("port: 8000", "port: 99999"))
    r = run_kiln("check", "--all", "--json", env={"KILN_ROOT": str(tree)}, cwd=tree)
    assert r.returncode == 2
    doc = validated("check", r.stdout)  # one document, not a report plus an error
    bad = {x["name"]: x for x in doc["recipes"]}["tiny-moe"]
    assert bad["valid"] is False and any("launch.port" in p for p in bad["problems"])


def test_errors_are_a_json_document_under_json():
    r = run_kiln("show", "no-such-recipe", "--json")
    assert r.returncode == 2
    doc = validated("error", r.stdout)
    assert doc["error"]["exit_code"] == 2 and "no-such-recipe" in doc["error"]["message"]


def test_doctor_json():
    r = run_kiln("doctor", "--json")
    doc = validated("doctor", r.stdout)
    assert r.returncode == (0 if doc["ok"] else 1)
    names = {c["check"] for c in doc["checks"]}
    assert {"docker daemon", "records", "checkout"} <= names


def test_quiet_silences_progress_but_not_errors():
    assert run_kiln("check", "tiny-moe").stderr.strip()
    quiet = run_kiln("-q", "check", "tiny-moe")
    assert quiet.returncode == 0 and quiet.stderr == ""
    after = run_kiln("check", "tiny-moe", "--quiet")
    assert after.returncode == 0 and after.stderr == ""
    failed = run_kiln("-q", "show", "no-such-recipe")
    assert failed.returncode == 2 and "kiln: error:" in failed.stderr


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_scripts(shell, tmp_path):
    r = run_kiln("completion", shell)
    assert r.returncode == 0, r.stderr
    assert "publish" in r.stdout and "--skip-smoke-check" in r.stdout
    if shell == "bash" and shutil.which("bash"):
        script = tmp_path / "kiln.bash"
        script.write_text(r.stdout)
        # the script loads, and registers a completion function for `kiln`
        out = subprocess.run(
            ["bash", "-c", f"source {script} && complete -p kiln"], capture_output=True, text=True, check=False
        )
        assert out.returncode == 0 and "kiln" in out.stdout, out.stderr


def test_every_schema_is_valid_json_schema():
    import jsonschema

    names = sorted(p.stem for p in SCHEMAS.glob("*.json"))
    assert names == sorted(
        ["build", "check", "doctor", "error", "list", "outdated", "promote", "publish", "show", "smoke", "verify"]
    )
    for name in names:
        jsonschema.Draft202012Validator.check_schema(json.loads((SCHEMAS / f"{name}.json").read_text()))


# -- where kiln looks --------------------------------------------------------------------
def test_outside_a_checkout_is_an_error_not_a_fallback(tmp_path):
    r = run_kiln("list", env={"KILN_ROOT": ""}, cwd=tmp_path)
    assert r.returncode == 25, r.stderr
    assert f"{tmp_path} is not inside a kiln checkout" in r.stderr
    assert "KILN_ROOT" in r.stderr
    bad = run_kiln("list", env={"KILN_ROOT": str(tmp_path)}, cwd=tmp_path)
    assert bad.returncode == 25 and "is not a kiln checkout" in bad.stderr


def test_inside_a_checkout_subfolder_finds_it():
    r = run_kiln("list", env={"KILN_ROOT": ""}, cwd=REPO / "recipes" / "tiny-moe")
    assert r.returncode == 0 and "tiny-moe" in r.stdout


def test_records_live_per_user(monkeypatch, tmp_path):
    from kiln.basics import paths

    for var in ("KILN_RESULTS_DIR", "KILN_STATE_DIR", "XDG_STATE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert paths.state_dir() == tmp_path / "home" / ".local" / "state" / "kiln"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert paths.state_dir() == tmp_path / "xdg" / "kiln"
    monkeypatch.setenv("KILN_STATE_DIR", str(tmp_path / "state"))
    assert paths.state_dir() == tmp_path / "state"
    monkeypatch.setenv("KILN_RESULTS_DIR", str(tmp_path / "results"))
    assert paths.state_dir() == tmp_path / "results"
    assert paths.shown_home(tmp_path / "home" / "x") == "~/x"


def _tree_copy(tmp_path):
    from kilntest import make_tree

    tree = make_tree(tmp_path / "tree")
    shutil.copytree(REPO / "recipes" / "tiny-moe", tree / "recipes" / "tiny-moe")
    return tree
