"""Registry credentials, bound to the one registry host they belong to.

Two sources, with one rule each:

* `KILN_REGISTRY_USER` plus the password from stdin (`--password-stdin`) or
  `KILN_REGISTRY_PASSWORD` are for the registry `kiln publish` / `kiln promote` talk
  to. With `KILN_REGISTRY_HOST` set they belong to that host only (then they also
  serve base-image pulls from it, and a publish to any other host ignores them).
  Without it they never go to a base image's registry: a password set to publish to a
  private registry must not reach whichever registry hosts a base image.
* Everything else comes from the docker config for that host, read through the docker
  SDK's own auth code (behind `infra.docker.config`: `credHelpers` / `credsStore` helpers, `auths`
  entries, Docker Hub's `https://index.docker.io/v1/` key, identity tokens), so kiln
  finds exactly what `docker login HOST` stored.

A password never comes from the command line (it would show in `ps` and shell
history), and `Credentials` never prints it: its repr hides the secret so a stray log
line or traceback cannot leak it.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO, TypedDict

from kiln.basics.documents import Shape, read_document
from kiln.basics.errors import RegistryAuthFailed
from kiln.infra.docker import AuthConfig, DockerError, StoredAuth, config_auth, index_name

USER_ENV = "KILN_REGISTRY_USER"
_PASSWORD_ENV = "KILN_REGISTRY_PASSWORD"  # the name of a variable, not a password  # noqa: S105
_HOST_ENV = "KILN_REGISTRY_HOST"
_STDIN_EXAMPLE = f'export {USER_ENV}=NAME; printf %s "$TOKEN" | kiln publish ... --password-stdin'


@dataclass(frozen=True)
class Credentials:
    """Registry credentials and where they came from."""

    username: str
    password: str = field(repr=False)
    source: str = ""  # where they came from, for messages ("env", "docker config ...")
    identity_token: str = field(default="", repr=False)  # an OAuth2 refresh token (`docker login` to ACR, ...)

    def auth_config(self, server: str) -> AuthConfig:
        """The dict the docker SDK sends the daemon (X-Registry-Auth header)."""
        if self.identity_token:
            return {"identitytoken": self.identity_token, "serveraddress": server}
        return {"username": self.username, "password": self.password, "serveraddress": server}

    def __str__(self) -> str:
        return f"{self.username or '(identity token)'} (from {self.source})"


def _same_host(first: str, second: str) -> bool:
    """Registry names as docker compares them: no scheme or path, Docker Hub's aliases as one."""
    return _host_key(first) == _host_key(second)


def _host_key(name: str) -> str:
    return index_name(name.strip().split("://", 1)[-1].split("/", 1)[0])


def resolve(host: str, *, password_stdin: bool = False, stdin: TextIO | None = None) -> Credentials | None:
    """Credentials for the publish/promote target `host` (HOST[:PORT]), or None for anonymous."""
    bound = os.environ.get(_HOST_ENV, "").strip()
    if bound and not _same_host(bound, host):
        if password_stdin:
            raise RegistryAuthFailed(
                f"--password-stdin: the password is for {_HOST_ENV}={bound}, not {host}",
                hint=f"set {_HOST_ENV}={host} (or unset it) to use it for this registry",
            )
        return _from_docker_config(host)
    explicit = _from_env(password_stdin, stdin or sys.stdin)
    return explicit if explicit is not None else _from_docker_config(host)


def _for_pull(host: str) -> Credentials | None:
    """Credentials to pull a base image from `host`: the docker config's for that host,
    or the env ones only where KILN_REGISTRY_HOST names exactly this host."""
    bound = os.environ.get(_HOST_ENV, "").strip()
    if bound and _same_host(bound, host):
        explicit = _from_env(False, sys.stdin)
        if explicit is not None:
            return explicit
    return _from_docker_config(host)


def pull_auth(host: str) -> AuthConfig | None:
    """The daemon's auth config for pulling a base image from `host`, and no other host."""
    creds = _for_pull(host)
    return creds.auth_config(host) if creds else None


def _from_env(password_stdin: bool, stdin: TextIO) -> Credentials | None:
    user = os.environ.get(USER_ENV, "")
    if password_stdin:
        if not user:
            raise RegistryAuthFailed(
                f"--password-stdin reads only the password; the user name comes from {USER_ENV}, which is not set",
                hint=_STDIN_EXAMPLE,
            )
        password = stdin.readline().rstrip("\r\n")
        if not password:
            raise RegistryAuthFailed("--password-stdin: no password on stdin", hint=_STDIN_EXAMPLE)
        return Credentials(user, password, "env + stdin")
    password = os.environ.get(_PASSWORD_ENV, "")
    if user and password:
        return Credentials(user, password, "env")
    if user:
        raise RegistryAuthFailed(
            f"{USER_ENV} is set but no password is given",
            hint=f"pipe it in with --password-stdin (or set {_PASSWORD_ENV})",
        )
    if password:
        raise RegistryAuthFailed(f"{_PASSWORD_ENV} is set but {USER_ENV} is not", hint=f"set {USER_ENV} too")
    return None


class _DockerConfigFile(TypedDict, total=False):
    """The keys of the docker config (~/.docker/config.json, as `docker login` writes it)
    that hold credentials; docker's other keys are not kiln's to read."""

    auths: dict[str, dict[str, object]]  # registry -> {"auth": base64 user:password} or {"identitytoken": ...}
    credsStore: str
    credHelpers: dict[str, str]  # registry -> credential helper


DOCKER_CONFIG = Shape(_DockerConfigFile)


def _docker_config_path() -> Path:
    return Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"


def _from_docker_config(host: str) -> Credentials | None:
    """What `docker login HOST` stored, as the docker CLI itself would find it."""
    path = _docker_config_path()
    if not path.is_file():
        return None
    doc = read_document(
        path,
        DOCKER_CONFIG,
        functools.partial(RegistryAuthFailed, hint="fix the file, or move it away and `docker login` again"),
    )
    if not any(doc.get(k) for k in ("auths", "credsStore", "credHelpers")):
        return None  # (an empty dict would send the SDK looking in ~/.docker instead)
    try:
        found = config_auth(dict(doc), _host_key(host))
    except DockerError as exc:  # bad `auth` entry, failing credential helper
        raise RegistryAuthFailed(
            f"{path}: credentials for {host}: {exc}",
            hint="fix that entry (or its credential helper), or `docker login` again",
        ) from None
    return _credentials(found, path)


def _credentials(found: StoredAuth, path: Path) -> Credentials | None:
    user = found.get("Username") or found.get("username") or ""
    password = found.get("Password") or found.get("password") or ""
    token = found.get("IdentityToken") or found.get("identitytoken") or ""
    if not token and not (user and password):
        return None  # e.g. an empty `auths` entry: anonymous, like docker
    helper = " (credential helper)" if "ServerAddress" in found else ""
    return Credentials(user, password, f"docker config {path}{helper}", identity_token=token)
