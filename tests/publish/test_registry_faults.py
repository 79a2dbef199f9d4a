"""Registry faults: the real registry behind a fault-injecting proxy on 127.0.0.1
(faultproxy.py). kiln's client retries 429 (honouring Retry-After), 5xx and dropped
connections a bounded number of times, replaces an expired Bearer token once, and ends
every fault that persists in its own typed error with no tag half-written."""

from __future__ import annotations

import time

import pytest
from faultproxy import FaultProxy
from localregistry import LocalRegistry
from pubtest import NAME, REPOSITORY

from kiln.basics.errors import (
    RegistryAuthFailed,
    RegistryRateLimited,
    RegistryServerError,
    RegistryUnreachable,
)
from kiln.infra import registry as kreg
from kiln.infra.credentials import Credentials
from kiln.infra.manifests import Manifest
from kiln.infra.registry import RegistryClient, Target

pytestmark = [pytest.mark.registry]
REPO = "faults/tiny"


@pytest.fixture
def proxied(registry_tools, tmp_path):
    reg = LocalRegistry(tmp_path / "registry").start()
    proxy = FaultProxy(reg.host).start()
    digest, body = reg.push_tiny(REPO, "v1")
    yield reg, proxy, Manifest(digest, "application/vnd.oci.image.manifest.v1+json", body)
    proxy.stop()
    reg.stop()


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch):
    monkeypatch.setattr(kreg, "_BACKOFF_S", 0.05)


def _client(reg: LocalRegistry, proxy: FaultProxy) -> RegistryClient:
    client = RegistryClient(Target.parse(proxy.host, REPO), Credentials(reg.user, reg.password, "test"))
    client.check_access()
    return client


def test_429_with_retry_after_is_waited_out(proxied):
    reg, proxy, manifest = proxied
    client = _client(reg, proxy)
    proxy.inject("GET", "/manifests/v1", 2, 429, Retry_After="1")
    t0 = time.monotonic()
    assert client.manifest("v1") == manifest
    assert time.monotonic() - t0 >= 2.0  # Retry-After: 1, twice (the backoff alone is 0.15 s)
    assert proxy.statuses("GET", "/manifests/v1") == [429, 429, 200]


def test_retry_after_is_capped(proxied, monkeypatch):
    reg, proxy, manifest = proxied
    monkeypatch.setattr(kreg, "_RETRY_AFTER_CAP_S", 0.2)
    client = _client(reg, proxy)
    proxy.inject("GET", "/manifests/v1", 1, 429, Retry_After="3600")
    t0 = time.monotonic()
    assert client.manifest("v1") == manifest
    assert time.monotonic() - t0 < 5


def test_503s_then_the_tag_write_succeeds(proxied):
    reg, proxy, manifest = proxied
    client = _client(reg, proxy)
    proxy.inject("PUT", "/manifests/stable", 3, 503)
    client.put_manifest("stable", manifest)
    assert proxy.statuses("PUT", "/manifests/stable") == [503, 503, 503, 201]
    assert reg.manifest(REPO, "stable")[0] == manifest.digest


def test_dropped_connections_are_retried(proxied):
    reg, proxy, manifest = proxied
    client = _client(reg, proxy)
    proxy.inject("GET", "/manifests/v1", 2)  # status 0: close without an answer
    assert client.manifest("v1") == manifest
    assert proxy.statuses("GET", "/manifests/v1") == [0, 0, 200]


@pytest.mark.parametrize(
    "status,error,code",
    [
        (503, RegistryServerError, 46),
        (500, RegistryServerError, 46),
        (429, RegistryRateLimited, 45),
    ],
)
def test_a_fault_that_persists_is_a_typed_error_and_writes_nothing(proxied, status, error, code):
    reg, proxy, manifest = proxied
    client = _client(reg, proxy)
    proxy.inject("PUT", "/manifests/", 100, status)
    with pytest.raises(error) as exc:
        client.put_manifest("stable", manifest)
    assert exc.value.exit_code == code and f"HTTP {status}" in exc.value.message
    assert len(proxy.statuses("PUT", "/manifests/stable")) == kreg._ATTEMPTS  # bounded
    assert reg.tags(REPO) == ["v1"]


def test_a_registry_that_dies_is_unreachable_after_bounded_retries(proxied):
    reg, proxy, _ = proxied
    client = _client(reg, proxy)
    proxy.inject("*", "/", 100)  # every connection dropped from now on
    with pytest.raises(RegistryUnreachable, match=f"after {kreg._ATTEMPTS} attempts") as exc:
        client.manifest("v1")
    assert f"curl http://{proxy.host}/v2/" in exc.value.hint  # the scheme kiln really used


def test_expired_bearer_tokens_are_replaced(proxied):
    reg, proxy, manifest = proxied
    proxy.token_front(reg.user, reg.password, uses=2)
    client = _client(reg, proxy)
    for tag in ("a", "b", "c"):
        client.put_manifest(tag, manifest)
        assert client.manifest(tag) == manifest
    assert proxy.tokens_issued >= 3  # 7 requests on 2-use tokens: refreshed along the way
    assert reg.tags(REPO) == ["a", "b", "c", "v1"]
    # every 401 was answered by one token fetch and one resend, never a loop
    assert proxy.statuses("GET", "/token").count(200) == proxy.tokens_issued


def test_bearer_token_with_wrong_password_is_not_retried(proxied):
    reg, proxy, _ = proxied
    proxy.token_front(reg.user, reg.password, uses=2)
    client = RegistryClient(Target.parse(proxy.host, REPO), Credentials(reg.user, "wrong", "env"))
    with pytest.raises(RegistryAuthFailed, match="rejected the credentials from env"):
        client.check_access()
    assert proxy.statuses("GET", "/token") == [401]
    assert proxy.tokens_issued == 0


@pytest.mark.docker
def test_publish_through_a_failing_registry_leaves_no_channel_or_digest_tag(mini, registry_tools, tmp_path):
    """The daemon pushes through the proxy; then every write of the channel tag answers
    503: exit 46, and neither the channel tag nor the input-digest tag exists."""
    reg = LocalRegistry(tmp_path / "registry").start()
    proxy = FaultProxy(reg.host).start()
    try:
        mini.pass_smoke()
        proxy.inject("PUT", "/manifests/experimental", 100, 503)
        result = mini.kiln(
            "publish",
            NAME,
            "--registry",
            f"http://{proxy.host}",
            registry=reg,
            KILN_REGISTRY_HOST=proxy.host,
        )
        assert result.returncode == 46, result.stderr[-3000:]
        assert f"answered HTTP 503 to PUT /{REPOSITORY}/manifests/experimental" in result.stderr
        assert f"written so far: {mini.engine_tag};" in result.stderr
        assert reg.tags(REPOSITORY) == [mini.engine_tag]
        assert len(proxy.statuses("PUT", "/manifests/experimental")) == 4  # bounded retries
    finally:
        proxy.stop()
        reg.stop()


@pytest.mark.docker
def test_publish_rides_out_transient_faults(mini, registry_tools, tmp_path):
    """429 with Retry-After on the access check, 503s on a manifest read and a dropped
    connection on a tag write: the publish still completes, with every tag in place."""
    reg = LocalRegistry(tmp_path / "registry").start()
    proxy = FaultProxy(reg.host).start()
    try:
        mini.pass_smoke()
        proxy.inject("GET", "/v2/", 2, 429, Retry_After="1")
        proxy.inject("GET", f"/manifests/{mini.short}", 2, 503)
        proxy.inject("PUT", "/manifests/experimental", 1)
        result = mini.kiln(
            "publish",
            NAME,
            "--registry",
            f"http://{proxy.host}",
            registry=reg,
            KILN_REGISTRY_HOST=proxy.host,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert all(f.times == 0 for f in proxy.faults)  # every fault was really hit
        assert set(reg.tags(REPOSITORY)) == {mini.engine_tag, "experimental", mini.short}
    finally:
        proxy.stop()
        reg.stop()
