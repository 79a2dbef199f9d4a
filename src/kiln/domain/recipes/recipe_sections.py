"""The sections of recipe.yaml (engine, model, launch, smoke, publish, budgets, build,
experimental) and the field types they share; kiln.domain.recipes.recipe puts them
together into the Recipe and loads it.

Strict on purpose (validated_yaml.Strict): unknown keys are rejected and values are not coerced.
"""

from __future__ import annotations

import datetime
from typing import Annotated, Any, Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion
from packaging.version import Version as PEP440Version
from pydantic import (
    AfterValidator,
    Field,
    GetJsonSchemaHandler,
    PlainValidator,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    WithJsonSchema,
    model_serializer,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError

from kiln.basics import image_ref
from kiln.domain.recipes import env_policy
from kiln.domain.recipes.env_policy import EnvValue, Reason
from kiln.domain.recipes.validated_yaml import Strict

NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
# recipes/_shared/: files several recipes use (e.g. the tiny recipes' model generator),
# named by each in `build.shared`; not a recipe itself (it holds no recipe.yaml)
SHARED_DIR = "_shared"


def _port(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise PydanticCustomError("port", "must be an integer in 1..65535")
    return value


_Port = Annotated[
    int,
    PlainValidator(_port),
    WithJsonSchema({"type": "integer", "minimum": 1, "maximum": 65535}),
]
Name = Annotated[str, Field(pattern=NAME_PATTERN)]


def _pep440(value: str) -> str:
    # pip and uv install, and a lock records, only PEP 440 versions: `0.0.1-test` fits the
    # pattern but no index could serve it, so it is refused here, at its line
    try:
        PEP440Version(value)
    except InvalidVersion:
        # the pattern above admits no braces, so the value cannot act as a template field
        raise PydanticCustomError("version", f"{value!r} is not a PEP 440 version (what pip installs)") from None
    return value


Version = Annotated[str, Field(pattern=r"^\d+\.\d+\.\d+([.+-][A-Za-z0-9.+-]+)?$"), AfterValidator(_pep440)]
_Digest = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]
_ImageRef = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._/:-]*$", max_length=255)]
_ContainerPath = Annotated[str, Field(pattern=r"^/[^\s]*$")]
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
_FlagName = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$")]
_ArgValue = bool | int | float | str | list[str | int | float] | dict[str, Any]
# OCI platforms an image can be built for (the engine lock's platforms; engine_lock.PLATFORMS)
_Platform = Literal["linux/amd64", "linux/arm64"]
DEFAULT_PLATFORM = "linux/amd64"


def _unique_platforms(value: list[str]) -> list[str]:
    for i, plat in enumerate(value):
        if plat in value[:i]:
            raise PydanticCustomError("platforms", f"{plat} is listed twice")
    return value


class BaseImage(Strict):
    """The image the engine is built on: `kiln/base:bookworm` or any registry image."""

    ref: _ImageRef = Field(
        description="image reference, e.g. kiln/base:bookworm or nvcr.io/nvidia/cuda:12.8.1-runtime-ubuntu24.04"
    )
    digest: _Digest | None = Field(None, description="pin by content digest (recommended for registry images)")

    @property
    def pinned(self) -> str:
        """`repo@digest` when pinned (the tag is only a label then), else the ref."""
        if not self.digest:
            return self.ref
        return image_ref.parse(self.ref).pinned(self.digest)


class Engine(Strict):
    """The recipe's engine: upstream name and version, flavour, base image and the torch and CUDA it must carry."""

    name: Literal["vllm"] = Field(description="upstream engine")
    version: Version = Field(description="upstream engine version, e.g. 0.32.0")
    flavour: Literal["cpu", "cuda"]
    base_image: BaseImage
    torch: Version | None = Field(
        None, description="torch version the engine must carry (checked against the built image)"
    )
    cuda: Annotated[str, Field(pattern=r"^\d+\.\d+$")] | None = Field(
        None, description="CUDA major.minor the engine must carry (cuda flavour; checked against the built image)"
    )
    platforms: Annotated[list[_Platform], Field(min_length=1), AfterValidator(_unique_platforms)] = Field(
        default_factory=lambda: list[_Platform](["linux/amd64"]),
        description="OCI platforms the images are built for, e.g. [linux/amd64, linux/arm64] (GH200/GB200 "
        "nodes are aarch64); `kiln publish` pushes one image index holding them all",
    )


_HfRepo = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=96)]
_HfRevision = Annotated[str, Field(pattern=r"^[0-9a-f]{40}$")]


def _cited(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"value", "source"}


class Shape(Strict):
    """The model's shape when its config.json is not at hand (`kiln plan`): the keys of
    config.json that the planner reads, copied from `source` (the file at the pinned
    revision, or a model card); a number from elsewhere is `{value: ..., source: ...}`."""

    source: Annotated[str, Field(min_length=8)] = Field(
        description="where the numbers come from, e.g. https://huggingface.co/ORG/NAME/blob/REV/config.json"
    )
    config: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], Any] = Field(
        description="config.json keys (num_hidden_layers, hidden_size, num_key_value_heads, ...) and their "
        "values; a value from another source is {value: V, source: WHERE}"
    )

    @model_validator(mode="after")
    def _citations_name_a_source(self) -> Shape:
        for key, value in self.config.items():
            if _cited(value) and not (isinstance(value["source"], str) and len(value["source"]) >= 8):
                raise PydanticCustomError("source", f"config.{key}.source must say where the number comes from")
        return self

    def as_config(self) -> dict[str, Any]:
        """The block as the config.json it stands for."""
        return {k: v["value"] if _cited(v) else v for k, v in self.config.items()}

    def source_of(self, key: str) -> str:
        """Where the figure for `key` comes from: its own cited source, else the section's."""
        value = self.config.get(key)
        return str(value["source"]) if isinstance(value, dict) and _cited(value) else self.source


class ModelSource(Strict):
    """Where one set of weights comes from."""

    source: Literal["baked", "host_path", "hf"] = Field(
        description="baked: generated or copied into the image at build; host_path: mounted read-only at run "
        "time; hf: a Hugging Face repo at a pinned revision, read offline from a shared cache volume"
    )
    path: _ContainerPath | None = Field(
        None, description="absolute path of the weights inside the container (baked, host_path)"
    )
    host_path: str | None = Field(None, description="host directory mounted at `path` (source: host_path)")
    pvc: Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=253)] | None = Field(
        None,
        description="Kubernetes: mount this PersistentVolumeClaim at `path` instead of host_path (source: host_path)",
    )
    repo: _HfRepo | None = Field(None, description="Hugging Face repo id, e.g. Qwen/Qwen3-30B-A3B (source: hf)")
    revision: _HfRevision | None = Field(
        None, description="the repo's commit, 40 hex digits (source: hf); never a branch"
    )
    shape: Shape | None = Field(
        None, description="the model's shape for `kiln plan` when its config.json is not at hand"
    )

    @model_validator(mode="after")
    def _fields_match_source(self) -> ModelSource:
        if self.source == "hf":
            for name in ("path", "host_path", "pvc"):
                if getattr(self, name) is not None:
                    raise PydanticCustomError(
                        name, f"{name} is not used with source hf (the weights come from the Hugging Face cache volume)"
                    )
            if not self.repo:
                raise PydanticCustomError("repo", "repo is required when source is hf")
            if not self.revision:
                raise PydanticCustomError("revision", "revision (a 40-hex commit) is required when source is hf")
            return self
        if self.repo is not None or self.revision is not None:
            raise PydanticCustomError("repo", "repo and revision are only allowed when source is hf")
        if self.path is None:
            raise PydanticCustomError("path", f"path is required when source is {self.source}")
        if self.source == "host_path" and not self.host_path:
            raise PydanticCustomError("host_path", "host_path is required when source is host_path")
        if self.source == "baked" and self.host_path:
            raise PydanticCustomError("host_path", "host_path is only allowed when source is host_path")
        if self.source == "baked" and self.pvc:
            raise PydanticCustomError("pvc", "pvc is only allowed when source is host_path")
        return self

    @property
    def ref(self) -> str:
        """What vLLM is given: the repo id (source hf, resolved offline in the cache) or the path."""
        return self.repo if self.source == "hf" else self.path  # type: ignore[return-value]


class Model(Strict):
    """The models a recipe serves: the target and an optional draft."""

    target: ModelSource
    draft: ModelSource | None = Field(None, description="draft model for speculative decoding")


class Launch(Strict):
    """How the container starts vLLM (`vllm serve <target> ...`)."""

    served_model_name: Annotated[str, Field(min_length=1, pattern=r"^\S+$")]
    port: _Port = 8000
    args: dict[_FlagName, _ArgValue] = Field(
        default_factory=dict,
        description="vLLM CLI flags without the leading --; true = bare flag, dict = JSON value",
    )
    speculative_config: dict[str, Any] | None = Field(
        None, description="vLLM --speculative-config; a draft_model method gets model.draft.path filled in"
    )
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict, description="the server's environment; each value one line of text"
    )
    # defaulted and left out of every digest: the input digest hashes recipe.yaml's bytes
    # and launch.json (which holds env, not this), so recipes without it keep their images
    allow_unsafe_env: dict[EnvName, Reason] = Field(default_factory=dict, description=env_policy.ALLOW_DESCRIPTION)


class Bounds(Strict):
    """An optional lower and upper bound on a measured value."""

    min: float | None = None
    max: float | None = None


class Smoke(Strict):
    """The smoke test a built image must pass: its timeouts, prompts and what the answers must show."""

    startup_timeout_s: Annotated[int, Field(ge=1, le=7200)] = 300
    request_timeout_s: Annotated[int, Field(ge=1, le=3600)] = 60
    served_model_name: str | None = Field(
        None, description="name the smoke test asks for (defaults to launch.served_model_name)"
    )
    prompts: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1, le=4096)] = 16
    expect_spec_decode: bool = Field(False, description="require vllm:spec_decode_* counters with draft tokens > 0")
    min_acceptance_rate: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    min_tokens_per_s: Annotated[float, Field(gt=0)] | None = None
    gpu: bool = Field(False, description="needs NVIDIA GPUs; skipped with a reason on hosts without them")
    features: dict[Name, dict[Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$")], Bounds]] = Field(
        default_factory=dict,
        description="per switched-on engine feature: bounds on its ratios (e.g. draft-trunc: "
        "dead_fraction: {min: 0.2, max: 0.9}); its counters and log lines are always checked",
    )


class Publish(Strict):
    """Where and how a recipe's image is published: repository, registry, channels and signature policy."""

    repository: Annotated[str, Field(pattern=r"^[a-z0-9]+([._/-][a-z0-9]+)*$")] = Field(
        description="repository path under the registry, e.g. kiln/tiny-moe"
    )
    registry: str | None = Field(None, description="default registry HOST[:PORT][/NAMESPACE]")
    channels: list[Name] = Field(default_factory=lambda: ["experimental", "stable"])
    require_signature: bool = Field(
        False,
        description=(
            "publish only signed images: `kiln publish` needs --sign KEY and verifies the pushed signature and "
            "SBOM/provenance attestations before it writes any channel, engine or digest tag; `kiln promote` "
            "verifies the image before it moves a channel (docs/supply-chain.md)"
        ),
    )
    public_key: Annotated[str, Field(pattern=r"^[^/\s][^\s]*\.pub$", max_length=255)] | None = Field(
        None,
        description=(
            "the signers' public key (cosign PEM), relative to this recipe's folder, e.g. ../../keys/kiln.pub: "
            "`kiln publish --sign` refuses any other key, `kiln promote` verifies with it"
        ),
    )


class Budgets(Strict):
    """Limits a recipe's image must stay within."""

    max_image_size_gb: Annotated[float, Field(gt=0)] | None = None


class Served(Strict):
    """One run that served this recipe's speculation configuration, so that `kiln show`
    can say what proved it (a setting nothing here has served is not called proven)."""

    by: Annotated[str, Field(min_length=1, description="what served it, e.g. 'the GPU twin'")]
    date: datetime.date
    device: Annotated[str, Field(min_length=1)]
    configuration: Annotated[str, Field(min_length=1, description="what was served, in words")]
    result: Annotated[str, Field(min_length=1, description="what it showed, in a few words")]
    record: Annotated[str, Field(min_length=1, description="the results, as a path in the checkout")]


def _python_requirement(value: str) -> str:
    # a lock pins what the index serves: a direct URL (`name @ https://...`) names no
    # version to pin, and a file a build would fetch by it is the way in this field closes
    try:
        req = Requirement(value)
    except InvalidRequirement as exc:
        raise PydanticCustomError("requirement", f"{value!r} is not a requirement ({exc})") from None
    if req.url:
        raise PydanticCustomError(
            "requirement",
            f"{value!r} names a URL; name the package and its version (the lock records the file and its sha256)",
        )
    return value


def _unique_names(value: list[str]) -> list[str]:
    names = [canonicalize_name(Requirement(v).name) for v in value]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise PydanticCustomError("requirement", f"{name} is named twice")
    return value


_PythonRequirement = Annotated[str, AfterValidator(_python_requirement)]


class Build(Strict):
    """What a recipe's build adds to its engine image: shared files and Python packages."""

    shared: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]] = Field(
        default_factory=list,
        description=f"files of recipes/{SHARED_DIR}/ placed at the root of this recipe's build "
        "context, where its Dockerfile COPYs them (one copy serves several recipes)",
    )
    python_packages: Annotated[list[_PythonRequirement], AfterValidator(_unique_names)] = Field(
        default_factory=list,
        description="Python distributions this recipe adds to its engine image's venv (requirements, e.g. "
        "triton==3.9.0): `kiln engine lock NAME --recipe-only` resolves them against the engine lock "
        "into recipe.lock.json next to recipe.yaml; the build ships the locked wheels in its context "
        "(_kiln/wheels/, _kiln/lock/) and the Dockerfile installs them from there, hashes required",
    )


class FeatureFrom(Strict):
    """An `experimental:` entry naming the override of another recipe in the same recipes/
    folder, so that twins of a recipe (e.g. a CPU copy of a GPU recipe) share one override
    instead of copies."""

    name: Name = Field(description="experimental/<name>/ of that recipe")
    from_: Name = Field(alias="from", description="the recipe whose override is used")


# an `experimental:` entry as recipe.yaml spells it: a plain name, or {name, from}
_FeatureSpelling = Name | FeatureFrom


class FeatureUse(Strict):
    """One switched-on experimental feature: a plain name (its override is this recipe's
    experimental/<name>/), or a FeatureFrom for another recipe's override."""

    name: Name
    from_: Name | None = Field(None, alias="from")

    @model_validator(mode="before")
    @classmethod
    def _plain_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> Any:
        return self.name if self.from_ is None else handler(self)

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        """The schema of both spellings, _FeatureSpelling's, rather than this model's fields."""
        return handler(TypeAdapter(_FeatureSpelling).core_schema)
