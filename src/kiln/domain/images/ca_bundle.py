"""Custom CA bundles for builds behind TLS-intercepting (corporate) proxies.

The bundle travels in the build context as `_kiln/ca.crt` (never part of the input
digest, so rotating a proxy CA does not rebuild everything) and Dockerfiles COPY it
only into builder stages; a test scans `docker save` output to prove no final layer
holds it.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from kiln.basics.errors import CABundleInvalid
from kiln.domain.images.build_context import BuildContext

_CONTEXT_PATH = "_kiln/ca.crt"


@dataclass(frozen=True)
class CABundle:
    """The CA bundle that builds trust, and where the setting came from."""

    path: Path | None
    origin: str  # where the setting came from, for `kiln doctor` and build summaries

    @property
    def data(self) -> bytes:
        """The bundle's bytes; empty when there is none."""
        return self.path.read_bytes() if self.path else b""


def _pip_cert() -> str | None:
    if os.environ.get("PIP_CERT"):
        return os.environ["PIP_CERT"]
    try:
        out = subprocess.run(
            ["python3", "-m", "pip", "config", "get", "global.cert"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def resolve_ca(flag: str | None = None, *, use_pip_fallback: bool = True) -> CABundle:
    """--ca-bundle, else $KILN_CA_BUNDLE, else pip's configured cert (the host's proxy CA)."""
    for value, origin in ((flag, "--ca-bundle"), (os.environ.get("KILN_CA_BUNDLE"), "KILN_CA_BUNDLE")):
        if value is not None:
            if value in ("", "none"):
                return CABundle(None, f"{origin}=none")
            return CABundle(_check(Path(value), origin), origin)
    if use_pip_fallback:
        pip = _pip_cert()
        if pip and Path(pip).is_file():
            return CABundle(_check(Path(pip), "pip config cert"), "pip config cert")
    return CABundle(None, "none")


def _check(path: Path, origin: str) -> Path:
    if not path.is_file():
        raise CABundleInvalid(f"{origin}: {path}: no such file")
    head = path.read_bytes()[: 1 << 16]
    if b"-----BEGIN CERTIFICATE-----" not in head:
        raise CABundleInvalid(f"{origin}: {path}: not a PEM certificate bundle")
    return path.resolve()


def add_to_context(ctx: BuildContext, bundle: CABundle) -> None:
    """Put the CA bundle into a build context (outside the input digest)."""
    # always present (possibly empty) so Dockerfiles can COPY it unconditionally
    ctx.add_bytes(_CONTEXT_PATH, bundle.data, in_digest=False)
