"""`python -m kiln_engine info`: what this engine image is made of."""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import platform
import sys
from pathlib import Path
from typing import Any

from . import __version__
from .features import FEATURES, describe, states

PATCH_MANIFEST = Path("/opt/kiln/patches.json")
LAUNCH = Path("/opt/kiln/launch.json")


def _version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "not installed"


# platform.machine() -> the OCI architecture the image was built for
_OCI_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def architecture() -> dict[str, str]:
    """What this image runs as: the machine (under emulation too: qemu reports the
    guest's) and the OCI platform name the image was built for."""
    machine = platform.machine()
    return {"machine": machine, "platform": f"linux/{_OCI_ARCH.get(machine, machine)}"}


def info() -> dict[str, Any]:
    """The image's engine facts: kiln_engine's, vLLM's and torch's versions, architecture, patches, features, recipe."""
    patches = json.loads(PATCH_MANIFEST.read_text()) if PATCH_MANIFEST.is_file() else None
    launch = json.loads(LAUNCH.read_text()) if LAUNCH.is_file() else {}
    baked = set(launch.get("features", []))
    return {
        "kiln_engine": __version__,
        "vllm": _version("vllm"),
        "torch": _version("torch"),
        "architecture": architecture(),
        "patches": patches,
        "features": {
            f.name: {**describe(f), "enabled": on, "baked_into_launch": f.name in baked}
            for f, on in zip(FEATURES, states().values(), strict=True)
        },
        "recipe": launch.get("recipe"),
    }


def main(argv: list[str] | None = None) -> int:
    """`python -m kiln_engine info [--json]`: print the image's engine facts; the exit status."""
    p = argparse.ArgumentParser(prog="python -m kiln_engine")
    p.add_argument("command", choices=["info"])
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    data = info()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"kiln-engine {data['kiln_engine']}  vllm {data['vllm']}  torch {data['torch']}")
    arch = data["architecture"]
    print(f"architecture: {arch['platform']} ({arch['machine']})")
    print(f"recipe: {data['recipe'] or '(engine image, no recipe)'}")
    if data["patches"] is None:
        print("patches: no manifest at /opt/kiln/patches.json")
    else:
        entries = data["patches"].get("patches", [])
        print(f"patches: {len(entries)} applied")
        for e in entries:
            print(f"  {e.get('source', 'series')}: {e['name']} sha256:{e['sha256'][:12]}")
        for r in data["patches"].get("replacements", []):
            print(f"  feature:{r['feature']}: replaced {r['target']} sha256:{r['sha256'][:12]}")
    for name, f in data["features"].items():
        print(f"feature {name}: {'on' if f['enabled'] else 'off'} ({f['env']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
