"""The vLLM general plugin: runs once in every vLLM process before models load.

It makes our feature modules importable where patched vLLM code expects them, routes
our features' loggers to vLLM's log handler (in vLLM's processes the ``kiln_engine``
logger has none, so its lines would be dropped), logs one line naming the kiln-engine
version and each feature's state, and refuses unsafe feature combinations before any
request is served. Features come from the registry (features.py); none is named here.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys

from . import __version__
from .features import FEATURES, Feature, check_environment, states

_logger = logging.getLogger("vllm.kiln_engine")
_done = False


def _alias(feature: Feature) -> None:
    """Expose our module under the vLLM module name the patched runner imports."""
    if feature.vllm_module in sys.modules:
        return
    try:
        sys.modules[feature.vllm_module] = importlib.import_module(feature.module)
    except ImportError as exc:  # feature code missing its deps (e.g. no triton on CPU)
        if feature.enabled():
            raise
        _logger.debug("kiln-engine: %s not importable here: %s", feature.module, exc)


def _route_logs() -> None:
    """Send ``kiln_engine.*`` records where vLLM's own go (its handler and format, on
    stdout, so `docker logs` shows them); a plain stdout handler if vLLM has none
    (VLLM_CONFIGURE_LOGGING=0)."""
    ours = logging.getLogger("kiln_engine")
    if ours.handlers:
        return
    handlers = logging.getLogger("vllm").handlers
    if not handlers:
        fallback = logging.StreamHandler(sys.stdout)
        fallback.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(name)s] %(message)s"))
        handlers = [fallback]
    for handler in handlers:
        ours.addHandler(handler)
    ours.setLevel(logging.INFO)
    # some vLLM processes also give the root logger a handler: print each line once
    ours.propagate = False


def status_line() -> str:
    """The log line that says kiln-engine loaded: its version, the process and each feature's state."""
    feats = " ".join(f"{name}={'on' if on else 'off'}" for name, on in states().items())
    return f"kiln-engine {__version__} loaded (pid {os.getpid()}): features: {feats}"


def register() -> None:
    """vLLM's plugin entry point: route logs, check the environment and alias each feature's module, once a process."""
    global _done
    if _done:
        return
    _done = True
    _route_logs()
    check_environment()
    for feature in FEATURES:
        _alias(feature)
    _logger.info(status_line())
    # vLLM's logger may not be configured in every process yet; make the line visible
    if not logging.getLogger("vllm").handlers and not _logger.handlers:
        print(status_line(), file=sys.stderr, flush=True)
