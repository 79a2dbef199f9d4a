"""Which failures of the in-image import walk (proofs/import_walk.py) are acceptable, and why.

A rule names modules (fnmatch patterns) AND the failure it expects: a missing module
(ModuleNotFoundError.name) or an error type with a message pattern. The same module
failing any other way is unexpected. Everything is measured in the built image on a host
without a GPU; `plain` rules are also seen in the unmodified `pip install vllm` image,
so what kiln removed is not their cause.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Allow:
    modules: tuple[str, ...]
    why: str
    missing: tuple[str, ...] = ()  # ModuleNotFoundError for one of these names
    error: str | None = None  # else: "Type: regex" on the first line of the message
    example: str = ""
    example_missing: str = ""

    def covers(self, module: str, failure: dict) -> bool:
        if not any(fnmatch.fnmatchcase(module, p) for p in self.modules):
            return False
        if self.missing:
            name = failure.get("missing") or ""
            return any(name == m or name.startswith(m + ".") for m in self.missing)
        if self.error:
            kind, _, pattern = self.error.partition(": ")
            return failure.get("type") == kind and re.search(pattern, failure.get("message", "")) is not None
        return False


ALLOWED: list[Allow] = [
    Allow(modules=("torch.testing._internal.*",),
          missing=("expecttest", "hypothesis", "pytest", "xmlrunner", "numba", "optree"),
          why="torch's own test-suite helpers: need test-only packages that `pip install vllm` never installs",
          example="torch.testing._internal.common_utils", example_missing="expecttest"),
]


@dataclass
class Verdict:
    allowed: dict[str, list[str]] = field(default_factory=dict)  # why -> modules
    unexpected: list[str] = field(default_factory=list)


def verdict(package: str, walk: dict) -> Verdict:
    out = Verdict()
    for module, failure in sorted(walk["failed"].items()):
        rule = next((r for r in ALLOWED if r.covers(module, failure)), None)
        if rule is None:
            out.unexpected.append(module)
        else:
            out.allowed.setdefault(rule.why, []).append(module)
    return out
