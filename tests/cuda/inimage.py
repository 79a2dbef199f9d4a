"""Run one of tests/cuda/proofs/*.py inside an image: no GPU, no network.

The scripts are copied into a stopped container (never baked into the image), run with
the image's own python, and answer with one `KILN-PROOF <json>` line. Shared by the
proof tests and benchmarks/build_cuda.py.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

PROOFS = Path(__file__).resolve().parent / "proofs"
IN_IMAGE = "/tmp/kiln-proofs"


class ProofRun:
    def __init__(self, status: int, result: dict | None, output: str):
        self.status = status
        self.result = result  # None: the script printed no KILN-PROOF line
        self.output = output

    def tail(self, n: int = 15) -> str:
        return "\n".join(self.output.strip().splitlines()[-n:])


def _archive() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        folder = tarfile.TarInfo("kiln-proofs")
        folder.type, folder.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(folder)
        for path in sorted(PROOFS.glob("*.py")):
            info = tar.gettarinfo(str(path), arcname=f"kiln-proofs/{path.name}")
            info.uid = info.gid = 0
            info.mode = 0o644
            with path.open("rb") as f:
                tar.addfile(info, f)
    return buf.getvalue()


def run_proof(docker, image_id: str, script: str, *args: str, user: str | None = None, timeout: int = 1800) -> ProofRun:
    container = docker.client.containers.create(
        image_id,
        entrypoint=["python", f"{IN_IMAGE}/{script}", "--json", *args],
        network_disabled=True,
        user=user or "",
        environment={
            "VLLM_LOGGING_LEVEL": "ERROR",
            "VLLM_NO_USAGE_STATS": "1",
            "HF_HUB_OFFLINE": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        },
    )
    try:
        container.put_archive("/tmp", _archive())
        container.start()
        status = container.wait(timeout=timeout).get("StatusCode", 1)
        output = container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)
    line = next((ln for ln in reversed(output.splitlines()) if ln.startswith("KILN-PROOF ")), None)
    return ProofRun(status, json.loads(line.removeprefix("KILN-PROOF ")) if line else None, output)
