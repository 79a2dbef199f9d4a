"""`kiln run` without a daemon: the hardened docker run line, -e, and the argument rules.
(The real serve loop, ps/logs/stop, runs in tests/e2e/test_tiny_moe.py.)"""

from __future__ import annotations

import shlex

import pytest
from kilntest import REPO, run_kiln

from kiln.basics.errors import UsageError
from kiln.cli import _build_parser
from kiln.commands.serving.serve import _parse_env, _vllm_extra
from kiln.domain.recipes.recipe import load_recipe
from kiln.domain.serving.launch_command import LABEL_RECIPE, RunSpec
from kiln.domain.serving.serving_container import run_spec

# daemon-optional commands run with no daemon, on purpose (conftest no_docker): unit tests
pytestmark = pytest.mark.usefixtures("no_docker")


def _pairs(cmd: list[str], flag: str) -> list[str]:
    return [cmd[i + 1] for i, tok in enumerate(cmd) if tok == flag]


@pytest.mark.parametrize(("flavour", "caps"), [("cpu", ["SYS_NICE"]), ("cuda", [])])
def test_cli_line_and_sdk_call_are_hardened_alike(flavour, caps):
    spec = RunSpec(image="img", name="n", host_port=8000, container_port=8000, flavour=flavour)
    cmd = spec.docker_cli()
    kw = spec.sdk_kwargs()
    assert "--read-only" in cmd and kw["read_only"] is True
    assert _pairs(cmd, "--tmpfs") == [f"{p}:{o}" for p, o in kw["tmpfs"].items()]
    assert kw["tmpfs"]["/tmp"] == "exec"  # compiled kernels are dlopen()ed from there
    assert _pairs(cmd, "--cap-drop") == kw["cap_drop"] == ["ALL"]
    assert _pairs(cmd, "--cap-add") == (kw["cap_add"] or []) == caps
    assert _pairs(cmd, "--security-opt") == kw["security_opt"] == ["no-new-privileges"]
    assert _pairs(cmd, "--shm-size") == [kw["shm_size"]]


@pytest.mark.parametrize("detach", [False, True])
def test_printed_rm_matches_auto_remove(detach):
    """`--rm -d` printed must be what the container gets: AutoRemove, so `docker stop` removes it."""
    spec = RunSpec(image="img", name="n", host_port=1, container_port=2, detach=detach)
    assert ("--rm" in spec.docker_cli()) is spec.sdk_kwargs()["auto_remove"] is True
    assert ("-d" in spec.docker_cli()) is detach


def test_run_env_wins_over_recipe_env_and_containers_are_labelled():
    loaded = load_recipe(REPO / "recipes" / "tiny-moe")
    spec = run_spec(loaded, "img", host_port=8123, env={"VLLM_CPU_KVCACHE_SPACE": "2", "FOO": "a=b"})
    assert spec.env["VLLM_CPU_KVCACHE_SPACE"] == "2" and spec.env["FOO"] == "a=b"
    assert spec.env["HF_HUB_OFFLINE"] == "1"  # the rest of the launch env stays
    assert spec.labels[LABEL_RECIPE] == "tiny-moe"
    assert spec.sdk_kwargs()["labels"][LABEL_RECIPE] == "tiny-moe"
    cmd = spec.docker_cli()
    assert "VLLM_CPU_KVCACHE_SPACE=2" in _pairs(cmd, "-e") and f"{LABEL_RECIPE}=tiny-moe" in _pairs(cmd, "--label")


@pytest.mark.parametrize("bad", ["FOO", "=x", "1A=x", "A B=x"])
def test_env_needs_var_equals_value(bad):
    with pytest.raises(UsageError):
        _parse_env([bad])


def test_env_value_may_hold_equals_and_be_empty():
    assert _parse_env(["A=b=c", "B="]) == {"A": "b=c", "B": ""}


@pytest.mark.parametrize("token", ["-e", "--env", "--env=A=1"])
def test_env_after_double_dash_is_refused(token):
    args = _build_parser().parse_args(["run", "tiny-moe"])
    args.vllm_args = ["--max-model-len", "256", token]
    with pytest.raises(UsageError, match="would go to vLLM"):
        _vllm_extra(args)


def test_run_usage_shows_vllm_args_and_env():
    result = run_kiln("run", "--help")
    assert result.returncode == 0
    usage = result.stdout.split("\n\n")[0]
    assert "-- VLLM ARGS" in usage and "-e VAR=VALUE" in usage


def test_run_print_shows_env_option_and_hardening():
    result = run_kiln(
        "run",
        "tiny-moe",
        "--print",
        "--port",
        "8124",
        "-e",
        "KILN_FEATURES=",
        "--detach",
        "--",
        "--max-model-len",
        "256",
    )
    assert result.returncode == 0, result.stderr
    cmd = shlex.split(result.stdout.strip().splitlines()[-1])
    assert cmd[:4] == ["docker", "run", "--rm", "-d"]
    assert "KILN_FEATURES=" in _pairs(cmd, "-e")
    assert {"--read-only", "--cap-drop", "--security-opt", "--shm-size"} <= set(cmd)
    assert cmd[-2:] == ["--max-model-len", "256"]


def test_stop_needs_names_or_all():
    result = run_kiln("stop")
    assert result.returncode == 64 and "--all" in result.stderr


class _Box:
    def __init__(self, name, port, labels=None):
        self.name = name
        self.port = port
        self.labels = {LABEL_RECIPE: "tiny-moe"} if labels is None else labels

    def publishes(self, host_port):
        return host_port == self.port


class _Client:
    """Stands in for kiln's DockerDaemon: only what the label lookups call."""

    def __init__(self, boxes):
        self.boxes = boxes

    def containers(self, label, all_states=False):
        return [b for b in self.boxes if label in b.labels]

    def container(self, name):
        return next((b for b in self.boxes if b.name == name), None)


def test_port_in_use_names_the_kiln_container_holding_it():
    from kiln.domain.serving.serving_container import _port_in_use as port_in_use

    client = _Client([_Box("kiln-tiny-moe-aaaaaa", 8001), _Box("kiln-tiny-moe-bbbbbb", 8002)])
    err = port_in_use("", 8002, client)
    assert err.exit_code == 14 and "kiln-tiny-moe-bbbbbb (tiny-moe)" in err.message
    assert "kiln stop kiln-tiny-moe-bbbbbb" in err.hint
    plain = port_in_use("", 9999, client)
    assert "kiln container" not in plain.message and "--port" in plain.hint


def test_logs_and_stop_only_touch_containers_kiln_started():
    from kiln.basics.errors import ContainerNotFound
    from kiln.commands.serving.serve import _ours

    client = _Client([_Box("kiln-tiny-moe-aaaaaa", 8001), _Box("postgres", 5432, labels={})])
    assert _ours(client, "kiln-tiny-moe-aaaaaa").name == "kiln-tiny-moe-aaaaaa"
    for name in ("postgres", "gone"):
        with pytest.raises(ContainerNotFound, match="kiln-tiny-moe-aaaaaa") as info:
            _ours(client, name)
        assert info.value.exit_code == 50


def test_logs_take_a_recipe_name_only_when_one_container_serves_it():
    from kiln.basics.errors import ContainerNotFound
    from kiln.commands.serving.serve import _one

    one = _Client([_Box("kiln-tiny-moe-aaaaaa", 8001), _Box("postgres", 5432, labels={})])
    assert _one(one, "tiny-moe").name == "kiln-tiny-moe-aaaaaa"
    two = _Client([_Box("kiln-tiny-moe-aaaaaa", 8001), _Box("kiln-tiny-moe-bbbbbb", 8002)])
    with pytest.raises(ContainerNotFound, match="recipe 'tiny-moe' has 2 running kiln containers") as info:
        _one(two, "tiny-moe")
    assert info.value.exit_code == 50 and "kiln-tiny-moe-bbbbbb" in info.value.message
    assert _one(two, "kiln-tiny-moe-bbbbbb").name == "kiln-tiny-moe-bbbbbb"
    with pytest.raises(ContainerNotFound, match="no kiln container 'other-recipe'"):
        _one(one, "other-recipe")
