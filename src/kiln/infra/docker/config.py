"""Registry names and the docker config's credentials, as the docker SDK's own auth code
resolves them (so kiln finds exactly what `docker login HOST` stored);
`kiln.infra.credentials` decides which of them a registry gets."""

from __future__ import annotations

from typing import TypedDict

import docker.auth
import docker.errors

from kiln.basics.documents import Shape
from kiln.infra.docker.faults import DockerError


class AuthConfig(TypedDict, total=False):
    """Credentials as the daemon takes them (the X-Registry-Auth header of a pull or push)."""

    username: str
    password: str
    identitytoken: str  # an OAuth2 refresh token, instead of a user and password
    serveraddress: str


class StoredAuth(TypedDict, total=False):
    """What the docker config holds for one registry: an `auths` entry (lower case, as
    the SDK decodes it) or a credential helper's answer (capitalised, with ServerAddress)."""

    username: str
    password: str
    email: str | None  # the SDK copies the entry's email, None when it has none
    serveraddress: str
    identitytoken: str
    Username: str
    Password: str
    ServerAddress: str
    IdentityToken: str


def sdk_auth(auth: AuthConfig | None) -> dict[str, object] | None:
    """`auth` as the SDK's calls type it: a plain dict (the same keys and values)."""
    return dict(auth) if auth is not None else None


def registry_of(repo: str) -> str:
    """The registry host serving `repo`, as docker resolves it ("docker.io" for Hub names)."""
    host, _ = docker.auth.resolve_repository_name(repo)
    return str(host)


def index_name(name: str) -> str:
    """A registry host as the docker config keys it (Docker Hub's aliases as one)."""
    return str(docker.auth.resolve_index_name(name))


_STORED_AUTH = Shape(StoredAuth)


def config_auth(config: dict[str, object], host: str) -> StoredAuth:
    """What a docker config document (`auths`, `credsStore`, `credHelpers`) holds for
    `host`, resolved by the SDK's own auth code ({} when nothing); DockerError when an
    entry is bad or a credential helper fails."""
    try:
        found = docker.auth.load_config(config_dict=config).resolve_authconfig(host)
    except docker.errors.DockerException as exc:
        raise DockerError(" ".join(str(exc).split())[:200]) from None
    # the SDK's dict of what the config (or a credential helper) holds: checked, never trusted
    return _STORED_AUTH.check(found or {}, source="its entry", error=DockerError)
