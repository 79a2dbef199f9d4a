"""Registry authentication: the `WWW-Authenticate` challenge answered, and failed
requests named without secrets.

A challenge is answered with Basic credentials, or with a Bearer token from the
registry's token service (which gets the credentials only over TLS, unless it is this
machine); a failed request is named in a message without any secret in it."""

from __future__ import annotations

import base64
import ipaddress
import re
import urllib.parse
from typing import TypedDict

import requests

from kiln.basics.documents import Shape
from kiln.basics.errors import RegistryAuthFailed, RegistryUnreachable
from kiln.infra.credentials import Credentials


class _TokenAnswer(TypedDict, total=False):
    """A token service's answer (the distribution spec's token authentication: either name)."""

    token: str
    access_token: str


_TOKEN_ANSWER = Shape(_TokenAnswer)


def authorization(
    session: requests.Session,
    resp: requests.Response,
    *,
    host: str,
    path: str,
    credentials: Credentials | None,
    timeout: tuple[float, float],
) -> str:
    """The Authorization header that answers `resp`'s challenge (its WWW-Authenticate):
    Basic with the password, or a Bearer token from the registry's token service."""
    scheme, params = _challenge(resp.headers.get("WWW-Authenticate", ""))
    if scheme == "basic":
        if credentials is None:
            raise RegistryAuthFailed(
                f"registry {host} needs credentials and none were found",
                hint=f"`docker login {host}`, or set KILN_REGISTRY_USER and pipe the password in with --password-stdin",
            )
        if not credentials.password:
            raise RegistryAuthFailed(
                f"registry {host} wants a password; the credentials from "
                f"{credentials.source} hold only an identity token",
                hint=f"`docker login {host}` with a user name and password",
            )
        pair = f"{credentials.username}:{credentials.password}".encode()
        return "Basic " + base64.b64encode(pair).decode()
    if scheme == "bearer" and params.get("realm"):
        token = _token(session, params, host=host, path=path, credentials=credentials, timeout=timeout)
        return f"Bearer {token}"
    raise RegistryAuthFailed(f"registry {host} asked for unsupported auth {scheme or '(none)'!r}")


def _token(
    session: requests.Session,
    params: dict[str, str],
    *,
    host: str,
    path: str,
    credentials: Credentials | None,
    timeout: tuple[float, float],
) -> str:
    """The distribution token flow: GET realm?service=..&scope=.. with Basic creds."""
    query = {"scope": f"repository:{path}:pull,push"}
    if params.get("service"):
        query["service"] = params["service"]
    creds = credentials
    if creds is not None:
        _check_realm(params["realm"], host)
    try:
        if creds is not None and creds.identity_token:
            # OAuth2 refresh-token grant: what `docker login` stored instead of a password
            resp = session.post(
                params["realm"],
                timeout=timeout,
                data={
                    **query,
                    "grant_type": "refresh_token",
                    "refresh_token": creds.identity_token,
                    "client_id": "kiln",
                },
            )
        else:
            auth = (creds.username, creds.password) if creds else None
            resp = session.get(params["realm"], params=query, auth=auth, timeout=timeout)
    except requests.exceptions.RequestException as exc:
        raise RegistryUnreachable(f"token service {params['realm']} unreachable: {reason(exc)}") from None
    if resp.status_code in (401, 403):
        raise RegistryAuthFailed(f"token service for {host} rejected {who(credentials)}")
    if resp.status_code != 200:
        raise RegistryUnreachable(f"token service for {host} answered HTTP {resp.status_code}")
    body = _TOKEN_ANSWER.parse(resp.content, source=f"token service for {host}: its answer", error=RegistryAuthFailed)
    token = body.get("token") or body.get("access_token")
    if not token:
        raise RegistryAuthFailed(f"token service for {host} returned no token")
    return str(token)


def who(credentials: Credentials | None) -> str:
    """Where the credentials came from, never what they are (for messages)."""
    return f"the credentials from {credentials.source}" if credentials else "anonymous access"


def _check_realm(realm: str, host: str) -> None:
    """The registry names its token service, which may live on another host (Docker Hub's
    does); credentials travel there only over TLS, so a registry cannot have a password
    sent in clear text to an address of its choosing. Plain HTTP stays for loopback."""
    parsed = urllib.parse.urlsplit(realm)
    if parsed.scheme == "https" and parsed.hostname:
        return
    if parsed.scheme == "http" and parsed.hostname and is_loopback(parsed.netloc):
        return
    raise RegistryAuthFailed(
        f"registry {host} sends the credentials to token service {realm!r}, which is "
        "not HTTPS; kiln does not send them there",
        hint="check the registry's auth set-up (its token realm must be an https:// URL)",
    )


def is_loopback(host: str) -> bool:
    """Plain HTTP is only assumed for this machine (as the daemon and crane do)."""
    name = host.rsplit(":", 1)[0] if not host.startswith("[") else host[1 : host.index("]")]
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _challenge(header: str) -> tuple[str, dict[str, str]]:
    """`Bearer realm="...",service="..."` -> ("bearer", {realm: ..., service: ...})."""
    scheme, _, rest = header.strip().partition(" ")
    params = dict(re.findall(r'(\w+)="([^"]*)"', rest))
    return scheme.lower(), params


def reason(exc: BaseException) -> str:
    """The innermost cause of a requests error in a few words (no URL-embedded secrets:
    kiln never puts credentials into URLs)."""
    text = str(exc)
    for marker in (
        "Connection refused",
        "Name or service not known",
        "timed out",
        "Temporary failure in name resolution",
        "Connection reset",
        "No route to host",
        "certificate verify failed",
        "wrong version number",
        "Max retries exceeded",
    ):
        if marker in text:
            return marker.lower() if marker != "Max retries exceeded" else "no connection"
    return " ".join(text.split())[:200]
