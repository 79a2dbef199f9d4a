"""LaunchConfig: from a recipe to the vLLM command line baked into the image, and to
the `docker run` that starts it (one RunSpec feeds both `--print` and the SDK call)."""

from __future__ import annotations

import itertools
import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, NamedTuple

from pydantic import Field
from typing_extensions import TypedDict

from kiln.domain.recipes.recipe import LoadedRecipe, Recipe
from kiln.domain.recipes.resolved import ResolvedRecipe
from kiln.domain.recipes.topology import layout_args, node_args
from kiln.inimage.hf_cache import CONTAINER_CACHE, HfModel

LAUNCH_FILE = "_kiln/launch.json"
CPU_SHM = "4g"
CUDA_SHM = "16g"

# vLLM's --speculative-config as the recipe gives it (keys are vLLM's SpeculativeConfig's,
# checked by the engine itself), passed through
SpeculativeConfig = dict[str, Any]


class _LaunchDocumentBase(TypedDict):
    recipe: str
    served_model_name: str
    port: int
    argv: Annotated[list[str], Field(min_length=2)]  # "vllm", "serve", ...
    env: dict[str, str]
    features: list[str]


class LaunchDocument(_LaunchDocumentBase, total=False):
    """_kiln/launch.json: what kiln-serve runs in the image."""

    topology: dict[str, Any]  # the recipe's Topology as its JSON (model_dump)
    hf_models: list[Mapping[str, object]]  # kiln.inimage.hf_cache.HfModel.to_json each


class _SdkKwargs(TypedDict, total=False):
    """The docker SDK's `containers.create` keywords kiln passes (RunSpec.sdk_kwargs)."""

    image: str
    name: str
    command: list[str] | None
    detach: bool
    auto_remove: bool
    ports: dict[str, tuple[str, int]]
    environment: dict[str, str]
    volumes: dict[str, dict[str, str]]
    labels: dict[str, str]
    read_only: bool
    tmpfs: dict[str, str]
    cap_drop: list[str]
    cap_add: list[str] | None
    security_opt: list[str]
    network: str
    healthcheck: dict[str, list[str]]
    ipc_mode: str
    shm_size: str
    ulimits: list[dict[str, str | int]]
    device_requests: list[dict[str, int | list[list[str]]]]


def _flag_args(flag: str, value: object) -> list[str]:
    if value is True:
        return [f"--{flag}"]
    if value is False:
        return []
    if isinstance(value, list):
        return [f"--{flag}", *(str(v) for v in value)]
    if isinstance(value, dict):
        return [f"--{flag}", json.dumps(value, sort_keys=True, separators=(",", ":"))]
    return [f"--{flag}", str(value)]


def speculative_config(recipe: Recipe) -> SpeculativeConfig | None:
    """The recipe's speculative_config for vLLM, its draft model filled in from model.draft; None when it has none."""
    spec = recipe.launch.speculative_config
    if spec is None:
        return None
    spec = dict(spec)
    draft = recipe.model.draft
    if spec.get("method") == "draft_model" and "model" not in spec and draft:
        spec["model"] = draft.ref
        if draft.source == "hf" and "revision" not in spec:
            spec["revision"] = draft.revision
    return spec


def hf_models(recipe: Recipe) -> list[HfModel]:
    """The models a recipe reads from the Hugging Face cache volume (source: hf)."""
    out = []
    for role, src in (("target", recipe.model.target), ("draft", recipe.model.draft)):
        if src is not None and src.source == "hf":
            out.append(HfModel(role=role, repo=src.repo or "", revision=src.revision or "", tokenizer=role == "target"))
    return out


@dataclass(frozen=True)
class ArgvPart:
    """Tokens of the vLLM command line and the recipe field they come from, so a check of
    the command line can name the recipe line of each flag (launch_arg_check)."""

    field: str  # as errors name it: "launch.args.max-model-len"
    loc: tuple[str | int, ...]  # its path in recipe.yaml, for LoadedRecipe.where
    tokens: tuple[str, ...]


def argv_parts(recipe: Recipe) -> list[ArgvPart]:
    """`vllm serve ...` arguments, in recipe order, one part per flag (the first part is
    `serve MODEL`); user args appended at run time win."""
    launch = recipe.launch
    target = recipe.model.target
    where = "repo" if target.source == "hf" else "path"
    parts = [
        ArgvPart(f"model.target.{where}", ("model", "target", where), ("serve", target.ref)),
        ArgvPart(
            "launch.served_model_name",
            ("launch", "served_model_name"),
            ("--served-model-name", launch.served_model_name),
        ),
        ArgvPart("launch", ("launch",), ("--host", "0.0.0.0")),
        ArgvPart("launch.port", ("launch", "port"), ("--port", str(launch.port))),
    ]
    if target.source == "hf":  # offline, the hub client resolves exactly this commit in the cache
        parts.append(
            ArgvPart("model.target.revision", ("model", "target", "revision"), ("--revision", target.revision or ""))
        )
    if recipe.topology is not None:
        tokens = layout_args(recipe.topology)
        starts = [i for i, tok in enumerate(tokens) if tok.startswith("--")] + [len(tokens)]
        parts += [ArgvPart("topology", ("topology",), tuple(tokens[a:b])) for a, b in itertools.pairwise(starts)]
    for flag, value in launch.args.items():
        tokens = _flag_args(flag, value)
        if tokens:  # false: the flag is left out
            parts.append(ArgvPart(f"launch.args.{flag}", ("launch", "args", flag), tuple(tokens)))
    spec = speculative_config(recipe)
    if spec is not None:
        parts.append(
            ArgvPart(
                "launch.speculative_config",
                ("launch", "speculative_config"),
                tuple(_flag_args("speculative-config", spec)),
            )
        )
    return parts


def used_flags(recipe: Recipe) -> frozenset[str]:
    """Every vLLM flag (without `--`) the recipe's command line passes: its own args, the
    ones kiln adds (model name, host, port, revision, the parallel layout, the
    speculative config) and, on a multi-node topology, the per-node ones."""
    tokens = [tok for part in argv_parts(recipe) for tok in part.tokens]
    if recipe.topology is not None and recipe.topology.multi_node:
        tokens += node_args(recipe.topology, 1, "leader")
    return frozenset(tok[2:] for tok in tokens if tok.startswith("--"))


def used_speculative_keys(recipe: Recipe) -> frozenset[str]:
    """The speculative-config keys the recipe's command line passes (kiln's own included)."""
    return frozenset(speculative_config(recipe) or {})


def _vllm_argv(recipe: Recipe) -> list[str]:
    """`vllm serve ...` arguments, in recipe order; user args appended at run time win."""
    return [tok for part in argv_parts(recipe) for tok in part.tokens]


def _feature_env(recipe: ResolvedRecipe) -> dict[str, str]:
    """Env each enabled experimental feature sets (from its override.yaml, as resolved)."""
    env: dict[str, str] = {}
    for feature in recipe.features:
        env.update(feature.override.env)
    return env


def launch_document(loaded: LoadedRecipe | ResolvedRecipe) -> LaunchDocument:
    """The launch command and env (launch.json). A resolved recipe's overrides are the ones
    it read already; a recipe only loaded has its overrides read here."""
    resolved = loaded if isinstance(loaded, ResolvedRecipe) else ResolvedRecipe(loaded)
    recipe = resolved.recipe
    env = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        **({"HF_HUB_CACHE": CONTAINER_CACHE} if hf_models(recipe) else {}),
        **_feature_env(resolved),
        **recipe.launch.env,
        "KILN_FEATURES": ",".join(recipe.features),
    }
    doc: LaunchDocument = {
        "recipe": recipe.name,
        "served_model_name": recipe.launch.served_model_name,
        "port": recipe.launch.port,
        "argv": ["vllm", *_vllm_argv(recipe)],
        "env": env,
        "features": recipe.features,
    }
    if recipe.topology is not None:  # kiln-serve --print-launch shows the per-node commands from it
        doc["topology"] = recipe.topology.model_dump(mode="json")
    models = hf_models(recipe)
    if models:  # kiln-serve checks these snapshots in the mounted cache before vLLM starts
        doc["hf_models"] = [m.to_json() for m in models]
    return doc


def launch_json(loaded: LoadedRecipe | ResolvedRecipe) -> bytes:
    """The launch document as the image carries it: indented, sorted JSON bytes."""
    return (json.dumps(launch_document(loaded), indent=2, sort_keys=True) + "\n").encode()


# Hardened by default: the root filesystem is read-only, so vLLM and its libraries may
# write only to tmpfs mounts. `exec` because torch inductor and triton dlopen() the kernels
# they compile there (docker's tmpfs default is noexec). CUDA images also compile and cache
# kernels under $HOME (/home/kiln in both engine images): vLLM's torch.compile cache,
# triton, flashinfer and the CUDA JIT cache; the rest of ~/.cache/vllm (the model-info
# cache kiln-prewarm fills at build time) stays readable from the image.
TMPFS = {"/tmp": "exec"}
CUDA_TMPFS = {
    "/home/kiln/.cache/vllm/torch_compile_cache": "exec",
    "/home/kiln/.triton": "exec",
    "/home/kiln/.cache/flashinfer": "exec",
    "/home/kiln/.nv": "exec",
}
CPU_CAPS = ("SYS_NICE",)  # vLLM-CPU binds its OpenMP threads to cores (sched_setaffinity)
_SECURITY_OPTS = ("no-new-privileges",)

# Containers that kiln starts carry these, so `kiln ps/logs/stop` find exactly them.
LABEL_RECIPE = "ai.kiln.run.recipe"
LABEL_URL = "ai.kiln.run.url"


class Mount(NamedTuple):
    """A host folder bind-mounted read-only into the container."""

    host: str
    container: str


@dataclass
class RunSpec:
    """Everything `docker run` needs for one serving container."""

    image: str
    name: str
    host_port: int | None  # None: nothing published (a worker node)
    container_port: int
    host_ip: str = ""
    flavour: str = "cpu"
    mounts: list[Mount] = field(default_factory=list)  # read-only
    env: dict[str, str] = field(default_factory=dict)
    extra_args: list[str] = field(default_factory=list)
    remove: bool = True
    detach: bool = False
    labels: dict[str, str] = field(default_factory=dict)
    network: str = ""  # a user-defined network: containers reach each other by name
    healthcheck: bool = True  # False: a headless worker node, which serves no /health

    @property
    def caps(self) -> list[str]:
        """The capabilities the container is given: those CPU serving needs, none for CUDA."""
        return [] if self.flavour == "cuda" else list(CPU_CAPS)

    @property
    def tmpfs(self) -> dict[str, str]:
        """The tmpfs mounts of the container, CUDA's added for a CUDA image."""
        return {**TMPFS, **(CUDA_TMPFS if self.flavour == "cuda" else {})}

    def docker_cli(self) -> list[str]:
        """The `docker run` command line that starts this container."""
        cmd = ["docker", "run"]
        if self.remove:
            cmd.append("--rm")
        if self.detach:
            cmd.append("-d")
        cmd += ["--name", self.name]
        if self.network:
            cmd += ["--network", self.network]
        if not self.healthcheck:
            cmd.append("--no-healthcheck")
        if self.host_port is not None:
            bind = f"{self.host_ip}:" if self.host_ip else ""
            cmd += ["-p", f"{bind}{self.host_port}:{self.container_port}"]
        cmd.append("--read-only")
        for path, opts in self.tmpfs.items():
            cmd += ["--tmpfs", f"{path}:{opts}" if opts else path]
        cmd += ["--cap-drop", "ALL"]
        for cap in self.caps:
            cmd += ["--cap-add", cap]
        for opt in _SECURITY_OPTS:
            cmd += ["--security-opt", opt]
        if self.flavour == "cuda":
            cmd += ["--gpus", "all", "--ipc=host", "--shm-size", CUDA_SHM, "--ulimit", "memlock=-1"]
        else:
            cmd += ["--shm-size", CPU_SHM]
        for host, inside in self.mounts:
            cmd += ["-v", f"{host}:{inside}:ro"]
        for key, value in sorted(self.labels.items()):
            cmd += ["--label", f"{key}={value}"]
        for key, value in sorted(self.env.items()):
            cmd += ["-e", f"{key}={value}"]
        cmd.append(self.image)
        cmd += self.extra_args
        return cmd

    def shell(self) -> str:
        """The `docker run` command line as shell text."""
        return shlex.join(self.docker_cli())

    def sdk_kwargs(self) -> _SdkKwargs:
        """The docker SDK's `containers.create` keywords for the same container."""
        kw: _SdkKwargs = {
            "image": self.image,
            "name": self.name,
            "command": self.extra_args or None,
            "detach": True,
            "auto_remove": self.remove,
            "ports": {}
            if self.host_port is None
            else {f"{self.container_port}/tcp": (self.host_ip or "0.0.0.0", self.host_port)},
            "environment": dict(self.env),
            "volumes": {host: {"bind": inside, "mode": "ro"} for host, inside in self.mounts},
            "labels": dict(self.labels),
            "read_only": True,
            "tmpfs": self.tmpfs,
            "cap_drop": ["ALL"],
            "cap_add": self.caps or None,
            "security_opt": list(_SECURITY_OPTS),
        }
        if self.network:
            kw["network"] = self.network
        if not self.healthcheck:
            kw["healthcheck"] = {"test": ["NONE"]}
        if self.flavour == "cuda":
            kw.update(
                {
                    "ipc_mode": "host",
                    "shm_size": CUDA_SHM,
                    # plain dicts: the SDK turns them into its Ulimit / DeviceRequest types
                    "ulimits": [{"name": "memlock", "soft": -1, "hard": -1}],
                    "device_requests": [{"count": -1, "capabilities": [["gpu"]]}],
                }
            )
        else:
            kw.update({"shm_size": CPU_SHM})
        return kw


def model_mounts(recipe: Recipe, hf_cache: str | None = None) -> list[Mount]:
    """Read-only mounts: host_path weights, and the Hugging Face cache folder `hf_cache`
    at CONTAINER_CACHE when the recipe reads any model from it."""
    out = []
    for src in (recipe.model.target, recipe.model.draft):
        if src is not None and src.source == "host_path" and src.host_path is not None:  # the schema ties them
            out.append(Mount(src.host_path, src.path or ""))
    if hf_cache is not None and hf_models(recipe):
        out.append(Mount(hf_cache, CONTAINER_CACHE))
    return out
