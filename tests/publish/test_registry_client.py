"""The registry client's Bearer-token flow (what cloud registries use) against a small
in-process fake; the htpasswd (Basic) flow runs against the real registry in
test_publish.py."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kiln.basics.errors import RegistryAuthFailed, RegistryInvalid
from kiln.infra.credentials import Credentials
from kiln.infra.manifests import Manifest
from kiln.infra.registry import RegistryClient, Target

USER, PASSWORD, TOKEN = "tokuser", "tokpass", "tok-123"
MEDIA = "application/vnd.oci.image.manifest.v1+json"


class _Fake(BaseHTTPRequestHandler):
    manifests: dict[str, bytes] = {}
    scopes: list[str] = []

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _send(self, code: int, body: bytes = b"", headers: dict | None = None):
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _authorised(self) -> bool:
        if self.headers.get("Authorization") == f"Bearer {TOKEN}":
            return True
        realm = f"http://{self.headers['Host']}/token"
        self._send(401, b"{}", {"WWW-Authenticate": f'Bearer realm="{realm}",service="fake"'})
        return False

    def do_GET(self):
        if self.path.startswith("/token"):
            self.scopes.append(self.path)
            good = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
            if self.headers.get("Authorization") != good:
                return self._send(401, b"{}")
            return self._send(200, json.dumps({"token": TOKEN}).encode())
        if not self._authorised():
            return None
        if self.path == "/v2/":
            return self._send(200, b"{}")
        ref = self.path.rsplit("/", 1)[1]
        body = self.manifests.get(ref)
        if body is None:
            return self._send(404, b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}')
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        self._send(200, body, {"Content-Type": MEDIA, "Docker-Content-Digest": digest})

    def do_PUT(self):
        if not self._authorised():
            return
        body = self.rfile.read(int(self.headers["Content-Length"]))
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        self.manifests[self.path.rsplit("/", 1)[1]] = body
        self.manifests[digest] = body
        self._send(201, b"", {"Docker-Content-Digest": digest})


@pytest.fixture
def fake_registry():
    _Fake.manifests, _Fake.scopes = {}, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Fake)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.registry  # HTTP on 127.0.0.1 (the in-process fake)
def test_bearer_token_flow_and_retag(fake_registry):
    target = Target.parse(f"{fake_registry}/acme", "kiln/x")
    client = RegistryClient(target, Credentials(USER, PASSWORD, "test"))
    client.check_access()
    assert "repository%3Aacme%2Fkiln%2Fx%3Apull%2Cpush" in _Fake.scopes[0]  # scoped to this repo
    body = json.dumps({"schemaVersion": 2, "mediaType": MEDIA, "config": {"digest": "sha256:" + "a" * 64}}).encode()
    manifest = Manifest("sha256:" + hashlib.sha256(body).hexdigest(), MEDIA, body)
    assert client.manifest("stable") is None
    client.put_manifest("stable", manifest)
    back = client.manifest("stable")
    assert back == manifest and back.config_digest == "sha256:" + "a" * 64


@pytest.mark.registry  # HTTP on 127.0.0.1 (the in-process fake)
def test_bearer_wrong_password(fake_registry):
    client = RegistryClient(Target.parse(fake_registry, "kiln/x"), Credentials(USER, "wrong", "env"))
    with pytest.raises(RegistryAuthFailed, match="rejected the credentials from env"):
        client.check_access()


@pytest.mark.parametrize("bad", ["ftp://reg.example", "Has Space", "reg.example/UPPER"])
def test_registry_must_be_host_and_namespace(bad):
    with pytest.raises(RegistryInvalid):
        Target.parse(bad, "kiln/x")


@pytest.mark.parametrize(
    "given,plain",
    [
        ("http://10.0.0.5:5000/ml", True),
        ("https://127.0.0.1:5000", False),
        ("http://127.0.0.1:5000/", True),
        ("https://ghcr.io/acme/", False),
    ],
)
def test_a_scheme_says_which_protocol(given, plain):
    target = Target.parse(given, "kiln/x")
    assert target.plain_http is plain
    assert "://" not in target.host + target.path  # docker references never carry the scheme


def test_https_and_plain_http_contradict():
    with pytest.raises(RegistryInvalid, match="--plain-http"):
        Target.parse("https://reg.example", "kiln/x", plain_http=True)


@pytest.mark.parametrize(
    "host,plain",
    [
        ("127.0.0.1:5000", True),
        ("localhost:5000", True),
        ("[::1]:5000", True),
        ("ghcr.io", False),
        ("10.0.0.5:5000", False),
    ],
)
def test_plain_http_only_for_loopback(host, plain):
    assert Target.parse(host, "kiln/x").plain_http is plain
    assert Target.parse(host, "kiln/x", plain_http=True).plain_http is True


@pytest.mark.parametrize("realm", ["http://203.0.113.9/token", "ftp://auth.example/token", "//auth.example/token"])
def test_credentials_never_go_to_a_clear_text_token_service(realm):
    """A registry's challenge names the token service; a plain-HTTP one off this machine
    gets no credentials (the request is never sent)."""

    class Challenge:
        headers = {"WWW-Authenticate": f'Bearer realm="{realm}",service="x"'}

    client = RegistryClient(Target("registry.example", "team/app", False), Credentials(USER, PASSWORD, "test"))
    client.session.get = client.session.post = lambda *a, **k: pytest.fail(f"credentials sent to {realm}")
    with pytest.raises(RegistryAuthFailed, match="not HTTPS"):
        client._authenticate(Challenge())
