"""The in-image proofs of a GPU image on a host without a GPU: what `kiln smoke
--in-image` checks where serving cannot run (an arm64 CUDA image on an x86-64 host, or
any CUDA image on a CPU-only build machine).

`kiln.inimage.engine_facts` gathers the facts inside the image; `judge` turns them into
named checks against what the recipe declares: the image runs on its platform's machine,
torch is the CUDA build the recipe declares, every module an engine-cuda venv must
import imports, kiln-engine is one of vLLM's general plugins, and each engine feature the
recipe switches on is registered with the runner once vLLM loads its plugins.
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln import inimage
from kiln.basics.documents import Shape
from kiln.infra.docker import DockerDaemon
from kiln.inimage.engine_facts import EngineFacts

_MARKER = "KILN-ENGINEPROOF"  # what engine_facts.report prints before its JSON
_TIMEOUT_S = 1800  # under qemu, importing vLLM's GPU runner takes minutes
_PLUGIN = "kiln_engine.plugin:register"  # kiln-engine's entry point in vllm.general_plugins
_FACTS = Shape(EngineFacts)


@dataclass(frozen=True)
class Expected:
    """What the in-image proofs must find in an image, from its recipe and platform."""

    machine: str  # platform_machine of the image's platform: aarch64
    cuda: str | None  # the recipe's engine.cuda (major.minor); None: not declared
    modules: list[str]  # what must import (docker-images/engine-cuda/imports.txt)
    draft_trunc: bool  # the recipe switches draft-trunc on


def gather(docker: DockerDaemon, image_id: str, modules: list[str]) -> EngineFacts:
    """Run the engine facts script (inimage/engine_facts.py) in the image; the facts it reports."""
    script = inimage.source("engine_facts").read_text(encoding="utf-8") + f"\nreport({modules!r})\n"
    return docker.run_script(
        image_id,
        script,
        marker=_MARKER,
        answer=_FACTS,
        what=f"in-image proofs in {image_id[:19]}",
        timeout_s=_TIMEOUT_S,
        cause=" (python does not start in the image?)",
    )


def judge(facts: EngineFacts, want: Expected) -> list[tuple[str, bool, str]]:
    """(check name, ok, detail) for each proof, in the order they are reported."""
    checks = [
        (
            "machine",
            facts.get("machine") == want.machine,
            f"runs on {facts.get('machine')}, platform needs {want.machine}",
        )
    ]
    cuda = facts.get("cuda")
    cuda_ok = cuda is not None and (want.cuda is None or ".".join(str(cuda).split(".")[:2]) == want.cuda)
    checks.append(
        (
            "torch_cuda",
            cuda_ok,
            f"torch {facts.get('torch')} built for CUDA {cuda}"
            + (f", recipe declares {want.cuda}" if want.cuda else "")
            + (f"; {facts['torch_error']}" if "torch_error" in facts else ""),
        )
    )
    imports: dict[str, str] = facts.get("imports", {})
    failed = {m: imports.get(m, "not tried") for m in want.modules if imports.get(m) != "ok"}
    checks.append(
        (
            "imports",
            not failed,
            f"vllm {facts.get('vllm')}: "
            + (
                "; ".join(f"{m}: {why}" for m, why in failed.items())
                if failed
                else f"{len(want.modules)} modules imported ({', '.join(want.modules)})"
            ),
        )
    )
    plugins: list[str] = facts.get("plugins", [])
    checks.append(
        (
            "kiln_engine_plugin",
            _PLUGIN in plugins and "plugins_error" not in facts,
            f"vllm.general_plugins: {', '.join(plugins) or 'none'}"
            + (f"; loading them: {facts['plugins_error']}" if "plugins_error" in facts else ""),
        )
    )
    if want.draft_trunc:
        checks.append(
            (
                "draft_trunc_registered",
                facts.get("draft_trunc") is not None,
                f"registered as {facts.get('draft_trunc')}"
                if facts.get("draft_trunc")
                else "not registered with the runner after vLLM loaded its plugins",
            )
        )
    return checks
