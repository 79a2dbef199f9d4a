"""Launch args checked against the argument parser of the engine actually built.

A recipe's `launch.args` become `vllm serve --flag value`; a flag the pinned vLLM does
not know only fails when the server starts, on the GPU host, minutes into loading. So a
container from the engine image builds vLLM's own `serve` parser (and reads its
SpeculativeConfig fields) and prints what it accepts; the answer is cached per engine
image id, which changes whenever the engine does. `kiln build` runs this before tagging
a recipe image (via enginecheck), `kiln check` runs it when the engine image exists.
This module only checks: building a missing engine image is the caller's decision.
"""

from __future__ import annotations

import json
from pathlib import Path

from kiln.basics import log
from kiln.basics.errors import KilnError
from kiln.basics.paths import cache_dir
from kiln.domain.images import LABEL_NS, existing, resolve
from kiln.domain.recipe import LoadedRecipe
from kiln.infra.docker import DockerDaemon, Image

SCHEMA = 2
TIMEOUT_S = 300

# Runs inside the engine image. vLLM moved make_arg_parser between releases, so ask the
# CLI's own `serve` subcommand to build its parser, as `vllm serve` does; fall back to
# the older module paths. Option strings, not help text: nothing to parse.
DUMP = r"""
import dataclasses, json, sys, typing
try:
    import vllm
except ModuleNotFoundError as exc:  # no vLLM at all (a stand-in engine): nothing to ask
    if exc.name != "vllm":
        raise
    print("KILN-ARGS " + json.dumps({"version": None}))
    sys.exit(0)
import vllm.platforms
from vllm.platforms.interface import UnspecifiedPlatform

# Without a GPU (the build host) vLLM detects no platform, and building the parser
# instantiates a DeviceConfig that refuses an empty device type. The flags do not depend
# on the device, so name the one this torch was built for and go on.
if not vllm.platforms.current_platform.device_type:
    import torch

    class _ParserOnly(UnspecifiedPlatform):
        device_type = "cuda" if torch.version.cuda else "cpu"

    vllm.platforms._current_platform = _ParserOnly()
from vllm.utils.argparse_utils import FlexibleArgumentParser

def serve_parser():
    try:
        from vllm.entrypoints.cli.serve import ServeSubcommand
    except ImportError:
        ServeSubcommand = None
    if ServeSubcommand is not None:
        root = FlexibleArgumentParser(prog="vllm")
        return ServeSubcommand().subparser_init(root.add_subparsers())
    for mod in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args"):
        try:
            return __import__(mod, fromlist=["make_arg_parser"]).make_arg_parser(FlexibleArgumentParser())
        except ImportError:
            pass
    raise SystemExit("no vllm serve parser found")

flags = {}
for action in serve_parser()._actions:
    for opt in action.option_strings:
        if opt.startswith("--"):
            flags[opt[2:]] = {"takes_value": action.nargs != 0, "default_on": action.default is True}
spec_keys, spec_methods = None, None
try:
    from vllm.config import SpeculativeConfig
    spec_keys = sorted(f.name for f in dataclasses.fields(SpeculativeConfig) if f.init)
    import vllm.config.speculative as sp
    spec_methods = sorted(typing.get_args(sp.SpeculativeMethod)) or None
except Exception:
    pass
print("KILN-ARGS " + json.dumps({"version": vllm.__version__, "flags": flags,
      "speculative_keys": spec_keys, "speculative_methods": spec_methods}))
"""


class EngineArgs:
    """What one engine image's `vllm serve` accepts."""

    def __init__(self, data: dict):
        self.version: str | None = data["version"]  # None: the image has no vLLM
        self.flags: dict[str, dict] = data.get("flags") or {}
        self.speculative_keys: set[str] | None = set(data.get("speculative_keys") or []) or None
        self.speculative_methods: set[str] | None = set(data.get("speculative_methods") or []) or None


def _cache_file(image_id: str) -> Path:
    return cache_dir() / "argcheck" / f"{image_id.split(':')[-1]}.json"


def engine_args(docker: DockerDaemon, image_id: str) -> EngineArgs:
    """The accepted flags of the image, from the cache or from a container run."""
    path = _cache_file(image_id)
    if path.is_file():
        try:
            data = json.loads(path.read_text())
            if data.get("schema") == SCHEMA:
                return EngineArgs(data)
        except (OSError, ValueError):
            pass  # a damaged cache entry is re-read from the image
    data = {"schema": SCHEMA, **_dump(docker, image_id)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(path)
    return EngineArgs(data)


def _dump(docker: DockerDaemon, image_id: str) -> dict:
    # no network, no GPU: the parser is pure Python; the env keeps vLLM quiet and offline
    return docker.run_script(
        image_id, DUMP, marker="KILN-ARGS", what=f"reading vllm serve's flags from {image_id[:19]}",
        timeout_s=TIMEOUT_S,
        env={"VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "ERROR"})


def problems(loaded: LoadedRecipe, accepted: EngineArgs) -> list[str]:
    """One `file:line: field: message` per launch arg the engine would reject."""
    launch = loaded.recipe.launch
    if accepted.version is None:
        log.warn(f"{loaded.name}: launch args not checked: the engine image has no vllm package")
        return []
    out = []
    for flag, value in launch.args.items():
        where = loaded.where("launch", "args", flag)
        spec = accepted.flags.get(flag)
        if spec is None:
            out.append(f"{where}: launch.args.{flag}: vLLM {accepted.version} does not accept --{flag}")
        elif value is True and spec["takes_value"]:
            out.append(f"{where}: launch.args.{flag}: --{flag} takes a value in vLLM {accepted.version}, not a bare switch (true)")
        elif not spec["takes_value"] and not isinstance(value, bool):
            out.append(f"{where}: launch.args.{flag}: --{flag} is a switch in vLLM {accepted.version}: use true or false")
        elif value is False and spec.get("default_on"):
            # false drops the flag from the command line, which leaves vLLM's default (on)
            fix = f"write `no-{flag}: true`" if f"no-{flag}" in accepted.flags else "it cannot be switched off"
            out.append(f"{where}: launch.args.{flag}: false has no effect, vLLM {accepted.version} defaults "
                       f"--{flag} to on; {fix}")
    out += _speculative_problems(loaded, accepted)
    return out


def _speculative_problems(loaded: LoadedRecipe, accepted: EngineArgs) -> list[str]:
    spec = loaded.recipe.launch.speculative_config or {}
    out = []
    if accepted.speculative_keys is not None:
        for key in spec:
            if key not in accepted.speculative_keys:
                out.append(f"{loaded.where('launch', 'speculative_config', key)}: launch.speculative_config.{key}: "
                           f"vLLM {accepted.version}'s SpeculativeConfig has no field {key!r}")
    method = spec.get("method")
    if accepted.speculative_methods is not None and method is not None and method not in accepted.speculative_methods:
        out.append(f"{loaded.where('launch', 'speculative_config', 'method')}: launch.speculative_config.method: "
                   f"vLLM {accepted.version} has no speculative method {method!r}")
    return out


def check_against_engine(loaded: LoadedRecipe, docker: DockerDaemon | None = None) -> list[str]:
    """Launch-arg problems against the engine image built from the recipe's current
    engine inputs; [] when there is none to ask (not built, or no Docker daemon): `kiln
    check` must work on any machine, and it never builds."""
    try:
        docker = docker or DockerDaemon()
        engine_image = resolve(loaded.name).engine_image
        image = existing(docker, engine_image.tag, engine_image.digest)
    except KilnError as exc:
        log.debug(f"launch args of {loaded.name} not checked: {exc.message}")
        return []
    if image is None:
        log.info(f"{loaded.name}: launch args not checked against vLLM (engine image not built)")
        return []
    return problems(loaded, engine_args(docker, image.id))


def check_image(docker: DockerDaemon, loaded: LoadedRecipe, image: Image) -> list[str]:
    """Problems against the engine a just-built recipe image was built FROM (its
    `ai.kiln.engine.image` label), so the cached answer is shared by every recipe on it."""
    ref = (image.labels or {}).get(f"{LABEL_NS}.engine.image")
    engine = docker.image(ref) if ref else None
    return problems(loaded, engine_args(docker, (engine or image).id))
