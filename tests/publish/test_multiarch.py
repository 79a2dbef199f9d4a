"""Multi-platform publishing against a real registry on 127.0.0.1 with the real daemon:
one recipe declared for linux/amd64 and linux/arm64, both images built (FROM scratch,
so no emulation is needed), `kiln publish` pushes an OCI image index holding both under
the same tags, and `docker pull --platform` of the tag gets each platform's own image
(the image id that was pushed, its Architecture). Promote moves the index; a platform
without a passing smoke record keeps the index from being written at all.

The images stand in for `kiln build NAME --platform P` (which runs the engine probes
inside the image, so an arm64 build needs qemu: the opt-in `arm64` nox session); they
carry the labels and tags a build gives them, computed by kiln itself."""

from __future__ import annotations

import json
import subprocess

import pytest
from clijson import validated
from kilntest import passing_smoke_record, remove_images, renamed_mini, run_kiln
from pubtest import PUBLISH_SECTION

pytestmark = [pytest.mark.docker, pytest.mark.registry]

NAME = "kiln-test-multiarch"
REPOSITORY = "kiln-test/multiarch"
PLATFORMS = ("linux/amd64", "linux/arm64")
INDEX = "application/vnd.oci.image.index.v1+json"


@pytest.fixture(scope="module")
def tree(tmp_path_factory, docker_daemon):
    """A kiln tree whose recipe declares both platforms, and an image 'built' for each."""
    from kiln.basics import paths
    from kiln.domain.images.build_context import BuildContext
    from kiln.domain.images.definitions import resolve
    from kiln.domain.images.image_naming import LABEL_NS, _platform_labels
    from kiln.domain.reproducible.normalise_image import make_reproducible
    from kiln.domain.reproducible.source_date import rfc3339

    tmp = tmp_path_factory.mktemp("multiarch")
    root = renamed_mini(
        tmp / "tree",
        NAME,
        PUBLISH_SECTION.replace("kiln-test/mini", REPOSITORY),
        replace={"  flavour: cpu\n": "  flavour: cpu\n  platforms: [linux/amd64, linux/arm64]\n"},
    )
    (tmp / "docker-config").mkdir()
    images = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KILN_ROOT", str(root))
        mp.setenv("KILN_RESULTS_DIR", str(tmp / "results"))
        paths.repo_root.cache_clear()
        for plat in PLATFORMS:
            ri = resolve(NAME, platform=plat).recipe_image
            ctx = BuildContext()
            ctx.add_bytes("Dockerfile", b"FROM scratch\nCOPY payload.txt /payload.txt\n")
            ctx.add_bytes("payload.txt", f"{NAME} for {plat}\n".encode())
            epoch = ri.source_date.epoch
            built = docker_daemon.build(
                ctx,
                label=f"{NAME} {plat}",
                platform=plat,
                quiet=True,
                labels={
                    f"{LABEL_NS}.input-digest": ri.digest,
                    **_platform_labels(plat),
                    "org.opencontainers.image.created": rfc3339(epoch),
                },
            )
            # normalised as kiln build leaves it: kiln trusts no other image for its inputs
            norm = make_reproducible(docker_daemon, built.image_id, epoch, label=f"{NAME} {plat}")
            docker_daemon.tag(norm.image_id, ri.tag)
            images[plat] = (norm.image_id, ri.tag, ri.digest)
        yield {"root": root, "results": tmp / "results", "config": tmp / "docker-config", "images": images}
    paths.repo_root.cache_clear()
    remove_images(docker_daemon, f"kiln/{NAME}")


def _env(tree, registry) -> dict[str, str]:
    return {
        "KILN_ROOT": str(tree["root"]),
        "KILN_RESULTS_DIR": str(tree["results"]),
        "DOCKER_CONFIG": str(tree["config"]),
        **registry.env(),
    }


def _kiln(tree, registry, *args):
    return run_kiln(*args, env=_env(tree, registry), cwd=tree["root"])


def _smoke(tree, plat, passed=True):
    from kiln.infra.records import record_path, write_smoke_record

    image_id = tree["images"][plat][0]
    if passed:
        write_smoke_record(passing_smoke_record(image_id, NAME, platform=plat, note="written by the multiarch test"))
    else:
        record_path(image_id).unlink(missing_ok=True)


def _docker(tree, *args, input=None):  # as subprocess.run names it  # noqa: A002
    return subprocess.run(
        ["docker", *args],
        capture_output=True,
        text=True,
        input=input,
        timeout=300,
        env={"DOCKER_CONFIG": str(tree["config"]), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        check=False,
    )


def test_an_unsmoked_platform_cannot_enter_the_index(tree, registry, monkeypatch):
    monkeypatch.setenv("KILN_RESULTS_DIR", str(tree["results"]))
    _smoke(tree, "linux/amd64")
    _smoke(tree, "linux/arm64", passed=False)
    result = _kiln(tree, registry, "publish", NAME, "--registry", f"{registry.host}/refused")
    assert result.returncode == 12, result.stderr
    assert "linux/arm64" in result.stderr and "cannot enter the index" in result.stderr
    assert registry.tags(f"refused/{REPOSITORY}") == []  # nothing pushed


def test_publish_pushes_one_index_and_each_platform_pulls_its_own(tree, registry, monkeypatch, docker_daemon):
    monkeypatch.setenv("KILN_RESULTS_DIR", str(tree["results"]))
    for plat in PLATFORMS:
        _smoke(tree, plat)
    result = _kiln(tree, registry, "publish", NAME, "--registry", registry.host, "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    doc = validated("publish", result.stdout)
    digest = doc["manifest_digest"]
    assert set(doc["platforms"]) == set(PLATFORMS)

    # every consumer tag is the index, holding both platforms' manifests by digest
    short = doc["input_digest"].split(":")[1][:12]
    engine_tag = f"vllm-0.0.1.dev0-{NAME}"
    for tag in (engine_tag, "experimental", short):
        got, index = _raw_manifest(registry, tag)
        assert got == digest, tag
        assert index["mediaType"] == INDEX
        entries = {f"{m['platform']['os']}/{m['platform']['architecture']}": m["digest"] for m in index["manifests"]}
        assert entries == {p: doc["platforms"][p]["manifest_digest"] for p in PLATFORMS}
    for plat in PLATFORMS:
        _, child = _raw_manifest(registry, doc["platforms"][plat]["manifest_digest"])
        assert child["config"]["digest"] == tree["images"][plat][0]  # exactly the image smoke-tested

    # a real pull per platform: the daemon resolves the index to that platform's image
    login = _docker(tree, "login", "-u", registry.user, "--password-stdin", registry.host, input=registry.password)
    assert login.returncode == 0, login.stderr
    ref = f"{registry.host}/{REPOSITORY}:experimental"
    for image_id, _, _ in tree["images"].values():  # the pulls must come from the registry
        _docker(tree, "rmi", "-f", image_id)
    try:
        for plat in ("linux/arm64", "linux/amd64"):
            pulled = _docker(tree, "pull", "--platform", plat, ref)
            assert pulled.returncode == 0, pulled.stderr
            inspect = _docker(tree, "image", "inspect", "-f", "{{.Id}} {{.Os}}/{{.Architecture}}", ref)
            assert inspect.stdout.split() == [tree["images"][plat][0], plat], inspect.stdout
            # the pulled image is the built one (same id, labels): it gets its local tag back
            assert _docker(tree, "tag", ref, tree["images"][plat][1]).returncode == 0
            _docker(tree, "rmi", ref)
    finally:
        _docker(tree, "logout", registry.host)

    # the record: per platform, what went in; the index is what `kiln render k8s` pins
    record = json.loads(max((tree["results"] / "publish").glob(f"{NAME}-publish-*.json")).read_text())
    assert record["manifest_digest"] == digest
    assert {p: v["image_id"] for p, v in record["platforms"].items()} == {p: v[0] for p, v in tree["images"].items()}


def test_promote_moves_the_index(tree, registry, monkeypatch):
    monkeypatch.setenv("KILN_RESULTS_DIR", str(tree["results"]))
    got, _ = _raw_manifest(registry, "experimental")
    _smoke(tree, "linux/arm64", passed=False)
    refused = _kiln(
        tree, registry, "promote", NAME, "--registry", registry.host, "--from", "experimental", "--to", "stable"
    )
    assert refused.returncode == 12, refused.stderr
    assert "linux/arm64" in refused.stderr
    assert "stable" not in registry.tags(REPOSITORY)
    _smoke(tree, "linux/arm64")
    moved = _kiln(
        tree, registry, "promote", NAME, "--registry", registry.host, "--from", "experimental", "--to", "stable"
    )
    assert moved.returncode == 0, moved.stderr
    assert _raw_manifest(registry, "stable")[0] == got


def _raw_manifest(registry, ref: str, repository: str = REPOSITORY) -> tuple[str, dict]:
    import hashlib

    import requests

    resp = requests.get(
        f"http://{registry.host}/v2/{repository}/manifests/{ref}",
        auth=registry.auth,
        timeout=10,
        headers={
            "Accept": f"{INDEX}, application/vnd.oci.image.manifest.v1+json, "
            "application/vnd.docker.distribution.manifest.v2+json"
        },
    )
    resp.raise_for_status()
    return "sha256:" + hashlib.sha256(resp.content).hexdigest(), resp.json()


def test_signed_index_publish_signs_the_index_and_each_platform_with_its_own_sbom(
    tree, registry, monkeypatch, tmp_path
):
    """--sign on a multi-platform publish: the index digest (what the tags point at) and
    each platform's image are signed and attested, each image with the SBOM read from
    that image, all verified from the registry before the tags; `kiln verify REPO:TAG`
    (the real CLI) checks the index and every platform. The SBOM reader itself is not
    under test here (a FROM-scratch image has no Python for it), so the SBOM is a minimal
    CycloneDX document naming the image it was read from; the provenance, signing and
    verification are real."""
    from kiln.basics import paths
    from kiln.domain.recipes.resolved import resolve_recipe
    from kiln.domain.signing import keys
    from kiln.domain.supplychain import attest
    from kiln.infra.credentials import Credentials
    from kiln.infra.docker import DockerDaemon
    from kiln.usecases import publish

    pair = keys.write_key_pair(tmp_path / "team", b"team-pw")
    monkeypatch.setenv("KILN_SIGNING_PASSWORD", "team-pw")
    monkeypatch.setenv("KILN_ROOT", str(tree["root"]))
    monkeypatch.setenv("KILN_RESULTS_DIR", str(tree["results"]))
    monkeypatch.setattr(
        attest,
        "build_sbom",
        lambda docker, loaded, image: {
            "bomFormat": "CycloneDX",
            "specVersion": "1.6",
            "version": 1,
            "components": [],
            "metadata": {"component": {"type": "container", "name": image.id}},
        },
    )
    paths.repo_root.cache_clear()
    for plat in PLATFORMS:
        _smoke(tree, plat)
    ns = f"{registry.host}/signed"
    try:
        result = publish.publish(
            resolve_recipe(NAME),
            registry=ns,
            creds=Credentials(registry.user, registry.password, "test"),
            docker=DockerDaemon(),
            sign_key=pair.private,
        )
    finally:
        paths.repo_root.cache_clear()
    tags = registry.tags(f"signed/{REPOSITORY}")
    for digest in [result.manifest_digest] + [e["manifest_digest"] for e in result.platforms.values()]:
        hex_ = digest.split(":")[1]
        assert f"sha256-{hex_}.sig" in tags and f"sha256-{hex_}.att" in tags, digest
    assert result.signature and result.signature["verified"] is True
    assert {p: e["signature"]["verified"] for p, e in result.platforms.items()} == dict.fromkeys(PLATFORMS, True)
    got, index = _raw_manifest(registry, "experimental", repository=f"signed/{REPOSITORY}")
    assert got == result.manifest_digest and index["mediaType"] == INDEX
    verified = run_kiln(
        "verify",
        f"{ns}/{REPOSITORY}:experimental",
        "--key",
        str(pair.public),
        "--json",
        env={**_env(tree, registry)},
        cwd=tree["root"],
    )
    assert verified.returncode == 0, verified.stderr
    doc = validated("verify", verified.stdout)
    assert doc["digest"] == result.manifest_digest
    assert {p: v["digest"] for p, v in doc["platforms"].items()} == {
        p: e["manifest_digest"] for p, e in result.platforms.items()
    }
    for plat, checked in doc["platforms"].items():
        assert [a["verified"] for a in checked["attestations"]] == [True, True], plat
        sbom = _attested_sbom(registry, f"signed/{REPOSITORY}", checked["digest"])
        assert sbom["metadata"]["component"]["name"] == tree["images"][plat][0], plat  # its own image's SBOM


def _attested_sbom(registry, repository: str, digest: str) -> dict:
    """The CycloneDX predicate of the SBOM attestation attached to `digest`."""
    import base64

    import requests

    _, att = _raw_manifest(registry, f"sha256-{digest.split(':')[1]}.att", repository=repository)
    for layer in att["layers"]:
        blob = requests.get(
            f"http://{registry.host}/v2/{repository}/blobs/{layer['digest']}", auth=registry.auth, timeout=10
        )
        statement = json.loads(base64.b64decode(json.loads(blob.content)["payload"]))
        if statement["predicateType"] == "https://cyclonedx.org/bom":
            assert statement["subject"][0]["digest"]["sha256"] == digest.split(":")[1]
            return statement["predicate"]
    raise AssertionError(f"no CycloneDX attestation on {digest}")


def test_a_signed_index_whose_platform_image_is_unsigned_fails_verify_naming_it(tree, registry, monkeypatch, tmp_path):
    """An index signed on its own (as a signer that knows nothing of its images would) is
    not verified: each platform's image must carry a signature of its own."""
    from kiln.basics import paths
    from kiln.domain.recipes.resolved import resolve_recipe
    from kiln.domain.signing import keys, signatures
    from kiln.infra.credentials import Credentials
    from kiln.infra.docker import DockerDaemon
    from kiln.infra.registry import RegistryClient, Target
    from kiln.usecases import publish

    pair = keys.write_key_pair(tmp_path / "team", b"team-pw")
    monkeypatch.setenv("KILN_ROOT", str(tree["root"]))
    monkeypatch.setenv("KILN_RESULTS_DIR", str(tree["results"]))
    paths.repo_root.cache_clear()
    for plat in PLATFORMS:
        _smoke(tree, plat)
    ns = f"{registry.host}/indexonly"
    creds = Credentials(registry.user, registry.password, "test")
    try:
        result = publish.publish(resolve_recipe(NAME), registry=ns, creds=creds, docker=DockerDaemon())
    finally:
        paths.repo_root.cache_clear()
    client = RegistryClient(Target(registry.host, f"indexonly/{REPOSITORY}", plain_http=True), creds)
    signatures.sign_image(
        client, result.manifest_digest, keys.load_private_key(pair.private, b"team-pw"), [], creator="the test"
    )
    verified = run_kiln(
        "verify",
        f"{ns}/{REPOSITORY}:experimental",
        "--key",
        str(pair.public),
        "--signature-only",
        env={**_env(tree, registry)},
        cwd=tree["root"],
    )
    assert verified.returncode == 82, verified.stderr
    errors = [ln for ln in verified.stderr.splitlines() if ln.startswith("kiln: error:")]
    assert len(errors) == 1 and errors[0].startswith(
        f"kiln: error: linux/amd64 image of index {result.manifest_digest}: sha256:"
    ), errors
    assert "is not signed" in errors[0]
