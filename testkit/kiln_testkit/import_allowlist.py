"""Which failures of the in-image import walk (proofs/import_walk.py) are acceptable, and why.

The question the walk answers is whether kiln's removals broke an import, so the
reference is the plain `pip install vllm` image built beside it: a module that fails in
kiln's image exactly as it fails there (same exception type, same missing module) is
upstream's state (an optional dependency vLLM guards, a GPU driver needed at import, ...),
not kiln's doing. What fails only in kiln's image must match a rule below, which names the
failure (the missing module, or the error type and a message pattern) and why it is
accepted. The serving path (MUST_IMPORT) must import, whatever the rules say.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import Any

# The modules `vllm serve` of glm53-kindling imports before the GPU is touched, and those
# its compile step needs: a rule must never hide one of these.
MUST_IMPORT = (
    "vllm.entrypoints.openai.api_server",
    "vllm.entrypoints.cli.main",
    "vllm.v1.engine.core",
    "vllm.v1.worker.gpu_worker",
    "vllm.v1.worker.gpu.model_runner",
    "vllm.model_executor.models.registry",
    "vllm.models.glm5next",
    "torch._inductor.compile_fx",
    "triton.compiler",
)


@dataclass(frozen=True)
class Allow:
    """An allowed import failure: which modules, the failure it may be, and why it is accepted."""

    modules: tuple[str, ...]
    why: str
    missing: tuple[str, ...] = ()  # ModuleNotFoundError for one of these names
    error: str | None = None  # else: "Type: regex" on the first line of the message
    example: str = ""
    example_missing: str = ""

    def covers(self, module: str, failure: dict[str, Any]) -> bool:
        """Whether this entry allows `module`'s import failure."""
        if not any(fnmatch.fnmatchcase(module, p) for p in self.modules):
            return False
        if self.missing:
            name = failure.get("missing") or ""
            return failure.get("type") == "ModuleNotFoundError" and any(
                name == m or name.startswith(m + ".") for m in self.missing
            )
        if self.error:
            kind, _, pattern = self.error.partition(": ")
            return failure.get("type") == kind and re.search(pattern, failure.get("message", "")) is not None
        return False


# Failures kiln causes on purpose (they do not happen in the plain image).
ALLOWED: list[Allow] = [
    Allow(
        modules=("vllm.*",),
        missing=("cv2", "torchaudio", "torchcodec", "PyNvVideoCodec"),
        why="decodes audio or video inputs, whose packages (OpenCV, torchaudio, torchcodec, "
        "PyNvVideoCodec) this engine leaves out",
        example="vllm.multimodal.video",
        example_missing="cv2",
    ),
]

UPSTREAM = "fails the same way in the plain `pip install vllm` image"


@dataclass
class Verdict:
    """The import failures sorted: the allowed ones by reason, and the unexpected ones."""

    allowed: dict[str, list[str]] = field(default_factory=dict)  # why -> modules
    unexpected: list[str] = field(default_factory=list)


def _same(first: dict[str, Any], second: dict[str, Any]) -> bool:
    return first.get("type") == second.get("type") and first.get("missing") == second.get("missing")


def upstream_kind(failure: dict[str, Any]) -> str:
    """A short class of an upstream failure, for the report."""
    if "libcuda.so" in failure.get("message", ""):
        return "needs the GPU driver (libcuda.so.1) at import"
    if failure.get("type") == "ModuleNotFoundError" and failure.get("missing"):
        return f"optional dependency not installed: {failure['missing'].split('.')[0]}"
    return f"{failure.get('type')} at import (upstream)"


def verdict(
    # the signature the callers share
    package: str,  # noqa: ARG001
    walk: dict[str, Any],
    plain: dict[str, Any] | None = None,
) -> Verdict:
    """Sort the walk's failures. `plain`: {module: failure} from the plain image for (at
    least) the modules that failed here; None when there is no plain image to ask."""
    out = Verdict()
    for module, failure in sorted(walk["failed"].items()):
        if module in MUST_IMPORT:
            out.unexpected.append(module)
            continue
        theirs = (plain or {}).get(module)
        if theirs is not None and _same(failure, theirs):
            out.allowed.setdefault(f"{UPSTREAM}: {upstream_kind(failure)}", []).append(module)
            continue
        rule = next((r for r in ALLOWED if r.covers(module, failure)), None)
        if rule is None:
            out.unexpected.append(module)
        else:
            out.allowed.setdefault(rule.why, []).append(module)
    return out
