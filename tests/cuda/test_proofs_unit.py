"""The in-image proofs (tests/cuda/proofs/) can fail: fed fake trees with a missing
DT_NEEDED, a broken module or an unloadable library, they say so (CI: no image needed)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from kiln_testkit import import_allowlist

# the proofs run inside images as one plain folder of scripts, so they import each other by name
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "proofs"))

import dlopen_cuda  # noqa: E402
import elf_needed  # noqa: E402
import removed_symbols  # noqa: E402

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to make ELF files")


def _gcc(*args: str) -> None:
    subprocess.run(["gcc", *args], check=True, capture_output=True)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A root with libfoo.so (in /opt/app/lib) and a program that needs it via $ORIGIN
    (/opt/app/bin/prog) plus libc (from the host's loader search, copied in)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "foo.c").write_text("int foo(void) { return 7; }\n")
    (src / "prog.c").write_text("int foo(void);\nint main(void) { return foo(); }\n")
    root = tmp_path / "root"
    (root / "opt/app/lib").mkdir(parents=True)
    (root / "opt/app/bin").mkdir(parents=True)
    _gcc("-shared", "-fPIC", "-Wl,-soname,libfoo.so", "-o", str(root / "opt/app/lib/libfoo.so"), str(src / "foo.c"))
    _gcc(
        "-o",
        str(root / "opt/app/bin/prog"),
        str(src / "prog.c"),
        f"-L{root}/opt/app/lib",
        "-lfoo",
        "-Wl,--enable-new-dtags,-rpath,$ORIGIN/../lib",
    )
    needed = elf_needed.read_dynamic(str(root / "opt/app/bin/prog")).needed
    libdir = root / "usr/lib/x86_64-linux-gnu"
    libdir.mkdir(parents=True)
    for name in needed:
        if name != "libfoo.so":
            (libdir / name).write_bytes(b"")  # resolution only looks for the file
    return root


@needs_gcc
def test_a_complete_tree_resolves_through_runpath(tree: Path):
    result = elf_needed.prove(str(tree), ["/"])
    assert result["unresolved"] == []
    assert result["counts"]["elf_files"] == 2
    assert result["counts"]["by_search_path"] == result["counts"]["needed_entries"] >= 2


@needs_gcc
def test_a_missing_needed_library_is_reported_and_fails_the_exit_status(tree: Path, capsys):
    (tree / "opt/app/lib/libfoo.so").unlink()
    result = elf_needed.prove(str(tree), ["/"])
    assert result["unresolved"] == ["/opt/app/bin/prog: libfoo.so"]
    assert elf_needed.main(["--root", str(tree), "/"]) == 1
    assert "unresolved: /opt/app/bin/prog: libfoo.so" in capsys.readouterr().out


@needs_gcc
def test_a_library_found_only_by_soname_elsewhere_counts_as_preloaded(tree: Path):
    # moved out of the run path: only a loaded copy (as `import torch` loads libtorch) can satisfy it
    shutil.move(tree / "opt/app/lib/libfoo.so", tree / "opt/libfoo.so")
    result = elf_needed.prove(str(tree), ["/"])
    assert result["unresolved"] == []
    assert result["counts"]["by_soname_preloaded"] == 1
    assert result["preloaded"] == {"libfoo.so": "/opt/libfoo.so"}


@needs_gcc
def test_only_driver_libraries_are_allowed_missing(tmp_path: Path, tree: Path):
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "c.c").write_text("int cuInit(unsigned f) { return f; }\n")
    (stub / "user.c").write_text("int cuInit(unsigned f);\nint start(void) { return cuInit(0); }\n")
    _gcc("-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stub / "libcuda.so.1"), str(stub / "c.c"))
    _gcc(
        "-shared",
        "-fPIC",
        "-o",
        str(tree / "opt/app/lib/libuses_driver.so"),
        str(stub / "user.c"),
        f"-L{stub}",
        "-Wl,--no-as-needed",
        "-l:libcuda.so.1",
    )
    result = elf_needed.prove(str(tree), ["/"])
    assert result["unresolved"] == []
    assert result["counts"]["driver"] == 1
    assert "libcuda.so.1" in result["driver"]
    # the same library under another name is no driver library: unresolved
    _gcc("-shared", "-fPIC", "-Wl,-soname,libcudb.so.1", "-o", str(stub / "libcudb.so.1"), str(stub / "c.c"))
    _gcc(
        "-shared",
        "-fPIC",
        "-o",
        str(tree / "opt/app/lib/libuses_other.so"),
        str(stub / "user.c"),
        f"-L{stub}",
        "-Wl,--no-as-needed",
        "-l:libcudb.so.1",
    )
    assert elf_needed.prove(str(tree), ["/"])["unresolved"] == ["/opt/app/lib/libuses_other.so: libcudb.so.1"]


def test_non_elf_and_empty_trees_prove_nothing(tmp_path: Path):
    (tmp_path / "notes.so").write_text("not an ELF file")
    assert elf_needed.read_dynamic(str(tmp_path / "notes.so")) is None
    # no ELF file at all must not pass: a walk that found nothing proved nothing
    assert elf_needed.main(["--root", str(tmp_path), "/"]) == 1


def test_import_walk_reports_broken_modules_and_still_walks_their_children(tmp_path: Path):
    pkg = tmp_path / "fakepkg"
    (pkg / "broken").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "good.py").write_text("X = 1\n")
    (pkg / "needs_gone.py").write_text("import kiln_removed_dependency\n")
    (pkg / "broken" / "__init__.py").write_text("raise RuntimeError('no GPU here')\n")
    (pkg / "broken" / "child.py").write_text("Y = 2\n")
    (pkg / "__main__.py").write_text("raise SystemExit('a program, not a module')\n")
    proc = subprocess.run(
        [sys.executable, str(HERE / "proofs" / "import_walk.py"), "--json", "fakepkg"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path)},
        check=False,
    )
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("KILN-PROOF "))
    walk = json.loads(line.removeprefix("KILN-PROOF "))["fakepkg"]
    assert walk["modules"] == 6 and walk["programs"] == ["fakepkg.__main__"]
    assert walk["failed"]["fakepkg.needs_gone"]["missing"] == "kiln_removed_dependency"
    assert walk["failed"]["fakepkg.broken"]["type"] == "RuntimeError"
    # importing the child imports its parent first: it fails too, and is listed, not hidden
    assert set(walk["failed"]) == {"fakepkg.needs_gone", "fakepkg.broken", "fakepkg.broken.child"}
    verdict = import_allowlist.verdict("fakepkg", walk)
    assert sorted(verdict.unexpected) == ["fakepkg.broken", "fakepkg.broken.child", "fakepkg.needs_gone"]
    only = subprocess.run(
        [
            sys.executable,
            str(HERE / "proofs" / "import_walk.py"),
            "--json",
            "--only",
            "fakepkg.good,fakepkg.broken",
            "fakepkg",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path)},
        check=False,
    )
    line = next(ln for ln in only.stdout.splitlines() if ln.startswith("KILN-PROOF "))
    assert json.loads(line.removeprefix("KILN-PROOF "))["fakepkg"]["modules"] == 2


def _fail(kind: str, message: str = "", missing: str | None = None) -> dict:
    return {"type": kind, "message": message, "missing": missing, "where": ""}


def test_the_allow_list_accepts_only_the_failure_it_names():
    rule = import_allowlist.ALLOWED[0]
    module = rule.example
    walk = {
        "failed": {
            module: _fail("ModuleNotFoundError", f"No module named '{rule.example_missing}'", rule.example_missing),
            "vllm.other": _fail("ImportError", "boom"),
        }
    }
    verdict = import_allowlist.verdict("vllm", walk)
    assert verdict.unexpected == ["vllm.other"]
    assert verdict.allowed == {rule.why: [module]}
    # the same module failing for another reason is not covered by the rule
    walk["failed"][module] = _fail("RuntimeError", "CUDA error")
    assert module in import_allowlist.verdict("vllm", walk).unexpected


def test_a_failure_is_upstreams_only_if_the_plain_image_fails_the_same_way():
    walk = {
        "failed": {
            "vllm.a": _fail("ModuleNotFoundError", "No module named 'lmcache'", "lmcache"),
            "vllm.b": _fail("ImportError", "libcuda.so.1: cannot open shared object file"),
            "vllm.c": _fail("ModuleNotFoundError", "No module named 'kiln_removed'", "kiln_removed"),
            "vllm.d": _fail("AttributeError", "no attribute 'x'"),
        }
    }
    plain = {
        "vllm.a": walk["failed"]["vllm.a"],
        "vllm.b": walk["failed"]["vllm.b"],
        "vllm.d": _fail("ImportError", "something else"),
    }  # c imports there; d fails otherwise
    v = import_allowlist.verdict("vllm", walk, plain)
    assert v.unexpected == ["vllm.c", "vllm.d"]
    kinds = {why.split(": ", 1)[1]: mods for why, mods in v.allowed.items()}
    assert kinds == {
        "optional dependency not installed: lmcache": ["vllm.a"],
        "needs the GPU driver (libcuda.so.1) at import": ["vllm.b"],
    }


def test_the_serving_path_must_import_whatever_the_plain_image_does():
    module = import_allowlist.MUST_IMPORT[0]
    failure = _fail("ModuleNotFoundError", "No module named 'cv2'", "cv2")
    v = import_allowlist.verdict("vllm", {"failed": {module: failure}}, {module: failure})
    assert v.unexpected == [module]


def test_dlopen_reports_a_library_that_cannot_load(tmp_path: Path):
    bad = tmp_path / "nvidia" / "fake" / "lib" / "libbroken.so.1"
    bad.parent.mkdir(parents=True)
    bad.write_text("not a library")
    good = tmp_path / "torch" / "lib" / "libz.so.1"
    good.parent.mkdir(parents=True)
    shutil.copy(_host_lib("libz.so.1"), good)
    out = dlopen_cuda.load_all(dlopen_cuda.libraries(str(tmp_path)), str(tmp_path))
    assert out["loaded"] == ["torch/lib/libz.so.1"]
    assert list(out["failed"]) == ["nvidia/fake/lib/libbroken.so.1"]
    assert out["driver_only"] == {}


def _host_lib(name: str) -> str:
    for d in elf_needed.ld_conf_dirs("/") + elf_needed.DEFAULT_DIRS:
        if (Path(d) / name).exists():
            return str(Path(d) / name)
    pytest.skip(f"no {name} on this host")


@needs_gcc
def test_optional_plugins_are_allowed_only_under_their_own_path(tmp_path: Path, tree: Path):
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "m.c").write_text("int mlx5dv_query(void) { return 0; }\n")
    (stub / "user.c").write_text("int mlx5dv_query(void);\nint go(void) { return mlx5dv_query(); }\n")
    _gcc("-shared", "-fPIC", "-Wl,-soname,libmlx5.so.1", "-o", str(stub / "libmlx5.so.1"), str(stub / "m.c"))
    plugin = tree / "opt/venv/nvidia/nvshmem/lib/nvshmem_transport_ibgda.so.3"
    plugin.parent.mkdir(parents=True)
    for target in (plugin, tree / "opt/app/lib/libnot_a_plugin.so"):
        _gcc(
            "-shared",
            "-fPIC",
            "-o",
            str(target),
            str(stub / "user.c"),
            f"-L{stub}",
            "-Wl,--no-as-needed",
            "-l:libmlx5.so.1",
        )
    result = elf_needed.prove(str(tree), ["/"])
    assert result["optional_plugins"] == ["/opt/venv/nvidia/nvshmem/lib/nvshmem_transport_ibgda.so.3: libmlx5.so.1"]
    assert result["unresolved"] == ["/opt/app/lib/libnot_a_plugin.so: libmlx5.so.1"]


@needs_gcc
def test_removed_symbols_finds_the_callers_of_a_library(tmp_path: Path):
    (tmp_path / "sub.c").write_text("int sub_entry(void) { return 1; }\nint sub_other(void) { return 2; }\n")
    (tmp_path / "app.c").write_text("int sub_entry(void);\nint main(void) { return sub_entry(); }\n")
    lib = tmp_path / "site/libsub.so"
    lib.parent.mkdir()
    _gcc("-shared", "-fPIC", "-o", str(lib), str(tmp_path / "sub.c"))
    root = tmp_path / "root"
    root.mkdir()
    _gcc("-o", str(root / "app"), str(tmp_path / "app.c"), f"-L{lib.parent}", "-lsub")
    (root / "notes.txt").write_text("sub_entry\n")  # not ELF: never a caller

    found = removed_symbols.exports(str(lib.parent), ["libsub.so", "libgone.so"])
    assert {"sub_entry", "sub_other"} <= set(found["exports"]["libsub.so"])
    assert found["missing"] == ["libgone.so"]
    assert removed_symbols.users(str(root), {"sub_entry", "sub_other"}) == {str(root / "app"): ["sub_entry"]}
    assert removed_symbols.users(str(root), {"sub_other"}) == {}


def test_only_the_images_own_machine_counts_as_elf(tree, monkeypatch):
    """The proofs run in the image, under qemu for arm64: an aarch64 image's ELF files are
    the loader's, an x86-64 file there is data (and the other way round)."""
    prog = str(tree / "opt/app/bin/prog")  # built by the host's gcc: x86-64
    assert elf_needed.read_dynamic(prog) is not None
    monkeypatch.setattr(elf_needed, "NATIVE_EM", elf_needed.MACHINES["aarch64"][0])
    assert elf_needed.read_dynamic(prog) is None
    assert elf_needed.prove(str(tree), ["/"])["counts"]["elf_files"] == 0
