#!/usr/bin/env python3
"""The GPU twin's runner, on the lent device: stash the parts prepare.py made, assemble
them, make the twin's models, serve every configuration of the plan through vLLM's
OpenAI server and record what it answered (docs/draft-trunc.md, "The GPU twin").

    runner.py stash .gpu-twin/call-N     keep one carried chunk (one call each)
    runner.py all --out DIR              assemble, models, serve, measure: DIR/gpu-twin-results.json

Only the standard library until the parts are assembled: the device has torch and
Triton but none of vLLM's other packages. A missing or mismatched part is one line
(exit 3), never a traceback from inside vLLM. analyse.py reads the results on the host.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STASH = Path(os.environ.get("KILN_GPU_TWIN_DIR", "/tmp/kiln-gpu-twin"))
CHUNKS, PARTS, SITE = STASH / "chunks", STASH / "parts", STASH / "site"
MODEL_LOG = STASH / "models.log"
_T0 = time.monotonic()


class PartProblem(Exception):
    """A part is missing or is not what prepare.py made."""


def _say(message: str) -> None:
    print(f"gpu-twin [{time.monotonic() - _T0:6.1f} s] {message}", flush=True)


def _sha256(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


# -- the documents prepare.py writes: read with plain checks (the device has no kiln) -------
MANIFEST_FIELDS = {"bundle_sha256": str, "chunks": list, "members": dict}
CHUNK_FIELDS = {"name": str, "sha256": str}
PLAN_FIELDS = {"recipe": str, "engine": str, "commit": str, "models": dict, "configs": dict}
MODELS_FIELDS = {"script": str, "args": list}


def _fields(doc: object, where: str, fields: dict[str, type]) -> dict:
    """`doc` when it is a JSON object holding each of `fields` with a value of its type;
    PartProblem naming `where` and the field (one line) when not."""
    if not isinstance(doc, dict):
        raise PartProblem(f"{where}: not a JSON object")
    for key, kind in fields.items():
        if key not in doc:
            raise PartProblem(f"{where}: missing field {key!r}")
        if not isinstance(doc[key], kind):
            raise PartProblem(f"{where}.{key}: must be a JSON {_KINDS[kind]}, not {type(doc[key]).__name__}")
    return doc


_KINDS = {str: "string", list: "array", dict: "object", int: "integer"}


def _json_file(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PartProblem(f"{path}: not JSON ({' '.join(str(exc).split())})") from None


def read_manifest(path: Path) -> dict:
    """A bundle's manifest.json, as prepare.pack writes it."""
    manifest = _fields(_json_file(path), str(path), MANIFEST_FIELDS)
    for n, chunk in enumerate(manifest["chunks"]):
        _fields(chunk, f"{path}: chunks[{n}]", CHUNK_FIELDS)
    for name, sha in manifest["members"].items():
        if not isinstance(sha, str):
            raise PartProblem(f"{path}: members[{name}]: must be a JSON string, not {type(sha).__name__}")
    return manifest


def read_plan(path: Path) -> dict:
    """The plan.json prepare.plan writes (what to make, serve and measure)."""
    plan = _fields(_json_file(path), str(path), PLAN_FIELDS)
    _fields(plan["models"], f"{path}: models", MODELS_FIELDS)
    return plan


# -- parts ----------------------------------------------------------------------------------
def stash(folder: Path) -> None:
    """Copy a carried call-N folder's chunk to STASH, checked against its manifest."""
    manifest_file = folder / "manifest.json"
    if not manifest_file.is_file():
        raise PartProblem(f"{folder}: no manifest.json (run prepare.py here and carry its .gpu-twin/call-N)")
    manifest = read_manifest(manifest_file)
    CHUNKS.mkdir(parents=True, exist_ok=True)
    kept = CHUNKS / "manifest.json"
    if kept.is_file() and read_manifest(kept)["bundle_sha256"] != manifest["bundle_sha256"]:
        shutil.rmtree(CHUNKS)  # chunks of another bundle: start over
        CHUNKS.mkdir(parents=True)
    for chunk in manifest["chunks"]:
        src = folder / chunk["name"]
        if src.is_file():
            if _sha256(src) != chunk["sha256"]:
                raise PartProblem(f"{src}: sha256 differs from its manifest (carried file damaged)")
            shutil.copyfile(src, CHUNKS / chunk["name"])
    kept.write_text(json.dumps(manifest))
    have = [c["name"] for c in manifest["chunks"] if (CHUNKS / c["name"]).is_file()]
    _say(f"stashed in {CHUNKS}: {len(have)} of {len(manifest['chunks'])} chunks ({', '.join(have)})")


def _bundle_members(manifest: dict) -> None:
    """Join the chunks and unpack the bundle into PARTS, each member checked."""
    for n, chunk in enumerate(manifest["chunks"], 1):
        path = CHUNKS / chunk["name"]
        if not path.is_file():
            raise PartProblem(
                f"{chunk['name']} of {len(manifest['chunks'])} is not here: carry .gpu-twin/call-{n} "
                "first (stashed chunks last while the machine stays warm)"
            )
        if _sha256(path) != chunk["sha256"]:
            raise PartProblem(f"{path}: sha256 differs from the manifest: carry .gpu-twin/call-{n} again")
    bundle = STASH / "bundle.tar"
    with bundle.open("wb") as out:
        for chunk in manifest["chunks"]:
            with (CHUNKS / chunk["name"]).open("rb") as fh:
                shutil.copyfileobj(fh, out)
    if _sha256(bundle) != manifest["bundle_sha256"]:
        raise PartProblem("the joined chunks are not the bundle prepare.py made (sha256 differs)")
    if PARTS.exists():
        shutil.rmtree(PARTS)
    with tarfile.open(bundle) as tar:
        tar.extractall(PARTS, filter="data")
    bundle.unlink()
    for name, sha in manifest["members"].items():
        if not (PARTS / name).is_file() or _sha256(PARTS / name) != sha:
            raise PartProblem(f"bundle member {name} is missing or differs from the manifest")


def assemble() -> dict:
    """PARTS -> SITE: vLLM's patched sources, its op libraries, the locked wheels and
    kiln-engine, importable with PYTHONPATH=SITE. Returns the plan."""
    kept = CHUNKS / "manifest.json"
    if not kept.is_file():
        raise PartProblem(f"no chunks stashed in {CHUNKS}: carry .gpu-twin/call-1 with `runner.py stash` first")
    manifest = read_manifest(kept)
    marker = SITE / ".kiln-gpu-twin"
    if marker.is_file() and marker.read_text() == manifest["bundle_sha256"]:
        _say("parts already assembled")
        return read_plan(PARTS / "plan.json")
    _bundle_members(manifest)
    if SITE.exists():
        shutil.rmtree(SITE)
    SITE.mkdir(parents=True)
    with tarfile.open(PARTS / "vllm-sources.tar.xz") as tar:
        tar.extractall(SITE, filter="data")
    import lzma

    for packed in sorted((PARTS / "ops").glob("*.xz")):
        target = SITE / "vllm" / packed.name[:-3]
        target.write_bytes(lzma.decompress(packed.read_bytes()))
        target.chmod(0o755)
    wheels = sorted(str(w) for w in (PARTS / "wheels").glob("*.whl"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--disable-pip-version-check",
            "--target",
            str(SITE),
            *wheels,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise PartProblem(
            f"pip install of the {len(wheels)} locked wheels failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"
        )
    marker.write_text(manifest["bundle_sha256"])
    _say(
        f"assembled {SITE}: vLLM sources, {len(list((PARTS / 'ops').glob('*.xz')))} op libraries, {len(wheels)} wheels"
    )
    return read_plan(PARTS / "plan.json")


_PREFLIGHT = r"""
import importlib, importlib.metadata as md, re, sys, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.get_device_name(0))
for lib, op in (("vllm._C_stable_libtorch", "_C.rms_norm"), ("vllm._moe_C_stable_libtorch", "_moe_C.topk_softmax")):
    try:
        importlib.import_module(lib)
    except Exception as exc:
        sys.exit(f"op library {lib} does not load on torch {torch.__version__}: {exc}")
    ns, name = op.split(".")
    if not hasattr(getattr(torch.ops, ns), name):
        sys.exit(f"op library {lib} loaded but torch.ops.{op} is missing")
print("vllm", md.version("vllm"), "kiln-engine", md.version("kiln-engine"))
import vllm.entrypoints.openai.api_server, kiln_engine.plugin  # noqa: the server's own imports
"""


def preflight() -> str:
    """Torch, the op libraries and the server's imports, in a child with PYTHONPATH=SITE:
    one line naming the piece that is missing or does not fit."""
    proc = subprocess.run(
        [sys.executable, "-c", _PREFLIGHT],
        env={**os.environ, "PYTHONPATH": str(SITE), "KILN_GPU_TWIN": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()] or ["(no output)"]
        raise PartProblem(f"preflight: {lines[-1]}")
    return proc.stdout.strip()


# -- models ---------------------------------------------------------------------------------
def start_models(plan: dict) -> subprocess.Popen[bytes] | None:
    """twin_models.py in the background (CPU, about a minute) while the parts assemble."""
    models = plan["models"]
    target = Path(models["args"][0])
    if (
        (target / "tiny-qwen3moe" / "config.json").is_file()
        and (target / ".shape").is_file()
        and (target / ".shape").read_text() == json.dumps(models["args"])
    ):
        return None
    STASH.mkdir(parents=True, exist_ok=True)
    log = MODEL_LOG.open("wb")
    return subprocess.Popen(
        [sys.executable, str(ROOT / models["script"]), *models["args"]], stdout=log, stderr=subprocess.STDOUT
    )


def finish_models(proc: subprocess.Popen[bytes] | None, plan: dict) -> None:
    if proc is None:
        _say("models already made")
        return
    if proc.wait() != 0:
        tail = MODEL_LOG.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        raise PartProblem(f"twin_models.py failed: {tail[0]}")
    (Path(plan["models"]["args"][0]) / ".shape").write_text(json.dumps(plan["models"]["args"]))
    _say("models: " + " | ".join(MODEL_LOG.read_text().strip().splitlines()[-3:]))


# -- servers: twin_serving.py (shared with the scale twin's runner) ----------------------
def _sibling(name: str):  # a sibling script as a module (no kiln on the device)
    spec = importlib.util.spec_from_file_location(
        f"kiln_gpu_twin_{name}", Path(__file__).resolve().parent / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


serving = _sibling("twin_serving")


class Server(serving.Server):
    """A configuration's server on the assembled parts (SITE)."""

    def __init__(self, name: str, config: dict, logs: Path) -> None:
        super().__init__(name, config, logs, SITE)


greedy_set, seeded_sets, timed_loads = serving.greedy_set, serving.seeded_sets, serving.timed_loads


# -- the whole run --------------------------------------------------------------------------
class Results:
    """The results document, rewritten after every phase so that a run cut short still
    brings back what it measured."""

    def __init__(self, out: Path, plan: dict):
        self.path = out / "gpu-twin-results.json"
        self.doc: dict = {
            "plan": plan,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "configs": {},
            "phases": {},
        }
        out.mkdir(parents=True, exist_ok=True)

    def config(self, name: str) -> dict:
        return self.doc["configs"].setdefault(name, {})

    def phase(self, name: str) -> None:
        self.doc["phases"][name] = round(time.monotonic() - _T0, 1)
        self.save()

    def save(self) -> None:
        self.path.write_text(json.dumps(self.doc) + "\n")


def _each(servers: list[Server], work, results: Results, key: str) -> None:
    """work(server) for every server at once (threads); an error is recorded, not raised."""

    def one(server: Server) -> None:
        try:
            results.config(server.name)[key] = work(server)
        except Exception as exc:  # one configuration's failure must not lose the others'  # noqa: BLE001
            results.config(server.name).setdefault("errors", []).append(f"{key}: {type(exc).__name__}: {exc}")
            results.config(server.name)["log_tail"] = server.log_tail()

    threads = [threading.Thread(target=one, args=(s,)) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def serve_and_measure(plan: dict, results: Results, logs: Path, only: list[str] | None) -> None:
    names = [n for n in plan["configs"] if not only or n in only]
    servers = [Server(n, plan["configs"][n], logs) for n in names]
    _say(f"started {len(servers)} servers: {', '.join(names)}")
    try:
        deadline = time.monotonic() + serving.START_TIMEOUT_S
        _each(servers, lambda s: s.wait_healthy(deadline) or s.startup_s, results, "startup_s")
        up = [s for s in servers if results.config(s.name).get("startup_s")]
        _say("healthy: " + ", ".join(f"{s.name} {s.startup_s:.0f} s" for s in up))
        results.phase("healthy")
        _each(up, greedy_set, results, "greedy")
        results.phase("greedy")
        _say("greedy sets done")
        for server in up:  # one at a time: the others idle, so tokens/s is this one's
            _each([server], timed_loads, results, "timed")
            _say(
                f"timed {server.name}: "
                + ", ".join(
                    f"{r['load']}: {r['tokens_per_s']:.0f} tok/s" for r in results.config(server.name).get("timed", [])
                )
            )
            results.save()
        results.phase("timed")
        _each(up, seeded_sets, results, "seeded")
        results.phase("seeded")
        _say("seeded sets done")
    finally:
        for server in servers:
            results.config(server.name)["log_tail"] = server.log_tail(60)
            server.stop()
        results.save()


def run_all(out: Path, only: list[str] | None) -> None:
    plan_file = PARTS / "plan.json"
    early = read_plan(plan_file) if plan_file.is_file() else None
    models = start_models(early) if early else None
    plan = assemble()
    if early is None:
        models = start_models(plan)
    results = Results(out, plan)
    results.phase("assembled")
    results.doc["preflight"] = preflight()
    _say(results.doc["preflight"].replace("\n", "; "))
    finish_models(models, plan)
    results.doc["models_log"] = MODEL_LOG.read_text(errors="replace").splitlines()[-5:] if MODEL_LOG.is_file() else []
    results.phase("models")
    sys.path[:0] = [str(SITE), str(ROOT / "testkit")]
    logs = STASH / "logs"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    try:
        serve_and_measure(plan, results, logs, only)
    finally:
        with tarfile.open(out / "server-logs.tar.gz", "w:gz") as tar:
            tar.add(logs, arcname="logs")
    _say(f"results in {results.path}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("stash", help="keep one carried .gpu-twin/call-N folder's chunk")
    s.add_argument("folder", type=Path)
    a = sub.add_parser("all", help="assemble, make the models, serve and measure every configuration")
    a.add_argument("--out", type=Path, required=True)
    a.add_argument("--only", nargs="*", help="these configurations only")
    sub.add_parser("assemble", help="assemble and preflight only")
    args = p.parse_args(argv)
    try:
        if args.command == "stash":
            stash(args.folder)
        elif args.command == "assemble":
            assemble()
            _say(preflight().replace("\n", "; "))
        else:
            run_all(args.out, args.only)
    except PartProblem as exc:
        print(f"gpu-twin: {exc}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
