"""kiln.inimage: every file in it runs alone inside an image, so at module level it imports
the standard library only (kiln itself is forbidden by the import contract; third-party
packages are checked here). Inside a function, the launch probe may import what it
probes: the engine image's own vLLM, torch, pydantic and kiln-engine. `source()` is the
one way its files are shipped."""

import ast
import hashlib
import json
import sys
from pathlib import PurePosixPath
from types import SimpleNamespace

import pytest

from kiln import inimage
from kiln.domain.imagecheck import launch_arg_check
from kiln.domain.images import engine_image
from kiln.domain.supplychain import sbom

STDLIB = set(sys.stdlib_module_names) | {"__future__"}
ENGINE = {"vllm", "torch", "pydantic", "kiln_engine"}  # in every engine image


def _names(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name.split(".")[0] for alias in node.names}
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return {node.module.split(".")[0]}
    return set()


def _module_level(tree: ast.Module):
    """Statements run on import, also those under a module-level `if` or `try`."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If | ast.Try):
            todo.extend(ast.iter_child_nodes(node))


def _imports(path) -> tuple[set[str], set[str]]:
    """(module-level imports, imports inside functions)"""
    tree = ast.parse(path.read_text(), filename=str(path))
    top = {name for node in _module_level(tree) for name in _names(node)}
    inner = {
        name
        for fn in ast.walk(tree)
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
        for node in ast.walk(fn)
        for name in _names(node)
    }
    return top, inner


def _files():
    return sorted(inimage.source("hf_cache").parent.glob("*.py"))


@pytest.mark.parametrize("path", _files(), ids=lambda p: p.name)
def test_standard_library_only(path):
    top, inner = _imports(path)
    # a sibling, by the name an engine build ships it under (the applier's parser: kiln_patchformat.py)
    siblings = {
        PurePosixPath(arc).stem
        for arc in (
            engine_image.PATCHER_ARC,
            engine_image._PATCHTREE_ARC,
            engine_image._PATCHFORMAT_ARC,
            engine_image._HFCACHE_ARC,
        )
    }
    assert top - STDLIB - siblings == set()
    assert inner - STDLIB - ENGINE == set()


def test_the_check_sees_a_third_party_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import json\nimport vllm\nif json:\n    import requests\n"
        "def f():\n    from yaml import safe_load\n    import torch\n"
    )
    top, inner = _imports(bad)
    assert top - STDLIB == {"vllm", "requests"}
    assert inner - STDLIB - ENGINE == {"yaml"}


def test_source_names_the_shipped_files():
    assert {p.stem for p in _files()} >= {
        "patch_applier",
        "patch_tree",
        "patch_format",
        "hf_cache",
        "launch_arg_probe",
        "launch_arg_vllm",
        "sbom_reader",
    }
    assert inimage.script("launch_arg_vllm", "launch_arg_probe") == launch_arg_check._PROBE
    assert sbom._inimage_script() == inimage.source("sbom_reader").read_text(encoding="utf-8")
    with pytest.raises(FileNotFoundError, match=r"kiln.inimage has no module 'nope'"):
        inimage.source("nope")


_FUTURE = "from __future__ import annotations\n"


def test_the_launch_probe_is_one_script_of_its_modules_in_order():
    """Sent as one `python -c` text: vLLM's checks, then the entry point with its
    `__future__` line left out (only the first may have one, and it covers the whole text).
    That text is valid Python and its digest is what the answer cache keys on."""
    vllm_part = inimage.source("launch_arg_vllm").read_text()
    entry = inimage.source("launch_arg_probe").read_text()
    text = launch_arg_check._PROBE
    assert _FUTURE in vllm_part and _FUTURE in entry
    assert text == vllm_part + "\n" + entry.replace(_FUTURE, "", 1)
    assert text.count(_FUTURE) == 1
    compile(text, "<launch probe>", "exec")
    assert hashlib.sha256(text.encode()).hexdigest() == launch_arg_check._PROBE_DIGEST


def test_the_launch_probe_sends_the_text_its_cache_keys_on():
    sent = []

    def run_script(image_id, script, **kw):
        sent.append(script)
        return {"version": None, "kiln_engine": None, "jobs": []}

    docker = SimpleNamespace(run_script=run_script)
    launch_arg_check._probe(docker, "sha256:" + "a" * 64, dump=True, jobs=[])
    assert [hashlib.sha256(s.encode()).hexdigest() for s in sent] == [launch_arg_check._PROBE_DIGEST]
    job = launch_arg_check.Job(parts=(), env={})
    key = json.dumps({"probe": launch_arg_check._PROBE_DIGEST, "job": job.request()}, sort_keys=True)
    assert job.digest == hashlib.sha256(key.encode()).hexdigest()


def _top_level_names(path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in _module_level(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def test_the_launch_probe_modules_bind_no_name_twice():
    """One namespace in the script: a name bound by both modules would be the second's there
    and each module's own on the host."""
    assert (
        _top_level_names(inimage.source("launch_arg_vllm")) & _top_level_names(inimage.source("launch_arg_probe"))
        == set()
    )


def test_a_script_needs_each_module_future_line_once():
    with pytest.raises(ValueError, match=r"kiln.inimage.__init__: needs `from __future__ import annotations` once"):
        inimage.script("launch_arg_probe", "__init__")
