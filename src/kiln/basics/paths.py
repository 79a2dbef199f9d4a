"""Where kiln finds its recipes, engine sources, caches and records.

The checkout (recipes, Dockerfiles, engine sources) is $KILN_ROOT or the nearest parent
of the working directory that holds one; never a guess. Records (smoke passes, publish
results) are per user, not per checkout, so `kiln publish` run from another clone still
sees what `kiln smoke` proved: $KILN_STATE_DIR, else $XDG_STATE_HOME/kiln, else
~/.local/state/kiln ($KILN_RESULTS_DIR, the older name, still wins over all three).
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

from kiln.basics.errors import NotACheckout

_MARKERS = ("recipes", "docker-images", "engine")


def _is_checkout(path: Path) -> bool:
    return all((path / m).is_dir() for m in _MARKERS)


@cache
def repo_root() -> Path:
    """The kiln checkout: $KILN_ROOT, else the nearest parent of cwd holding recipes/,
    docker-images/ and engine/. Anything else is NotACheckout: silently using the
    checkout kiln was installed from would build and record against the wrong tree."""
    env = os.environ.get("KILN_ROOT")
    if env:
        root = Path(env).resolve()
        if not _is_checkout(root):
            raise NotACheckout(
                f"KILN_ROOT={env} is not a kiln checkout (it needs {', '.join(m + '/' for m in _MARKERS)})",
                hint="point KILN_ROOT at the folder holding recipes/, or unset it and cd into the checkout",
            )
        return root
    here = Path.cwd().resolve()
    for cand in (here, *here.parents):
        if _is_checkout(cand):
            return cand
    raise NotACheckout(f"{here} is not inside a kiln checkout (no parent holds {', '.join(m + '/' for m in _MARKERS)})")


def recipes_dir() -> Path:
    """The repository's recipes/ folder."""
    return repo_root() / "recipes"


def _image_namespace() -> str:
    """Where kiln's own images are tagged locally: `kiln/` unless $KILN_IMAGE_NAMESPACE
    names another (a test session that must not touch the images others use on a shared
    daemon). Only tags move: labels keep the `kiln/` names, so the image ids are the same."""
    return os.environ.get("KILN_IMAGE_NAMESPACE", "").strip().strip("/") or "kiln"


def local_ref(ref: str) -> str:
    """`kiln/NAME[:TAG]` in the local image namespace; any other reference unchanged."""
    ns = _image_namespace()
    if ns != "kiln" and ref.startswith("kiln/") and "@" not in ref:
        return f"{ns}/{ref.removeprefix('kiln/')}"
    return ref


def cache_dir(*, create: bool = True) -> Path:
    """User cache: engine wheels, wheelhouses, unpacked engine sources. A reader that only
    looks for something cached passes `create=False`, so looking leaves nothing behind."""
    base = os.environ.get("KILN_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kiln"
    )
    path = Path(base)
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def state_dir() -> Path:
    """Where records live (see the module doc); not created here."""
    for var in ("KILN_RESULTS_DIR", "KILN_STATE_DIR"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "kiln"


def results_dir() -> Path:
    """Smoke and publish records: state_dir(), created on first use."""
    path = state_dir()
    path.mkdir(parents=True, exist_ok=True)
    return path


def shown_home(path: Path | str) -> str:
    """A path for messages, with the home folder as ~ (shorter, and the same on every machine)."""
    text = str(path)
    home = os.path.expanduser("~")
    return "~" + text[len(home) :] if home != "/" and text.startswith(home + os.sep) else text


def host_hf_cache() -> str:
    """The host's Hugging Face cache folder (the one `models--ORG--NAME/` live in):
    $KILN_HF_CACHE, else where the hub client itself puts it ($HF_HUB_CACHE, else
    $HF_HOME/hub, else ~/.cache/huggingface/hub), so a cache filled by `hf download` on
    this host is the one kiln mounts."""
    for var in ("KILN_HF_CACHE", "HF_HUB_CACHE"):
        if os.environ.get(var):
            return os.path.abspath(os.path.expanduser(os.environ[var]))
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return os.path.abspath(os.path.join(os.path.expanduser(home), "hub"))
