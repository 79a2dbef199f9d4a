"""Where publish credentials come from, and that they never show (no daemon needed)."""

from __future__ import annotations

import base64
import io
import json

import pytest

from kiln.basics.errors import RegistryAuthFailed
from kiln.infra import credentials


@pytest.fixture
def docker_config(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    monkeypatch.delenv(credentials.USER_ENV, raising=False)
    monkeypatch.delenv(credentials._PASSWORD_ENV, raising=False)
    monkeypatch.delenv(credentials._HOST_ENV, raising=False)

    def write(doc: dict):
        (tmp_path / "config.json").write_text(json.dumps(doc))

    return write


def test_env_wins_over_docker_config(docker_config, monkeypatch):
    docker_config({"auths": {"reg.example:5000": {"auth": base64.b64encode(b"cfg:cfgpw").decode()}}})
    monkeypatch.setenv(credentials.USER_ENV, "envuser")
    monkeypatch.setenv(credentials._PASSWORD_ENV, "envpw")
    creds = credentials.resolve("reg.example:5000")
    assert (creds.username, creds.password, creds.source) == ("envuser", "envpw", "env")


def test_password_from_stdin(docker_config, monkeypatch):
    monkeypatch.setenv(credentials.USER_ENV, "u")
    creds = credentials.resolve("h", password_stdin=True, stdin=io.StringIO("s3cret\n"))
    assert creds.password == "s3cret"


@pytest.mark.parametrize("env", [{credentials.USER_ENV: "u"}, {credentials._PASSWORD_ENV: "p"}])
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
    # what `docker login` writes for Docker Hub: its v1 index URL as the key
    docker_config({"auths": {"https://index.docker.io/v1/": {"auth": base64.b64encode(b"hub:hubpw").decode()}}})
    assert credentials.resolve("docker.io").username == "hub"
    assert credentials._for_pull("index.docker.io").password == "hubpw"


def test_identity_token_goes_to_the_daemon_as_such(docker_config):
    docker_config({"auths": {"reg.example": {"identitytoken": "refresh-tok"}}})
    creds = credentials.resolve("reg.example")
    assert creds.auth_config("reg.example") == {"identitytoken": "refresh-tok", "serveraddress": "reg.example"}
    assert "refresh-tok" not in repr(creds) + str(creds)


def test_env_credentials_never_serve_a_base_image_pull(docker_config, monkeypatch):
    """Set to publish to one registry, they must not reach the registry of a base image."""
    docker_config({"auths": {"base.example": {"auth": base64.b64encode(b"cfg:cfgpw").decode()}}})
    monkeypatch.setenv(credentials.USER_ENV, "envuser")
    monkeypatch.setenv(credentials._PASSWORD_ENV, "envpw")
    assert credentials._for_pull("base.example").username == "cfg"
    assert credentials._for_pull("nvcr.io") is None
    assert credentials.resolve("push.example").username == "envuser"  # the publish target


def test_registry_host_binds_env_credentials(docker_config, monkeypatch):
    docker_config({"auths": {"other.example": {"auth": base64.b64encode(b"cfg:cfgpw").decode()}}})
    monkeypatch.setenv(credentials.USER_ENV, "envuser")
    monkeypatch.setenv(credentials._PASSWORD_ENV, "envpw")
    monkeypatch.setenv(credentials._HOST_ENV, "https://mine.example:5000")
    assert credentials._for_pull("mine.example:5000").username == "envuser"
    assert credentials.resolve("mine.example:5000").username == "envuser"
    assert credentials.resolve("other.example").username == "cfg"  # bound elsewhere: not sent
    assert credentials.resolve("third.example") is None
    with pytest.raises(RegistryAuthFailed, match=credentials._HOST_ENV):
        credentials.resolve("other.example", password_stdin=True, stdin=io.StringIO("pw\n"))


def test_each_env_error_names_the_next_step(docker_config, monkeypatch):
    with pytest.raises(RegistryAuthFailed) as exc:
        credentials.resolve("h", password_stdin=True, stdin=io.StringIO("pw\n"))
    assert f"export {credentials.USER_ENV}=" in exc.value.hint
    monkeypatch.setenv(credentials.USER_ENV, "u")
    with pytest.raises(RegistryAuthFailed) as exc:
        credentials.resolve("h")
    assert "--password-stdin" in exc.value.hint


def test_credential_helper(docker_config, tmp_path, monkeypatch):
    helper = tmp_path / "bin" / "docker-credential-fake"
    helper.parent.mkdir()
    helper.write_text(
        '#!/bin/sh\nread host\n[ "$host" = reg.example ] || exit 1\n'
        'echo \'{"Username": "helped", "Secret": "fromhelper"}\'\n'
    )
    helper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{helper.parent}:/usr/bin:/bin")
    docker_config({"credHelpers": {"reg.example": "fake"}})
    creds = credentials.resolve("reg.example")
    assert (creds.username, creds.password) == ("helped", "fromhelper")


def test_password_never_in_repr_or_str():
    creds = credentials.Credentials("u", "hunter2-secret", "env")
    assert "hunter2-secret" not in repr(creds) + str(creds)
