"""Where publish credentials come from, and that they never show (no daemon needed)."""

from __future__ import annotations

import base64
import io
import json

import pytest

from kiln import credentials
from kiln.errors import RegistryAuthFailed


@pytest.fixture
def docker_config(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    monkeypatch.delenv(credentials.USER_ENV, raising=False)
    monkeypatch.delenv(credentials.PASSWORD_ENV, raising=False)

    def write(doc: dict):
        (tmp_path / "config.json").write_text(json.dumps(doc))

    return write


def test_env_wins_over_docker_config(docker_config, monkeypatch):
    docker_config({"auths": {"reg.example:5000": {"auth": base64.b64encode(b"cfg:cfgpw").decode()}}})
    monkeypatch.setenv(credentials.USER_ENV, "envuser")
    monkeypatch.setenv(credentials.PASSWORD_ENV, "envpw")
    creds = credentials.resolve("reg.example:5000")
    assert (creds.username, creds.password, creds.source) == ("envuser", "envpw", "env")


def test_password_from_stdin(docker_config, monkeypatch):
    monkeypatch.setenv(credentials.USER_ENV, "u")
    creds = credentials.resolve("h", password_stdin=True, stdin=io.StringIO("s3cret\n"))
    assert creds.password == "s3cret"


@pytest.mark.parametrize("env", [{credentials.USER_ENV: "u"}, {credentials.PASSWORD_ENV: "p"}])
def test_half_set_env_is_an_error(docker_config, monkeypatch, env):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(RegistryAuthFailed):
        credentials.resolve("h")


def test_password_stdin_needs_a_user(docker_config):
    with pytest.raises(RegistryAuthFailed, match=credentials.USER_ENV):
        credentials.resolve("h", password_stdin=True, stdin=io.StringIO("pw\n"))


@pytest.mark.parametrize("key", ["reg.example:5000", "https://reg.example:5000", "http://reg.example:5000/v2/"])
def test_docker_config_auths(docker_config, key):
    docker_config({"auths": {key: {"auth": base64.b64encode(b"cfg:pw:with:colons").decode()}}})
    creds = credentials.resolve("reg.example:5000")
    assert (creds.username, creds.password) == ("cfg", "pw:with:colons")
    assert credentials.resolve("other.example") is None


def test_docker_hub_key(docker_config):
    docker_config({"auths": {"https://index.docker.io/v1/": {"username": "hub", "password": "hubpw"}}})
    assert credentials.resolve("docker.io").username == "hub"


def test_credential_helper(docker_config, tmp_path, monkeypatch):
    helper = tmp_path / "bin" / "docker-credential-fake"
    helper.parent.mkdir()
    helper.write_text('#!/bin/sh\nread host\n[ "$host" = reg.example ] || exit 1\n'
                      'echo \'{"Username": "helped", "Secret": "fromhelper"}\'\n')
    helper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{helper.parent}:/usr/bin:/bin")
    docker_config({"credHelpers": {"reg.example": "fake"}})
    creds = credentials.resolve("reg.example")
    assert (creds.username, creds.password) == ("helped", "fromhelper")


def test_password_never_in_repr_or_str():
    creds = credentials.Credentials("u", "hunter2-secret", "env")
    assert "hunter2-secret" not in repr(creds) + str(creds)
