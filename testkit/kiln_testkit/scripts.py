"""Load a script (a benchmark) as a module, for the tests of it, without putting its
folder on ``sys.path`` (where its name could shadow another module for every later
import in the session)."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from kiln_testkit.tree import REPO


def load_script(relative: str) -> ModuleType:
    """The script at ``REPO / relative`` as a module named after its file (loaded once;
    registered in ``sys.modules`` because dataclasses resolve their module by name)."""
    path = REPO / relative
    name = f"kiln_script_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
