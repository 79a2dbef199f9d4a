"""A small client for the OCI distribution (Docker Registry HTTP API v2) protocol.

kiln pushes layers through the Docker daemon (it already has them, compressed and
cached) and uses this client for everything the daemon cannot do: read a manifest back
by digest, write more tags onto an existing manifest (a manifest PUT: no layer is sent
again), and ask which image a channel tag points at.

Auth follows the registry's `WWW-Authenticate` challenge: Basic (htpasswd registries)
or Bearer tokens (Docker Hub, GHCR, ECR, GCR/Artifact Registry, Harbor, Quay).
Transient failures (no connection, timeouts, 429, 5xx) are retried a bounded number of
times with backoff (a Retry-After header is honoured, up to a cap); each kind that
persists ends in its own typed error. An auth failure is never retried (retrying a
wrong password only locks accounts), except that an expired Bearer token is replaced
once by a fresh one from the token service.
"""

from __future__ import annotations

import re
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict

import requests

from kiln.basics.documents import Shape
from kiln.basics.errors import (
    KilnError,
    ManifestMismatch,
    PushFailed,
    RegistryAuthFailed,
    RegistryInvalid,
    RegistryRateLimited,
    RegistryServerError,
    RegistryUnreachable,
    TagWriteFailed,
)
from kiln.infra.credentials import Credentials
from kiln.infra.manifests import MANIFEST_TYPES, Manifest, manifest_head, sha256_digest
from kiln.infra.registry_auth import authorization, is_loopback, reason, who

_ATTEMPTS = 4  # first try + 3 retries: 0.5 s, 1 s, 2 s apart
_BACKOFF_S = 0.5
_RETRY_AFTER_CAP_S = 30.0  # a Retry-After beyond this is not waited for: bounded total time
_TIMEOUT = (5, 60)  # connect, read
_HOST = re.compile(r"^(\[[0-9a-fA-F:]+\]|[a-zA-Z0-9]([a-zA-Z0-9.-]*[a-zA-Z0-9])?)(:\d{1,5})?$")
_PATH = re.compile(r"^[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*$")
TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


@dataclass(frozen=True)
class Target:
    """Where one recipe's images go: registry host, optional namespace, repository."""

    host: str  # HOST[:PORT] as docker names it (and as its config keys credentials)
    path: str  # namespace/repository inside the registry
    plain_http: bool = False

    @classmethod
    def parse(cls, registry: str, repository: str, *, plain_http: bool = False) -> Target:
        """One rule for the scheme: `http://` means plain HTTP, `https://` means HTTPS,
        and without a scheme loopback hosts get HTTP and all others HTTPS (--plain-http
        asks for HTTP)."""
        text = registry.strip()
        scheme, sep, rest = text.partition("://")
        if not sep:
            scheme, rest = "", text
        elif scheme not in ("http", "https"):
            raise RegistryInvalid(f"registry {registry!r}: scheme {scheme}:// is neither http:// nor https://")
        if scheme == "https" and plain_http:
            raise RegistryInvalid(
                f"registry {registry!r} says https:// but --plain-http asks for HTTP",
                hint="drop one of them: http://HOST or --plain-http for HTTP, https://HOST for HTTPS",
            )
        host, _, namespace = rest.rstrip("/").partition("/")
        if not _HOST.match(host) or (namespace and not _PATH.match(namespace)):
            raise RegistryInvalid(f"registry {registry!r} is not [http://|https://]HOST[:PORT][/NAMESPACE]")
        path = f"{namespace}/{repository}" if namespace else repository
        plain = scheme == "http" or plain_http or (not scheme and is_loopback(host))
        return cls(host, path, plain)

    @property
    def api_host(self) -> str:
        """The host the registry's API is served on (Docker Hub's differs from its image name)."""
        # Docker Hub's API is not served on the name images use
        return "registry-1.docker.io" if self.host in ("docker.io", "index.docker.io") else self.host

    @property
    def base_url(self) -> str:
        """The registry's /v2 API address."""
        return f"{'http' if self.plain_http else 'https'}://{self.api_host}/v2"

    def ref(self, tag: str) -> str:
        """The repository's reference for a tag: `host/path:tag`."""
        return f"{self.host}/{self.path}:{tag}"

    def pinned(self, digest: str) -> str:
        """The repository's reference for a digest: `host/path@digest`."""
        return f"{self.host}/{self.path}@{digest}"


class RegistryClient:
    """One repository on one registry, authenticated once per process."""

    def __init__(self, target: Target, credentials: Credentials | None) -> None:
        self.target = target
        self.credentials = credentials
        self.session = requests.Session()
        self.session.trust_env = True  # honours REQUESTS_CA_BUNDLE / proxies like other tools
        self._auth: str | None = None  # the Authorization header that worked

    # -- requests with retries and auth ---------------------------------------------
    def _send(self, method: str, url: str, headers: dict[str, str] | None = None, **kw: Any) -> requests.Response:
        """One HTTP exchange, retried on transient failures only."""
        last, wait = "", 0.0
        for attempt in range(_ATTEMPTS):
            if attempt:
                time.sleep(max(wait, _BACKOFF_S * 2 ** (attempt - 1)))
            wait = 0.0
            sent = {**(headers or {}), **({"Authorization": self._auth} if self._auth else {})}
            try:
                resp = self.session.request(method, url, headers=sent, timeout=_TIMEOUT, **kw)
            except requests.exceptions.SSLError as exc:
                # not transient: retrying a TLS mismatch only delays the message
                raise RegistryUnreachable(
                    f"TLS to {self.target.api_host} failed: {reason(exc)}",
                    hint=f"trust its CA via REQUESTS_CA_BUNDLE, or write the registry as http://{self.target.host} "
                    "if it speaks plain HTTP",
                ) from None
            except requests.exceptions.RequestException as exc:
                last = reason(exc)
                continue
            if resp.status_code == 429 or resp.status_code >= 500:
                last = f"HTTP {resp.status_code}"
                wait = _retry_after(resp)
                continue
            return resp
        raise self._gave_up(method, url, last)

    def _gave_up(self, method: str, url: str, last: str) -> KilnError:
        what = f"{method} {url.removeprefix(self.target.base_url) or '/'}"
        if last == "HTTP 429":
            return RegistryRateLimited(
                f"registry {self.target.host} still rate-limits {what} after {_ATTEMPTS} attempts (HTTP 429)"
            )
        if last.startswith("HTTP 5"):
            return RegistryServerError(
                f"registry {self.target.host} answered {last} to {what} on all {_ATTEMPTS} attempts"
            )
        return RegistryUnreachable(
            f"registry {self.target.host} unreachable after {_ATTEMPTS} attempts: {last}",
            hint=f"check the address and that it is up: `curl {self.target.base_url}/`",
        )

    def request(self, method: str, path: str, **kw: Any) -> requests.Response:
        """`path` under /v2, or an absolute URL the registry handed out (an upload's
        Location), which must stay on the registry's own origin: credentials go nowhere else."""
        url = path if path.startswith(("http://", "https://")) else f"{self.target.base_url}{path}"
        if not _same_origin(url, self.target.base_url):
            raise RegistryUnreachable(
                f"registry {self.target.host} sent kiln to {_origin(url)}; kiln does not send "
                "its credentials to another host",
                hint="the registry's upload location must be on the registry itself",
            )
        resp = self._send(method, url, **kw)
        # a 401 to a Basic password is final; to a Bearer token (or no header yet) it
        # asks for a (fresh) token: fetched once, then the request is sent again
        if resp.status_code == 401 and not (self._auth or "").startswith("Basic "):
            self._authenticate(resp)
            resp = self._send(method, url, **kw)
        if resp.status_code in (401, 403):
            raise RegistryAuthFailed(
                f"registry {self.target.host} rejected {who(self.credentials)} for {self.target.path} "
                f"(HTTP {resp.status_code}{_error_code(resp)})"
            )
        return resp

    def _authenticate(self, resp: requests.Response) -> None:
        self._auth = authorization(
            self.session,
            resp,
            host=self.target.host,
            path=self.target.path,
            credentials=self.credentials,
            timeout=_TIMEOUT,
        )

    # -- the API calls kiln needs -----------------------------------------------------
    def check_access(self) -> None:
        """Fail early, before any layer moves, on a wrong address, TLS setup or password.
        GET /v2/ answers the auth challenge: Basic proves the password right here, Bearer
        fetches a push token for this repository (the token service checks the password)."""
        resp = self.request("GET", "/")
        if resp.status_code != 200:
            raise RegistryUnreachable(f"{self.target.base_url}/ answered HTTP {resp.status_code}: not a registry API")

    def manifest(self, reference: str) -> Manifest | None:
        """GET a manifest by tag or digest; None when the registry has no such reference."""
        resp = self.request(
            "GET",
            f"/{self.target.path}/manifests/{reference}",
            headers={"Accept": ", ".join(MANIFEST_TYPES)},
        )
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            raise RegistryUnreachable(f"GET manifest {reference}: HTTP {resp.status_code}{_error_code(resp)}")
        digest = sha256_digest(resp.content)
        claimed = resp.headers.get("Docker-Content-Digest")
        if claimed and claimed != digest:
            raise ManifestMismatch(f"registry says {reference} is {claimed} but its bytes hash to {digest}")
        if reference.startswith("sha256:") and reference != digest:
            raise ManifestMismatch(f"asked for manifest {reference}, got {digest}")
        media_type = resp.headers.get("Content-Type", "").split(";")[0].strip()
        media_type = media_type or manifest_head(resp.content, f"manifest {reference}").get("mediaType", "")
        return Manifest(digest, media_type, resp.content)

    def put_manifest(self, tag: str, manifest: Manifest) -> None:
        """Point `tag` at `manifest` (the same bytes, so the same digest): a retag."""
        if not TAG.match(tag):
            raise TagWriteFailed(f"{tag!r} is not a valid tag")
        resp = self.request(
            "PUT",
            f"/{self.target.path}/manifests/{tag}",
            data=manifest.body,
            headers={"Content-Type": manifest.media_type},
        )
        if resp.status_code not in (200, 201):
            raise TagWriteFailed(f"registry refused tag {tag}: HTTP {resp.status_code}{_error_code(resp)}")
        written = resp.headers.get("Docker-Content-Digest")
        if written and written != manifest.digest:
            raise ManifestMismatch(f"tag {tag} was written as {written}, expected {manifest.digest}")

    # -- blobs: what signatures and attestations need (the daemon pushes image layers) ----------
    def blob(self, digest: str, max_bytes: int) -> bytes | None:
        """GET a blob by digest, at most `max_bytes` (registry content is untrusted: a huge
        "signature" must not fill memory); None when the registry has no such blob. The
        bytes are checked against the digest they were asked for."""
        resp = self.request("GET", f"/{self.target.path}/blobs/{digest}", stream=True)
        try:
            if resp.status_code == 404:
                return None
            if resp.status_code != 200:
                raise RegistryUnreachable(f"GET blob {digest}: HTTP {resp.status_code}{_error_code(resp)}")
            data = bytearray()
            for chunk in resp.iter_content(64 * 1024):
                data += chunk
                if len(data) > max_bytes:
                    raise BlobTooLarge(digest, max_bytes)
        except requests.exceptions.RequestException as exc:
            raise RegistryUnreachable(f"GET blob {digest} from {self.target.host} failed: {reason(exc)}") from None
        finally:
            resp.close()
        got = sha256_digest(bytes(data))
        if got != digest:
            raise ManifestMismatch(f"asked {self.target.host} for blob {digest}, its bytes hash to {got}")
        return bytes(data)

    def has_blob(self, digest: str) -> bool:
        """Whether the repository holds the blob; RegistryUnreachable on any answer but 200 or 404."""
        resp = self.request("HEAD", f"/{self.target.path}/blobs/{digest}")
        if resp.status_code in (200, 404):
            return resp.status_code == 200
        raise RegistryUnreachable(f"HEAD blob {digest}: HTTP {resp.status_code}")

    def upload_blob(self, data: bytes) -> str:
        """Put `data` into the repository (skipped when the registry has it): the two-step
        upload every registry implements (POST a session, PUT the bytes with ?digest=).
        Returns its digest."""
        digest = sha256_digest(data)
        if self.has_blob(digest):
            return digest
        start = self.request("POST", f"/{self.target.path}/blobs/uploads/")
        location = start.headers.get("Location")
        if start.status_code != 202 or not location:
            raise PushFailed(
                f"registry {self.target.host} refused to start a blob upload: HTTP "
                f"{start.status_code}{_error_code(start)}"
            )
        url = urllib.parse.urljoin(f"{self.target.base_url}/", location)
        url += ("&" if urllib.parse.urlsplit(url).query else "?") + urllib.parse.urlencode({"digest": digest})
        done = self.request("PUT", url, data=data, headers={"Content-Type": "application/octet-stream"})
        if done.status_code not in (201, 204):
            raise PushFailed(
                f"registry {self.target.host} refused blob {digest} ({len(data)} bytes): HTTP "
                f"{done.status_code}{_error_code(done)}"
            )
        written = done.headers.get("Docker-Content-Digest")
        if written and written != digest:
            raise ManifestMismatch(f"blob {digest} was stored as {written}")
        return digest

    def put_raw_manifest(self, tag: str, body: bytes, media_type: str) -> Manifest:
        """PUT manifest bytes kiln made (a .sig or .att image) under `tag`."""
        manifest = Manifest(sha256_digest(body), media_type, body)
        self.put_manifest(tag, manifest)
        return manifest


class BlobTooLarge(Exception):
    """A blob larger than the caller said it may be; the caller knows what that means
    (for a signature artefact: not one cosign writes)."""

    def __init__(self, digest: str, limit: int) -> None:
        super().__init__(f"blob {digest} is larger than {limit} bytes")
        self.digest, self.limit = digest, limit


def _origin(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _same_origin(url: str, base: str) -> bool:
    return _origin(url) == _origin(base)


def _retry_after(resp: requests.Response) -> float:
    """Retry-After in seconds (the delta-seconds form registries send), capped."""
    try:
        return min(max(float(resp.headers.get("Retry-After", "")), 0.0), _RETRY_AFTER_CAP_S)
    except ValueError:
        return 0.0


class _RegistryError(TypedDict):
    code: str
    message: NotRequired[str]


class _RegistryErrors(TypedDict):
    """An error answer's body, as the distribution spec words it."""

    errors: list[_RegistryError]


_REGISTRY_ERRORS = Shape(_RegistryErrors)


def _error_code(resp: requests.Response) -> str:
    """The registry's own error code (MANIFEST_BLOB_UNKNOWN, DENIED, ...), if it sent one:
    words added to an error already on its way, so a body that is not one adds none."""
    try:
        errors = _REGISTRY_ERRORS.parse(resp.content, source="its error", error=KilnError)["errors"]
    except KilnError:
        return ""
    return f": {errors[0]['code']} {errors[0].get('message', '')}".rstrip() if errors else ""
