"""`kiln publish` / `kiln promote` against a real distribution registry on 127.0.0.1.

The tests in this module share one build and one registry; each uses the tags it
checks in its own way (the publish/skip/promote chain goes through `published`)."""

from __future__ import annotations

import json
import threading
import time

import pytest
from clijson import validated
from pubtest import NAME, REPOSITORY

pytestmark = [pytest.mark.docker, pytest.mark.registry]


def _pinned(result) -> tuple[str, str]:
    """(repository reference, manifest digest) from publish/promote's stdout line."""
    ref, _, digest = result.stdout.strip().splitlines()[-1].partition("@")
    return ref, digest


@pytest.fixture(scope="module")
def published(mini, registry):
    """kiln-test-mini published once to the `experimental` channel with a smoke pass."""
    mini.pass_smoke()
    result = mini.kiln("publish", NAME, "--registry", registry.host, registry=registry)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_refuses_without_smoke_record(mini, registry):
    mini.forget_smoke()
    result = mini.kiln("publish", NAME, "--registry", f"{registry.host}/refused", registry=registry)
    assert result.returncode == 12, result.stderr
    assert "no passing smoke record" in result.stderr
    assert registry.tags(f"refused/{REPOSITORY}") == []


def test_push_writes_all_tags_and_reads_back(mini, registry, published):
    ref, digest = _pinned(published)
    assert ref == f"{registry.host}/{REPOSITORY}"
    tags = registry.tags(REPOSITORY)
    for tag in (mini.short, mini.engine_tag, "experimental"):
        assert tag in tags
        got_digest, manifest = registry.manifest(REPOSITORY, tag)
        assert got_digest == digest, tag
        # the image id is the config digest: what was pushed is exactly what was smoke-tested
        assert manifest["config"]["digest"] == mini.image_id
    assert "stable" not in tags  # only the channel asked for moves
    assert set(tags) == {mini.short, mini.engine_tag, "experimental"}  # no staging tag for consumers to see
    assert mini.engine_tag == f"vllm-0.0.1.dev0-{NAME}"
    assert digest in published.stderr and "layers:" in published.stderr

    record = json.loads(next((mini.results / "publish").glob(f"{NAME}-publish-*.json")).read_text())
    assert record["manifest_digest"] == digest
    assert record["image_id"] == mini.image_id
    assert record["input_digest"] == mini.input_digest
    assert record["smoke"]["status"] == "passed"
    assert record["pushed"] is True
    assert record["tags"][-1].endswith(":" + mini.short)  # the input-digest tag is written last


def test_second_publish_skips_the_push(mini, registry, published):
    _, digest = _pinned(published)
    # password on stdin this time (the other way credentials may arrive)
    result = mini.kiln(
        "publish",
        NAME,
        "--registry",
        registry.host,
        "--password-stdin",
        registry=registry,
        KILN_REGISTRY_PASSWORD="",
        input=registry.password + "\n",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "push skipped" in result.stderr
    assert "layers:" not in result.stderr  # the daemon was not asked to push
    assert _pinned(result)[1] == digest


def test_promote_retags_the_exact_manifest(mini, registry, published):
    _, digest = _pinned(published)
    blobs_before = registry.blob_files()
    result = mini.kiln(
        "promote", NAME, "--from", "experimental", "--to", "stable", "--registry", registry.host, registry=registry
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert registry.manifest(REPOSITORY, "stable")[0] == digest
    assert _pinned(result)[1] == digest
    assert registry.blob_files() == blobs_before  # no layer (or manifest) was pushed again


def test_promote_from_an_empty_channel_fails(mini, registry):
    result = mini.kiln(
        "promote",
        NAME,
        "--from",
        "experimental",
        "--to",
        "stable",
        "--registry",
        f"{registry.host}/empty",
        registry=registry,
    )
    assert result.returncode == 42, result.stderr


def test_pull_back_and_run(mini, registry, published, docker_daemon):
    _, digest = _pinned(published)
    client = docker_daemon.client
    # drop the local image so the pull really downloads the recipe's layers
    client.images.remove(mini.image_id, force=True)
    pinned = f"{registry.host}/{REPOSITORY}@{digest}"
    try:
        image = client.images.pull(pinned, auth_config={"username": registry.user, "password": registry.password})
        assert image.id == mini.image_id
        out = client.containers.run(pinned, entrypoint=["cat", "/opt/payload.txt"], remove=True)
        assert out.decode().strip() == "payload v1"
    finally:
        # give the rest of the module its built image back (same id, same labels)
        docker_daemon.tag(mini.image_id, f"kiln/{NAME}:{mini.short}")
        client.images.remove(pinned)


def test_skip_smoke_check_never_moves_a_release_tag(mini, registry, published):
    """Into the main chain's repository, on purpose: the input-digest, engine and channel
    tags there point at the smoke-passed image and must still do so afterwards."""
    release = (mini.short, mini.engine_tag, "experimental")
    before = {tag: registry.manifest(REPOSITORY, tag)[0] for tag in release}
    mini.forget_smoke()
    try:
        result = mini.kiln(
            "publish", NAME, "--registry", registry.host, "--skip-smoke-check", "--json", registry=registry
        )
        assert result.returncode == 0, result.stderr[-3000:]
        doc = validated("publish", result.stdout)
        unsmoked = f"{mini.short}-unsmoked"
        assert doc["tags"] == [f"{registry.host}/{REPOSITORY}:{unsmoked}"]
        assert doc["channel"] is None and doc["smoke"] == {"status": "skipped"}
        assert "SKIPPED" in result.stderr and "replacing" not in result.stderr
        assert {tag: registry.manifest(REPOSITORY, tag)[0] for tag in release} == before

        digest, manifest = registry.manifest(REPOSITORY, unsmoked)
        assert digest == doc["manifest_digest"] and digest not in before.values()
        config = json.loads(registry.blob(REPOSITORY, manifest["config"]["digest"]))
        assert config["config"]["Labels"]["ai.kiln.smoke-check"] == "skipped"
        assert manifest["config"]["digest"] != mini.image_id  # a smoke pass can never vouch for it
        record = json.loads(max((mini.results / "publish").glob(f"{NAME}-publish-*.json")).read_text())
        assert record["smoke"] == {"status": "skipped"} and record["channel"] is None

        # asking for a channel without a smoke pass is refused before anything is pushed
        refused = mini.kiln(
            "publish",
            NAME,
            "--registry",
            f"{registry.host}/unsmoked",
            "--skip-smoke-check",
            "--channel",
            "stable",
            registry=registry,
        )
        assert refused.returncode == 41, refused.stderr
        assert "never moves a channel" in refused.stderr
        assert registry.tags(f"unsmoked/{REPOSITORY}") == []
    finally:
        mini.pass_smoke()


def test_publish_and_promote_json(mini, registry, published):
    ns = f"{registry.host}/jsondoc"
    mini.pass_smoke()
    pub = mini.kiln("publish", NAME, "--registry", ns, "--json", registry=registry)
    assert pub.returncode == 0, pub.stderr[-3000:]
    doc = validated("publish", pub.stdout)
    assert doc["channel"] == "experimental" and doc["image_id"] == mini.image_id
    assert doc["tags"][-1] == f"{ns}/{REPOSITORY}:{mini.short}"
    assert doc["pinned"] == f"{ns}/{REPOSITORY}@{doc['manifest_digest']}"
    pro = mini.kiln(
        "promote", NAME, "--registry", ns, "--from", "experimental", "--to", "stable", "--json", registry=registry
    )
    assert pro.returncode == 0, pro.stderr[-3000:]
    pdoc = validated("promote", pro.stdout)
    assert pdoc["manifest_digest"] == doc["manifest_digest"] and pdoc["moved"] is True


def test_wrong_password_fails_at_once(mini, registry, published):
    t0 = time.monotonic()
    result = mini.kiln(
        "publish",
        NAME,
        "--registry",
        f"{registry.host}/wrongpw",
        registry=registry,
        KILN_REGISTRY_PASSWORD="not-the-password",
    )
    assert result.returncode == 11, result.stderr
    assert time.monotonic() - t0 < 20  # no backoff loop (the CLI start-up is most of it)
    assert "rejected the credentials from env" in result.stderr
    assert "not-the-password" not in result.stdout + result.stderr
    assert registry.tags(f"wrongpw/{REPOSITORY}") == []


def test_no_credentials_fail_clearly(mini, registry, published):
    result = mini.kiln("publish", NAME, "--registry", registry.host)
    assert result.returncode == 11, result.stderr
    assert "needs credentials and none were found" in result.stderr


def test_unreachable_registry_retries_then_fails(mini, published):
    from localregistry import free_port

    t0 = time.monotonic()
    result = mini.kiln(
        "publish", NAME, "--registry", f"127.0.0.1:{free_port()}", KILN_REGISTRY_USER="u", KILN_REGISTRY_PASSWORD="p"
    )
    took = time.monotonic() - t0
    assert result.returncode == 10, result.stderr
    assert "unreachable after 4 attempts" in result.stderr
    assert 3.5 <= took < 30  # backed off (0.5 + 1 + 2 s), and gave up


def test_registry_stopped_mid_push_moves_no_tag(mini, fresh_registry):
    """Kill the registry while the daemon uploads layers: the publish fails with its own
    code and, once the registry is back, no tag at all exists."""

    def kill_when_uploading():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not fresh_registry.uploads_started():
            time.sleep(0.02)
        fresh_registry.stop()

    killer = threading.Thread(target=kill_when_uploading)
    killer.start()
    result = mini.kiln("publish", NAME, "--registry", fresh_registry.host, registry=fresh_registry)
    killer.join()
    assert result.returncode == 9, result.stderr[-3000:]
    assert "no channel or digest tag was written" in result.stderr
    fresh_registry.start()
    assert fresh_registry.tags(REPOSITORY) == []


def test_registry_gone_before_tags_leaves_channels_alone(mini, fresh_registry, monkeypatch):
    """Layers are up but the registry dies before the first tag write: exit 10, and
    neither a channel nor the input-digest tag exists afterwards."""
    from kiln import cli
    from kiln.infra import registry

    real_put = registry.RegistryClient.put_manifest

    def dying_put(self, tag, manifest):
        fresh_registry.stop()
        return real_put(self, tag, manifest)

    monkeypatch.setattr(registry.RegistryClient, "put_manifest", dying_put)
    for key, value in mini.env(fresh_registry).items():
        monkeypatch.setenv(key, value)
    code = cli.main(["publish", NAME, "--registry", fresh_registry.host])
    assert code == 10
    fresh_registry.start()
    assert fresh_registry.tags(REPOSITORY) == [mini.engine_tag]  # the daemon's push tag; no staging tag


def test_no_credential_in_layers_labels_records_or_output(mini, registry, published, docker_daemon):
    """Runs last: scans everything the module's publishes left behind."""
    leaks = registry.secrets()
    for path, data in registry.stored_bytes():
        for secret in leaks:
            assert secret.encode() not in data, f"credential in registry file {path}"
    for path in mini.results.rglob("*"):
        if path.is_file():
            text = path.read_text()
            assert not any(s in text for s in leaks), f"credential in record {path}"
            assert registry.user not in text, f"user name in record {path}"
    labels = json.dumps(docker_daemon.image(mini.image_id).labels)
    assert not any(s in labels for s in leaks)
    for run in mini.outputs:
        assert not any(s in run.stdout + run.stderr for s in leaks), run.args
    assert list(mini.docker_config.iterdir()) == []  # no `docker login` was written
