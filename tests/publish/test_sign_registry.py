"""Signed publishing and `kiln verify` against a real distribution registry on 127.0.0.1
(Debian's docker-registry, request log at info level so the order of writes and what
reached the registry can be read back), with the mini stand-in image.

Each test works in its own namespace of the registry. The attacks are done with plain
HTTP against the registry, as anyone holding push rights could."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import re
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
from clijson import validated
from localregistry import OCI_MANIFEST, LocalRegistry
from pubtest import NAME, REPOSITORY

pytestmark = [pytest.mark.docker, pytest.mark.registry]

SIGNING_PASSWORD = "sign-pw-" + secrets.token_hex(8)  # random: a scan for it finds only real leaks
SIG = re.compile(r"^sha256-[0-9a-f]{64}\.(sig|att)$")


@pytest.fixture(scope="module")
def reg(registry_tools, tmp_path_factory):
    r = LocalRegistry(tmp_path_factory.mktemp("sign-registry"), log_level="info").start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def signing_keys(tmp_path_factory):
    from kiln.domain.signing import keys

    d = tmp_path_factory.mktemp("keys")
    ours = keys.write_key_pair(d / "team", SIGNING_PASSWORD.encode())
    other = keys.write_key_pair(d / "other", b"other-pw")
    return ours, other


def _env(**extra) -> dict[str, str]:
    return {"KILN_SIGNING_PASSWORD": SIGNING_PASSWORD, "COSIGN_PASSWORD": "", **extra}


def _put(reg: LocalRegistry, repo: str, tag: str, body: bytes, media_type: str = OCI_MANIFEST) -> requests.Response:
    return requests.put(
        f"http://{reg.host}/v2/{repo}/manifests/{tag}",
        data=body,
        auth=reg.auth,
        timeout=10,
        headers={"Content-Type": media_type},
    )


def _blob(reg: LocalRegistry, repo: str, data: bytes) -> str:
    return reg._upload(repo, data, "application/octet-stream")["digest"]


def _completed(reg: LocalRegistry, repo: str) -> list[tuple[str, str]]:
    """(method, manifest reference) of every manifest request the registry completed, in order."""
    out = []
    for line in reg.log_text().splitlines():
        if 'msg="response completed"' not in line:
            continue
        method = re.search(r"http\.request\.method=(\w+)", line)
        uri = re.search(rf"http\.request\.uri=/v2/{re.escape(repo)}/manifests/(\S+)", line)
        if method and uri:
            out.append((method.group(1), uri.group(1)))
    return out


def _sig_tag(digest: str, kind: str = "sig") -> str:
    return digest.replace(":", "-") + "." + kind


def _publish_signed(mini, reg, ns: str, key: Path, *extra: str):
    mini.pass_smoke()
    result = mini.kiln(
        "publish", NAME, "--registry", f"{reg.host}/{ns}", "--sign", str(key), *extra, registry=reg, **_env()
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _verify(mini, reg, ref: str, key: Path, *extra: str):
    return mini.kiln("verify", ref, "--key", str(key), *extra, registry=reg)


def _pinned(result) -> str:
    return result.stdout.strip().splitlines()[-1].partition("@")[2]


@pytest.fixture(scope="module")
def signed(mini, reg, signing_keys):
    """The mini image published signed into namespace `signed/`; (publish result, digest)."""
    ours, _ = signing_keys
    result = _publish_signed(mini, reg, "signed", ours.private, "--json")
    doc = validated("publish", result.stdout)
    return result, doc


# -- the signed publish ------------------------------------------------------------------------
def test_signed_publish_writes_signature_and_attestations_before_any_consumer_tag(mini, reg, signed, signing_keys):
    ours, _ = signing_keys
    _, doc = signed
    digest, repo = doc["manifest_digest"], f"signed/{REPOSITORY}"
    assert doc["signature"]["key_fingerprint"] == ours.fingerprint and doc["signature"]["verified"] is True
    assert sorted(doc["signature"]["predicate_types"]) == [
        "https://cyclonedx.org/bom",
        "https://slsa.dev/provenance/v1",
    ]
    tags = reg.tags(repo)
    consumer = {mini.short, mini.engine_tag, "experimental"}
    assert set(tags) == consumer | {f"{mini.short}-staging", _sig_tag(digest), _sig_tag(digest, "att")}
    # the registry's own request log: the order in which manifests were written and read
    requests_done = _completed(reg, repo)
    written = [ref for method, ref in requests_done if method == "PUT"]
    assert written[0] == f"{mini.short}-staging", written  # the daemon's push: no consumer tag
    first_consumer = min(requests_done.index(("PUT", t)) for t in consumer)
    att_put = requests_done.index(("PUT", _sig_tag(digest, "att")))
    assert requests_done.index(("PUT", _sig_tag(digest))) < first_consumer and att_put < first_consumer
    # ... and between the last signing write and the first consumer tag, kiln read it all back
    assert ("GET", _sig_tag(digest)) in requests_done[att_put:first_consumer]
    assert ("GET", _sig_tag(digest, "att")) in requests_done[att_put:first_consumer]
    # the .sig image is cosign's: one simple-signing layer, signature annotation, OCI types
    _, sig = reg.manifest(repo, _sig_tag(digest))
    assert sig["mediaType"] == OCI_MANIFEST and sig["config"]["mediaType"] == "application/vnd.oci.image.config.v1+json"
    [layer] = sig["layers"]
    assert layer["mediaType"] == "application/vnd.dev.cosign.simplesigning.v1+json"
    payload = json.loads(reg.blob(repo, layer["digest"]))
    assert payload["critical"] == {
        "identity": {"docker-reference": f"{reg.host}/signed/{REPOSITORY}"},
        "image": {"docker-manifest-digest": digest},
        "type": "cosign container image signature",
    }
    _, att = reg.manifest(repo, _sig_tag(digest, "att"))
    assert {la["annotations"]["predicateType"] for la in att["layers"]} == set(doc["signature"]["predicate_types"])
    # the SBOM attestation's predicate is a CycloneDX document about this image
    sbom_layer = next(la for la in att["layers"] if la["annotations"]["predicateType"] == "https://cyclonedx.org/bom")
    envelope = json.loads(reg.blob(repo, sbom_layer["digest"]))
    statement = json.loads(base64.b64decode(envelope["payload"]))
    assert statement["subject"][0]["digest"]["sha256"] == digest.removeprefix("sha256:")
    assert statement["predicate"]["bomFormat"] == "CycloneDX"
    assert any(c.get("name") == "python3" for c in statement["predicate"].get("components", []))


def test_a_signed_image_verifies_by_tag_and_digest(mini, reg, signed, signing_keys):
    ours, _ = signing_keys
    _, doc = signed
    for ref in (
        f"{reg.host}/signed/{REPOSITORY}:experimental",
        f"{reg.host}/signed/{REPOSITORY}@{doc['manifest_digest']}",
        f"{reg.host}/signed/{REPOSITORY}:{mini.short}@{doc['manifest_digest']}",
    ):
        result = _verify(mini, reg, ref, ours.public, "--json")
        assert result.returncode == 0, result.stderr
        out = validated("verify", result.stdout)
        assert out["digest"] == doc["manifest_digest"] and out["key_fingerprint"] == ours.fingerprint
        assert [a["verified"] for a in out["attestations"]] == [True, True]
    plain = _verify(mini, reg, f"{reg.host}/signed/{REPOSITORY}:experimental", ours.public)
    assert plain.stdout.strip() == f"{reg.host}/signed/{REPOSITORY}@{doc['manifest_digest']}"


def test_an_unsigned_image_fails(mini, reg, signing_keys):
    ours, _ = signing_keys
    mini.pass_smoke()
    result = mini.kiln("publish", NAME, "--registry", f"{reg.host}/unsigned", registry=reg)
    assert result.returncode == 0, result.stderr[-2000:]
    check = _verify(mini, reg, f"{reg.host}/unsigned/{REPOSITORY}:experimental", ours.public)
    assert check.returncode == 82, check.stderr
    assert "is not signed" in check.stderr and "Traceback" not in check.stderr


def test_an_image_signed_by_another_key_fails(mini, reg, signed, signing_keys):
    _, other = signing_keys
    check = _verify(mini, reg, f"{reg.host}/signed/{REPOSITORY}:experimental", other.public)
    assert check.returncode == 84, check.stderr
    assert other.fingerprint in check.stderr and signing_keys[0].fingerprint in check.stderr


def test_a_moved_tag_fails(mini, reg, signed, signing_keys):
    ours, _ = signing_keys
    _, _doc = signed
    ns = f"moved/{REPOSITORY}"
    _publish_signed(mini, reg, "moved", ours.private)
    signed_digest, _ = reg.manifest(ns, "experimental")
    sig_body = requests.get(
        f"http://{reg.host}/v2/{ns}/manifests/{_sig_tag(signed_digest)}",
        auth=reg.auth,
        headers={"Accept": OCI_MANIFEST},
        timeout=10,
    ).content
    # someone pushes another image under the channel tag
    other, _ = reg.push_tiny(ns, "experimental")
    moved = _verify(mini, reg, f"{reg.host}/{ns}:experimental", ours.public)
    assert moved.returncode == 82 and other in moved.stderr, moved.stderr
    # the digest the user pinned no longer matches the tag
    pinned = _verify(mini, reg, f"{reg.host}/{ns}:experimental@{signed_digest}", ours.public)
    assert pinned.returncode == 85 and "the tag moved" in pinned.stderr, pinned.stderr
    # and copying the genuine signature next to the new image does not help
    assert _put(reg, ns, _sig_tag(other), sig_body).status_code == 201
    copied = _verify(mini, reg, f"{reg.host}/{ns}:experimental", ours.public, "--signature-only")
    assert copied.returncode == 85 and f"genuine signature of {signed_digest}" in copied.stderr, copied.stderr


def test_a_repushed_image_with_one_changed_layer_fails(mini, reg, signing_keys):
    from kiln.domain.signing import keys, signatures
    from kiln.infra.credentials import Credentials
    from kiln.infra.registry import RegistryClient, Target

    ours, _ = signing_keys
    ns = f"repushed/{REPOSITORY}"
    _publish_signed(mini, reg, "repushed", ours.private)
    original, manifest = reg.manifest(ns, "experimental")
    # one layer replaced (an attacker's file in it), everything else as published
    evil = gzip.compress(b"one changed layer " + secrets.token_bytes(16))
    manifest["layers"][-1] = {**manifest["layers"][-1], "digest": _blob(reg, ns, evil), "size": len(evil)}
    body = json.dumps(manifest).encode()
    assert _put(reg, ns, "experimental", body, manifest["mediaType"]).status_code == 201
    changed = "sha256:" + hashlib.sha256(body).hexdigest()
    assert changed != original
    assert _verify(mini, reg, f"{reg.host}/{ns}:experimental", ours.public).returncode == 82
    # with the original signature and attestations copied to the changed image
    for kind in ("sig", "att"):
        got = requests.get(
            f"http://{reg.host}/v2/{ns}/manifests/{_sig_tag(original, kind)}",
            auth=reg.auth,
            headers={"Accept": OCI_MANIFEST},
            timeout=10,
        ).content
        assert _put(reg, ns, _sig_tag(changed, kind), got).status_code == 201
    copied = _verify(mini, reg, f"{reg.host}/{ns}:experimental", ours.public)
    assert copied.returncode == 85, copied.stderr
    # even a genuine new signature of the changed digest leaves the copied attestations
    # describing the original: their subject does not match
    client = RegistryClient(Target.parse(reg.host, ns), Credentials(reg.user, reg.password, None, "test"))
    key = keys.load_private_key(ours.private, SIGNING_PASSWORD.encode())
    signatures.sign_image(client, changed, key, [], creator="attacker with the key, but no SBOM")
    mixed = _verify(mini, reg, f"{reg.host}/{ns}:experimental", ours.public)
    assert mixed.returncode == 88 and f"not about {changed}" in mixed.stderr, mixed.stderr


@pytest.mark.parametrize("kind", ["sig", "att"])
def test_garbage_signature_manifests_are_one_line_errors(mini, reg, signing_keys, kind):
    ours, _ = signing_keys
    ns = f"garbage-{kind}/{REPOSITORY}"
    image, _ = reg.push_tiny(ns, "v1")
    if kind == "att":  # a genuine signature, so that verification reaches the attestations
        _sign_only(reg, ns, image, ours)
    tag = _sig_tag(image, kind)
    config_bytes = b'{"architecture":"","os":"","rootfs":{"type":"layers","diff_ids":[]},"config":{}}'
    config = _blob(reg, ns, config_bytes)
    media = (
        "application/vnd.dev.cosign.simplesigning.v1+json" if kind == "sig" else "application/vnd.dsse.envelope.v1+json"
    )
    truncated = (
        b'{"critical":{"identity":{"docker-reference":"x"},"ima'
        if kind == "sig"
        else b'{"payloadType":"application/vnd.in-toto+json","payload":"eyJf'
    )

    def manifest(layers):
        return json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "config": {
                    "mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": config,
                    "size": len(config_bytes),
                },
                "layers": layers,
            }
        ).encode()

    def layer(data: bytes, media_type: str = media, annotations=None):
        return {
            "mediaType": media_type,
            "digest": _blob(reg, ns, data),
            "size": len(data),
            "annotations": annotations
            if annotations is not None
            else {"dev.cosignproject.cosign/signature": "MEUCIQ=="},
        }

    cases = {
        "truncated payload": manifest([layer(truncated)]),
        "binary garbage": manifest([layer(b"\x00\xff\xfe garbage " + secrets.token_bytes(8))]),
        "wrong media type": manifest([layer(b"{}", "application/vnd.oci.image.layer.v1.tar+gzip")]),
        "no layers": manifest([]),
        "no signature annotation": manifest([layer(b'{"critical":{},"optional":null}', annotations={})]),
    }
    # a truncated or garbage manifest itself is refused by the registry (MANIFEST_INVALID),
    # so it cannot be served; tests/sign unit-tests kiln on such bytes
    assert (
        _put(reg, ns, tag, b'{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+js').status_code
        == 400
    )
    for what, body in cases.items():
        assert _put(reg, ns, tag, body).status_code == 201, what
        result = _verify(mini, reg, f"{reg.host}/{ns}:v1", ours.public)
        assert result.returncode == 87, (what, result.stderr)
        errors = [ln for ln in result.stderr.splitlines() if ln.startswith("kiln: error:")]
        assert len(errors) == 1 and "Traceback" not in result.stderr, (what, result.stderr)


def _sign_only(reg, ns: str, digest: str, key_files) -> None:
    from kiln.domain.signing import keys, signatures
    from kiln.infra.credentials import Credentials
    from kiln.infra.registry import RegistryClient, Target

    client = RegistryClient(Target.parse(reg.host, ns), Credentials(reg.user, reg.password, None, "test"))
    signatures.sign_image(
        client, digest, keys.load_private_key(key_files.private, SIGNING_PASSWORD.encode()), [], creator="test"
    )


def test_real_cosign_artefacts_verify_from_the_registry(reg):
    """The .sig image the real cosign v3.0.4 wrote (tests/fixtures/cosign/cosign-v3),
    stored in the registry byte for byte and verified over HTTP."""
    from kilntest import FIXTURES

    from kiln.basics.errors import SignedIdentityMismatch
    from kiln.domain.signing import cosign, keys, signatures
    from kiln.infra.credentials import Credentials
    from kiln.infra.registry import RegistryClient, Target

    d = FIXTURES / "cosign" / "cosign-v3"
    subject = "sha256:f20c43161d73848408ef247f0ec7111b19fe58ffebc0cbcaa0d2c8bda4967268"
    ns = "tobby/fixture"
    payload = (d / "sig-payload.json").read_bytes()
    _blob(reg, ns, payload)
    _blob(reg, ns, cosign.artefact_image([cosign.signature_layer(payload, b"-")]).config.data)
    assert _put(reg, ns, _sig_tag(subject), (d / "sig-manifest.json").read_bytes()).status_code == 201
    client = RegistryClient(Target.parse(reg.host, ns), Credentials(reg.user, reg.password, None, "test"))
    key = keys.load_public_key(d / "cosign.pub")
    done = signatures.verify_image(client, subject, key, required=(), signed_repository="localhost:15381/tobby/fixture")
    assert done.signed_identity == "localhost:15381/tobby/fixture" and done.key_fingerprint == key.fingerprint
    with pytest.raises(SignedIdentityMismatch):  # kiln checks the identity cosign ignores
        signatures.verify_image(client, subject, key, required=())


# -- recipes that require signatures ---------------------------------------------------------------
@pytest.fixture(scope="module")
def strict(mini, signing_keys, tmp_path_factory, docker_daemon):
    """The mini recipe with publish.require_signature and publish.public_key pinned, built
    in a copy of the tree (its own input digest)."""
    import shutil

    from kilntest import run_kiln

    ours, _ = signing_keys
    root = tmp_path_factory.mktemp("strict") / "tree"
    shutil.copytree(mini.root, root)
    recipe_dir = root / "recipes" / NAME
    shutil.copy(ours.public, recipe_dir / "team.pub")
    recipe = recipe_dir / "recipe.yaml"
    recipe.write_text(
        recipe.read_text().replace(
            f"  repository: {REPOSITORY}\n",
            f"  repository: {REPOSITORY}\n  require_signature: true\n  public_key: team.pub\n",
        )
    )
    built = run_kiln("build", NAME, env={"KILN_ROOT": str(root)}, cwd=root)
    assert built.returncode == 0, built.stderr[-3000:]
    import dataclasses

    from kiln.basics import paths
    from kiln.domain.images.definitions import resolve

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KILN_ROOT", str(root))
        paths.repo_root.cache_clear()
        recipe_image = resolve(NAME).recipe_image
        image_id = docker_daemon.image(recipe_image.tag).id
    paths.repo_root.cache_clear()
    return dataclasses.replace(
        mini,
        root=root,
        image_id=image_id,
        short=recipe_image.short,
        input_digest=recipe_image.digest,
        outputs=mini.outputs,
    )


def test_required_signature_refuses_unsigned_and_wrong_key_publishes_before_pushing(
    strict, reg, signing_keys, monkeypatch
):
    ours, other = signing_keys
    strict.pass_smoke()
    unsigned = strict.kiln("publish", NAME, "--registry", f"{reg.host}/strict", registry=reg)
    assert unsigned.returncode == 89 and "publish.require_signature" in unsigned.stderr, unsigned.stderr
    wrong_key = strict.kiln(
        "publish",
        NAME,
        "--registry",
        f"{reg.host}/strict",
        "--sign",
        str(other.private),
        registry=reg,
        **_env(KILN_SIGNING_PASSWORD="other-pw"),
    )
    assert wrong_key.returncode == 80 and "pins" in wrong_key.stderr, wrong_key.stderr
    wrong_pw = strict.kiln(
        "publish",
        NAME,
        "--registry",
        f"{reg.host}/strict",
        "--sign",
        str(ours.private),
        registry=reg,
        **_env(KILN_SIGNING_PASSWORD="nope"),
    )
    assert wrong_pw.returncode == 81 and "nope" not in wrong_pw.stderr, wrong_pw.stderr
    # with stdin taken by the registry password, the signing password must come from the environment
    for name in ("KILN_SIGNING_PASSWORD", "COSIGN_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    clash = strict.kiln(
        "publish",
        NAME,
        "--registry",
        f"{reg.host}/strict",
        "--sign",
        str(ours.private),
        "--password-stdin",
        registry=reg,
        input=reg.password + "\n",
        KILN_REGISTRY_PASSWORD="",
    )
    assert clash.returncode == 81 and "cannot come from there too" in clash.stderr, clash.stderr
    assert reg.tags(f"strict/{REPOSITORY}") == []  # nothing was pushed by any of them


def test_required_signature_publish_then_promote_verifies(strict, reg, signing_keys):
    ours, other = signing_keys
    ns = f"{reg.host}/strict"
    strict.pass_smoke()
    result = strict.kiln(
        "publish", NAME, "--registry", ns, "--sign", str(ours.private), "--json", registry=reg, **_env()
    )
    assert result.returncode == 0, result.stderr[-3000:]
    digest = validated("publish", result.stdout)["manifest_digest"]
    # promote verifies with the recipe's pinned key (no --key needed) ...
    promoted = strict.kiln(
        "promote", NAME, "--registry", ns, "--from", "experimental", "--to", "stable", "--json", registry=reg
    )
    assert promoted.returncode == 0, promoted.stderr
    assert validated("promote", promoted.stdout)["signature"]["key_fingerprint"] == ours.fingerprint
    # ... and refuses to move a channel to an image that fails verification
    other_image, _ = reg.push_tiny(f"strict/{REPOSITORY}", "experimental")
    refused = strict.kiln("promote", NAME, "--registry", ns, "--from", "experimental", "--to", "stable", registry=reg)
    assert refused.returncode in (12, 82), refused.stderr  # no smoke record for it, or no signature
    strict.pass_smoke(_config_digest(reg, f"strict/{REPOSITORY}", "experimental"))
    refused = strict.kiln("promote", NAME, "--registry", ns, "--from", "experimental", "--to", "stable", registry=reg)
    assert refused.returncode == 82 and other_image in refused.stderr, refused.stderr
    assert reg.manifest(f"strict/{REPOSITORY}", "stable")[0] == digest  # the channel did not move
    wrong = strict.kiln(
        "promote",
        NAME,
        "--registry",
        ns,
        "--from",
        "stable",
        "--to",
        "experimental",
        "--key",
        str(other.public),
        registry=reg,
    )
    assert wrong.returncode == 84, wrong.stderr


def _config_digest(reg, repo: str, tag: str) -> str:
    return reg.manifest(repo, tag)[1]["config"]["digest"]


# -- secrets ------------------------------------------------------------------------------------------------
def _argv_of_tree(pid: int) -> list[str]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            out.append(Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return out


def test_no_secret_in_argv_registry_log_records_or_output(mini, reg, signed, signing_keys):
    """A signed publish watched from outside: the argv of kiln and of every process it
    starts, then the registry's request log and storage, kiln's records and output."""
    ours, _ = signing_keys
    mini.pass_smoke()
    env = {**os.environ, "COLUMNS": "300", **mini.env(reg), **_env()}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiln", "publish", NAME, "--registry", f"{reg.host}/argv", "--sign", str(ours.private)],
        cwd=mini.root,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    seen: list[str] = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            seen.extend(_argv_of_tree(proc.pid))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    out, err = proc.communicate(timeout=900)
    stop.set()
    watcher.join()
    assert proc.returncode == 0, err[-3000:]
    assert any("--sign" in argv for argv in seen)  # the watcher did see the process
    private_pem = ours.private.read_text()
    body_lines = [ln for ln in private_pem.splitlines() if ln and not ln.startswith("-----")]
    from kiln.domain.signing import keys

    key = keys.load_private_key(ours.private, SIGNING_PASSWORD.encode())
    raw = key.pkcs8()
    leaks = [SIGNING_PASSWORD, *body_lines, base64.b64encode(raw).decode(), raw.hex()]
    for argv in seen:
        assert not any(s in argv for s in leaks), argv
    assert not any(s in out + err for s in leaks)
    for run in mini.outputs:
        assert not any(s in run.stdout + run.stderr for s in leaks), run.args
    log = reg.log_text()
    assert not any(s in log for s in leaks)
    for path, data in reg.stored_bytes():
        for s in leaks:
            assert s.encode() not in data, f"secret in registry file {path}"
        assert raw not in data, f"private key bytes in registry file {path}"
    records = list((mini.results / "publish").glob("*.json"))
    signed_records = [json.loads(p.read_text()) for p in records if json.loads(p.read_text()).get("signature")]
    assert signed_records and all(r["signature"]["key_fingerprint"] == ours.fingerprint for r in signed_records)
    for p in records:
        text = p.read_text()
        assert not any(s in text for s in leaks), p
        assert "PRIVATE KEY" not in text and "PUBLIC KEY" not in text  # the fingerprint only
