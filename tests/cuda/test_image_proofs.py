"""What kiln removed from engine-cuda is not needed at run time: proved inside the built
image, on CPU (opt-in: KILN_CUDA_TESTS=1; `nox -s build_cuda` runs these).

  - every ELF file's DT_NEEDED entries resolve inside the image (driver libraries aside);
  - every module of vllm, torch and triton imports (justified failures aside);
  - torch's CUDA libraries dlopen without a GPU;
  - the compilers kept for run-time JIT (Triton's driver module, torch extensions, nvcc)
    compile.
Set KILN_CUDA_ENGINE_IMAGE to an image id to check that image instead of building; set
KILN_CUDA_PROOFS_JSON to a path to get the measured counts (benchmarks/build_cuda.py).
The plain `pip install vllm` anchor (KILN_CUDA_PLAIN_IMAGE, else kiln/vllm-plain:<version>)
is the reference for what upstream itself leaves broken.
"""

from __future__ import annotations

import json
import os

import pytest
from inimage import run_proof
from kiln_testkit.import_allowlist import verdict

pytestmark = [pytest.mark.e2e, pytest.mark.docker]

PACKAGES = ("vllm", "torch", "triton")
_RECORD: dict = {}


@pytest.fixture(scope="module", autouse=True)
def record():
    yield _RECORD
    path = os.environ.get("KILN_CUDA_PROOFS_JSON")
    if path:
        with open(path, "w") as f:
            json.dump(_RECORD, f, indent=1, sort_keys=True)


@pytest.fixture(scope="module")
def engine_id(cuda_build_enabled, docker_daemon) -> str:
    given = os.environ.get("KILN_CUDA_ENGINE_IMAGE")
    if given:
        return docker_daemon.client.images.get(given).id
    from kiln.domain.images.definitions import resolve
    from kiln.usecases.build import build_engine

    engine_image = resolve("glm53-kindling").engine_image
    return build_engine(docker_daemon, engine_image).image_id


@pytest.fixture(scope="module")
def plain_id(cuda_build_enabled, docker_daemon, engine_id) -> str:
    ref = os.environ.get("KILN_CUDA_PLAIN_IMAGE")
    if not ref:
        from kiln.domain.images.definitions import resolve

        ref = f"kiln/vllm-plain:{resolve('glm53-kindling').loaded.recipe.engine.version}"
    image = docker_daemon.image(ref)
    if image is None:
        pytest.skip(f"{ref} (the plain anchor) is not built: nox -s build_cuda builds it")
    return image.id


def _in_site_packages(entry: str) -> str:
    return entry.split("site-packages/", 1)[-1]


def test_every_needed_library_resolves_inside_the_image(docker_daemon, engine_id):
    run = run_proof(docker_daemon, engine_id, "elf_needed.py", "/", user="root")
    assert run.result is not None, run.tail()
    _RECORD["elf"] = run.result
    assert run.result["unresolved"] == [], "\n".join(run.result["unresolved"][:40])
    assert run.status == 0, run.tail()
    assert run.result["counts"]["elf_files"] > 1000  # the venv alone has thousands: a walk that saw few is broken


def test_optional_plugin_gaps_are_the_plain_installs_own(docker_daemon, engine_id, plain_id):
    ours = run_proof(docker_daemon, engine_id, "elf_needed.py", "/", user="root").result
    theirs = run_proof(docker_daemon, plain_id, "elf_needed.py", "/", user="root").result
    assert ours is not None and theirs is not None
    upstream = {_in_site_packages(e) for e in theirs["unresolved"] + theirs["optional_plugins"]}
    _RECORD["elf_plain"] = theirs["counts"]
    assert ours["optional_plugins"], "no optional plugin seen: the allow-list is stale, or the walk is broken"
    assert {_in_site_packages(e) for e in ours["optional_plugins"]} <= upstream


def test_every_module_of_vllm_torch_triton_imports_on_cpu(docker_daemon, engine_id, plain_id):
    run = run_proof(docker_daemon, engine_id, "import_walk.py", *PACKAGES, timeout=3000)
    assert run.result is not None, run.tail()
    failed = sorted(m for p in PACKAGES for m in run.result[p]["failed"])
    # the same modules in the plain image: what fails there too is upstream's state
    ref = run_proof(docker_daemon, plain_id, "import_walk.py", "--only", ",".join(failed), *PACKAGES, timeout=3000)
    assert ref.result is not None, ref.tail()
    report, unexpected = {}, []
    for package in PACKAGES:
        walk = run.result[package]
        v = verdict(package, walk, ref.result[package]["failed"])
        report[package] = {
            "modules": walk["modules"],
            "imported": walk["imported"],
            "programs": len(walk["programs"]),
            "seconds": walk["seconds"],
            "allowed": {why: len(mods) for why, mods in v.allowed.items()},
            "allowed_modules": v.allowed,
            "unexpected": {m: walk["failed"][m] for m in v.unexpected},
        }
        unexpected += [f"{m}: {walk['failed'][m]['type']}: {walk['failed'][m]['message']}" for m in v.unexpected]
    _RECORD["imports"] = report
    assert unexpected == [], "\n".join(unexpected[:60])
    for package in PACKAGES:  # the walk must have imported the bulk of each package
        assert report[package]["imported"] > 0.8 * report[package]["modules"], report[package]


def test_torch_cuda_libraries_dlopen_without_a_gpu(docker_daemon, engine_id):
    run = run_proof(docker_daemon, engine_id, "dlopen_cuda.py")
    assert run.result is not None, run.tail()
    _RECORD["dlopen"] = {k: v for k, v in run.result.items() if k != "loaded"} | {
        "loaded_count": len(run.result["loaded"])
    }
    # libcudnn.so.9 must load and answer (torch links it), whatever else of cuDNN is gone
    assert "nvidia/cudnn/lib/libcudnn.so.9" in run.result["loaded"]
    assert run.result["failed"] == {}, run.result["failed"]
    assert run.result["gpu_visible"] is False  # really without a GPU
    assert len(run.result["loaded"]) > 20 and run.result["cuda"]


def test_runtime_compilers_compile_as_triton_torch_and_nvcc_do(docker_daemon, engine_id):
    run = run_proof(docker_daemon, engine_id, "compilers.py", user="kiln")
    assert run.result is not None, run.tail()
    _RECORD["compilers"] = run.result
    assert run.result["failed"] == {}, run.result["failed"]
    assert set(run.result["ok"]) == {"triton_cuda_utils", "torch_cpp_extension", "nvcc"}


# Libraries kiln removes that nothing lists in DT_NEEDED: cuDNN's shim (libcudnn.so.9)
# dlopens a sub-library when one of the entry points it implements is first called.
REMOVED_BY_SYMBOL = ("nvidia/cudnn/lib/libcudnn_ext.so.9",)
# an entry point torch does import: the walk must find its users (control)
CONTROL_IMPORT = "cudnnGetVersion"


def test_no_file_calls_into_a_removed_cudnn_sub_library(docker_daemon, engine_id, plain_id):
    theirs = run_proof(docker_daemon, plain_id, "removed_symbols.py", "exports", *REMOVED_BY_SYMBOL)
    assert theirs.result is not None and theirs.result["missing"] == [], theirs.tail()
    names = sorted({n for lib in REMOVED_BY_SYMBOL for n in theirs.result["exports"][lib]})
    assert names, "the plain image's sub-libraries export nothing: the reader is broken"
    absent = [a for lib in REMOVED_BY_SYMBOL for a in ("--absent", lib)]
    ours = run_proof(docker_daemon, engine_id, "removed_symbols.py", "users", *absent, *names, user="root")
    control = run_proof(docker_daemon, engine_id, "removed_symbols.py", "users", CONTROL_IMPORT, user="root")
    assert ours.result is not None and control.result is not None, ours.tail() + control.tail()
    _RECORD["removed_symbols"] = {
        "libraries": list(REMOVED_BY_SYMBOL),
        "entry_points": len(names),
        "users": ours.result["users"],
        "control_users": sorted(control.result["users"]),
    }
    assert ours.result["present"] == [], "kiln's image still has them: nothing was removed"
    assert ours.result["users"] == {}, ours.result["users"]
    assert any(p.endswith("torch/lib/libtorch_cuda.so") for p in control.result["users"]), control.result
