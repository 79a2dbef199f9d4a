"""Registry credentials for `kiln publish` / `kiln promote`.

Looked up in the order users of `docker push`, crane and skopeo expect:
KILN_REGISTRY_USER with the password from stdin (--password-stdin) or
KILN_REGISTRY_PASSWORD, else the docker config (`credHelpers` / `credsStore` helpers,
then `auths`). A password never comes from the command line (it would show in `ps`
and shell history), and `Credentials` never prints it: its repr hides the secret so a
stray log line or traceback cannot leak it.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from .errors import RegistryAuthFailed

USER_ENV = "KILN_REGISTRY_USER"
PASSWORD_ENV = "KILN_REGISTRY_PASSWORD"
# Docker Hub's credentials live under its v1 index address in the docker config
_HUB_ALIASES = {"docker.io", "index.docker.io", "registry-1.docker.io"}


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)
    source: str = ""  # where they came from, for the summary ("env", "docker config", ...)

    def auth_config(self, server: str) -> dict[str, str]:
        """The dict the docker SDK sends the daemon (X-Registry-Auth header)."""
        return {"username": self.username, "password": self.password, "serveraddress": server}

    def __str__(self) -> str:
        return f"{self.username} (from {self.source})"


def resolve(host: str, *, password_stdin: bool = False, stdin: TextIO | None = None) -> Credentials | None:
    """Credentials for `host` (HOST[:PORT] as docker names it), or None for anonymous."""
    explicit = _from_env(password_stdin, stdin or sys.stdin)
    return explicit if explicit is not None else from_docker_config(host)


def _from_env(password_stdin: bool, stdin: TextIO) -> Credentials | None:
    user = os.environ.get(USER_ENV, "")
    if password_stdin:
        if not user:
            raise RegistryAuthFailed(f"--password-stdin needs the user name in {USER_ENV}")
        password = stdin.readline().rstrip("\r\n")
        if not password:
            raise RegistryAuthFailed("--password-stdin: no password on stdin")
        return Credentials(user, password, "env + stdin")
    password = os.environ.get(PASSWORD_ENV, "")
    if user and password:
        return Credentials(user, password, "env")
    if user or password:
        missing = PASSWORD_ENV + " (or --password-stdin)" if user else USER_ENV
        raise RegistryAuthFailed(f"{USER_ENV if user else PASSWORD_ENV} is set but {missing} is not")
    return None


def docker_config_path() -> Path:
    return Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"


def from_docker_config(host: str) -> Credentials | None:
    """What `docker login HOST` stored: a credential helper's secret or an `auths` entry."""
    path = docker_config_path()
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as exc:
        raise RegistryAuthFailed(f"cannot read {path}: {type(exc).__name__}") from None
    helper = (config.get("credHelpers") or {}).get(host) or config.get("credsStore")
    if helper:
        found = _from_helper(helper, host)
        if found is not None:
            return found
    return _from_auths(config.get("auths") or {}, host, path)


def _normalise(key: str) -> str:
    """`https://index.docker.io/v1/` -> `index.docker.io`; `HOST:PORT` stays as is."""
    key = key.split("://", 1)[-1].split("/", 1)[0]
    return "index.docker.io" if key in _HUB_ALIASES else key


def _from_auths(auths: dict, host: str, path: Path) -> Credentials | None:
    wanted = _normalise(host)
    for key, entry in auths.items():
        if _normalise(key) != wanted or not isinstance(entry, dict):
            continue
        if entry.get("username") and entry.get("password"):
            return Credentials(entry["username"], entry["password"], f"docker config {path}")
        if entry.get("auth"):
            try:
                user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                raise RegistryAuthFailed(f"{path}: auths.{key}.auth is not base64 user:password") from None
            return Credentials(user, password, f"docker config {path}")
    return None


def _from_helper(helper: str, host: str) -> Credentials | None:
    """`docker-credential-<helper> get` speaks JSON on stdout; a miss is a non-zero exit."""
    try:
        out = subprocess.run([f"docker-credential-{helper}", "get"], input=host, capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None  # helper not installed here: fall back to `auths`, like docker does
    if out.returncode != 0:
        return None
    try:
        data = json.loads(out.stdout)
    except json.JSONDecodeError:
        return None
    if not data.get("Username") or not data.get("Secret"):
        return None
    return Credentials(data["Username"], data["Secret"], f"docker-credential-{helper}")
