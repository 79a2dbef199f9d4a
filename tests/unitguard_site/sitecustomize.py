"""Switches the unit tier's guard on in every Python process the unit tests start.

tests/unitguard.py puts this folder first on a child's PYTHONPATH (and sets
KILN_UNIT_GUARD=1); Python imports `sitecustomize` at start-up. Any other
sitecustomize on the path is still imported afterwards.
"""

import importlib
import importlib.util
import os
import sys

if os.environ.get("KILN_UNIT_GUARD") == "1":
    import kiln_unit_guard

    kiln_unit_guard.install()

# chain to the sitecustomize this one shadows, if there is one
_here = os.path.dirname(os.path.abspath(__file__))
_saved_path, _saved_mod = sys.path[:], sys.modules.pop("sitecustomize", None)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
try:
    if importlib.util.find_spec("sitecustomize") is not None:
        importlib.import_module("sitecustomize")
finally:
    sys.path[:] = _saved_path
    if _saved_mod is not None:
        sys.modules["sitecustomize"] = _saved_mod
