"""The recipe schema (`recipes/<name>/recipe.yaml`) and its loader.

Strict on purpose: unknown keys are rejected (a typo such as ``serverd_model_name``
would otherwise be silently ignored and the image built wrong), and values are not
coerced (``port: "8000"`` is an error, not a string that happens to work).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Annotated, Any, Literal

from packaging.version import InvalidVersion
from packaging.version import Version as PEP440Version
from pydantic import (
    AfterValidator,
    Field,
    PlainValidator,
    WithJsonSchema,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from kiln.basics import imageref
from kiln.basics.errors import RecipeInvalid
from kiln.basics.paths import recipes_dir
from kiln.basics.yamlsrc import SourcedYaml
from kiln.domain.recipes import envpolicy, specbounds
from kiln.domain.recipes.envpolicy import EnvValue, Reason
from kiln.domain.recipes.topology import Topology
from kiln.domain.recipes.topology import problems as topology_problems
from kiln.domain.recipes.yamlfile import Strict, display_path, load_validated

RECIPE_FILE = "recipe.yaml"
DOCKERFILE = "Dockerfile"
# recipes/_shared/: files several recipes use (e.g. the tiny recipes' model generator),
# named by each in `build.shared`; not a recipe itself (it holds no recipe.yaml)
SHARED_DIR = "_shared"
NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
# a recipe folder holds a Dockerfile, a few scripts and overlays; walking more than
# this many entries is not a recipe, and it would all go into the build context
MAX_FILES = 2000


def _port(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise PydanticCustomError("port", "must be an integer in 1..65535")
    return value


Port = Annotated[
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
Digest = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]
ImageRef = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._/:-]*$", max_length=255)]
ContainerPath = Annotated[str, Field(pattern=r"^/[^\s]*$")]
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
FlagName = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$")]
ArgValue = bool | int | float | str | list[str | int | float] | dict[str, Any]
# OCI platforms an image can be built for (the engine lock's platforms; enginelock.PLATFORMS)
Platform = Literal["linux/amd64", "linux/arm64"]
DEFAULT_PLATFORM = "linux/amd64"


def _unique_platforms(value: list[str]) -> list[str]:
    for i, plat in enumerate(value):
        if plat in value[:i]:
            raise PydanticCustomError("platforms", f"{plat} is listed twice")
    return value


class BaseImage(Strict):
    """The image the engine is built on: `kiln/base:bookworm` or any registry image."""

    ref: ImageRef = Field(description="image reference, e.g. kiln/base:bookworm or nvcr.io/nvidia/cuda:12.8.1-runtime-ubuntu24.04")
    digest: Digest | None = Field(None, description="pin by content digest (recommended for registry images)")

    @property
    def pinned(self) -> str:
        """`repo@digest` when pinned (the tag is only a label then), else the ref."""
        if not self.digest:
            return self.ref
        return imageref.parse(self.ref).pinned(self.digest)


class Engine(Strict):
    name: Literal["vllm"] = Field(description="upstream engine")
    version: Version = Field(description="upstream engine version, e.g. 0.32.0")
    flavour: Literal["cpu", "cuda"]
    base_image: BaseImage
    torch: Version | None = Field(None, description="torch version the engine must carry (checked against the built image)")
    cuda: Annotated[str, Field(pattern=r"^\d+\.\d+$")] | None = Field(
        None, description="CUDA major.minor the engine must carry (cuda flavour; checked against the built image)"
    )
    platforms: Annotated[list[Platform], Field(min_length=1), AfterValidator(_unique_platforms)] = Field(
        default_factory=lambda: list[Platform](["linux/amd64"]),
        description="OCI platforms the images are built for, e.g. [linux/amd64, linux/arm64] (GH200/GB200 "
                    "nodes are aarch64); `kiln publish` pushes one image index holding them all")


HfRepo = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=96)]
HfRevision = Annotated[str, Field(pattern=r"^[0-9a-f]{40}$")]


def _cited(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"value", "source"}


class Shape(Strict):
    """The model's shape when its config.json is not at hand (`kiln plan`): the keys of
    config.json that the planner reads, copied from `source` (the file at the pinned
    revision, or a model card); a number from elsewhere is `{value: ..., source: ...}`."""

    source: Annotated[str, Field(min_length=8)] = Field(
        description="where the numbers come from, e.g. https://huggingface.co/ORG/NAME/blob/REV/config.json")
    config: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], Any] = Field(
        description="config.json keys (num_hidden_layers, hidden_size, num_key_value_heads, ...) and their "
        "values; a value from another source is {value: V, source: WHERE}")

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
        value = self.config.get(key)
        return str(value["source"]) if isinstance(value, dict) and _cited(value) else self.source


class ModelSource(Strict):
    """Where one set of weights comes from."""

    source: Literal["baked", "host_path", "hf"] = Field(
        description="baked: generated or copied into the image at build; host_path: mounted read-only at run "
        "time; hf: a Hugging Face repo at a pinned revision, read offline from a shared cache volume"
    )
    path: ContainerPath | None = Field(None, description="absolute path of the weights inside the container (baked, host_path)")
    host_path: str | None = Field(None, description="host directory mounted at `path` (source: host_path)")
    pvc: Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=253)] | None = Field(
        None, description="Kubernetes: mount this PersistentVolumeClaim at `path` instead of host_path (source: host_path)")
    repo: HfRepo | None = Field(None, description="Hugging Face repo id, e.g. Qwen/Qwen3-30B-A3B (source: hf)")
    revision: HfRevision | None = Field(None, description="the repo's commit, 40 hex digits (source: hf); never a branch")
    shape: Shape | None = Field(None, description="the model's shape for `kiln plan` when its config.json is not at hand")

    @model_validator(mode="after")
    def _fields_match_source(self) -> ModelSource:
        if self.source == "hf":
            for name in ("path", "host_path", "pvc"):
                if getattr(self, name) is not None:
                    raise PydanticCustomError(name, f"{name} is not used with source hf (the weights come from the Hugging Face cache volume)")
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
    target: ModelSource
    draft: ModelSource | None = Field(None, description="draft model for speculative decoding")


class Launch(Strict):
    """How the container starts vLLM (`vllm serve <target> ...`)."""

    served_model_name: Annotated[str, Field(min_length=1, pattern=r"^\S+$")]
    port: Port = 8000
    args: dict[FlagName, ArgValue] = Field(
        default_factory=dict,
        description="vLLM CLI flags without the leading --; true = bare flag, dict = JSON value",
    )
    speculative_config: dict[str, Any] | None = Field(
        None, description="vLLM --speculative-config; a draft_model method gets model.draft.path filled in"
    )
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict, description="the server's environment; each value one line of text")
    # defaulted and left out of every digest: the input digest hashes recipe.yaml's bytes
    # and launch.json (which holds env, not this), so recipes without it keep their images
    allow_unsafe_env: dict[EnvName, Reason] = Field(default_factory=dict, description=envpolicy.ALLOW_DESCRIPTION)


class Bounds(Strict):
    min: float | None = None
    max: float | None = None


class Smoke(Strict):
    startup_timeout_s: Annotated[int, Field(ge=1, le=7200)] = 300
    request_timeout_s: Annotated[int, Field(ge=1, le=3600)] = 60
    served_model_name: str | None = Field(None, description="name the smoke test asks for (defaults to launch.served_model_name)")
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
    repository: Annotated[str, Field(pattern=r"^[a-z0-9]+([._/-][a-z0-9]+)*$")] = Field(
        description="repository path under the registry, e.g. kiln/tiny-moe"
    )
    registry: str | None = Field(None, description="default registry HOST[:PORT][/NAMESPACE]")
    channels: list[Name] = Field(default_factory=lambda: ["experimental", "stable"])
    require_signature: bool = Field(False, description=(
        "publish only signed images: `kiln publish` needs --sign KEY and verifies the pushed signature and "
        "SBOM/provenance attestations before it writes any channel, engine or digest tag; `kiln promote` "
        "verifies the image before it moves a channel (docs/supply-chain.md)"))
    public_key: Annotated[str, Field(pattern=r"^[^/\s][^\s]*\.pub$", max_length=255)] | None = Field(None, description=(
        "the signers' public key (cosign PEM), relative to this recipe's folder, e.g. ../../keys/kiln.pub: "
        "`kiln publish --sign` refuses any other key, `kiln promote` verifies with it"))


class Budgets(Strict):
    max_image_size_gb: Annotated[float, Field(gt=0)] | None = None


class Build(Strict):
    shared: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]] = Field(
        default_factory=list,
        description=f"files of recipes/{SHARED_DIR}/ placed at the root of this recipe's build "
                    "context, where its Dockerfile COPYs them (one copy serves several recipes)",
    )


class FeatureUse(Strict):
    """One switched-on experimental feature: a plain name (its override is this recipe's
    experimental/<name>/), or {name, from} for the override of another recipe in the same
    recipes/ folder, so that twins of a recipe (e.g. a CPU copy of a GPU recipe) share
    one override instead of copies."""

    name: Name
    from_: Name | None = Field(None, alias="from")

    @model_validator(mode="before")
    @classmethod
    def _plain_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @model_serializer(mode="wrap")
    def _dump(self, handler) -> Any:
        return self.name if self.from_ is None else handler(self)


_FEATURE_USE_SCHEMA = {"anyOf": [
    {"type": "string", "pattern": NAME_PATTERN},
    {"type": "object", "additionalProperties": False, "required": ["name", "from"], "properties": {
        "name": {"type": "string", "pattern": NAME_PATTERN, "description": "experimental/<name>/ of that recipe"},
        "from": {"type": "string", "pattern": NAME_PATTERN, "description": "the recipe whose override is used"},
    }},
]}


class Recipe(Strict):
    name: Name
    description: Annotated[str, Field(min_length=1)]
    engine: Engine
    model: Model
    launch: Launch
    topology: Topology | None = Field(
        None, description="nodes, accelerators per node and the parallel layout; drives the launch flags")
    experimental: list[Annotated[FeatureUse, WithJsonSchema(_FEATURE_USE_SCHEMA)]] = Field(
        default_factory=list,
        description="experimental/<feature>/ overlays switched on; {name, from} uses another recipe's",
    )
    smoke: Smoke
    publish: Publish | None = None
    budgets: Budgets = Field(default_factory=Budgets)
    build: Build = Field(default_factory=Build)

    @property
    def features(self) -> list[str]:
        """Names of the switched-on experimental features, wherever their override lives."""
        return [f.name for f in self.experimental]


class LoadedRecipe:
    """A validated recipe plus where it lives (its folder holds the Dockerfile and overlays)."""

    def __init__(self, recipe: Recipe, directory: Path, source: SourcedYaml):
        self.recipe = recipe
        self.dir = directory
        self.source = source

    @property
    def name(self) -> str:
        return self.recipe.name

    @property
    def file(self) -> Path:
        return self.dir / RECIPE_FILE

    def line_of(self, *loc: Any) -> int:
        return self.source.line_of(tuple(loc))

    def where(self, *loc: Any) -> str:
        return f"{display_path(self.file)}:{self.line_of(*loc)}"

    def shared_file(self, name: str) -> Path:
        """Where a file named in `build.shared` lives: recipes/_shared/<name>."""
        return self.dir.parent / SHARED_DIR / name

    def feature_dir(self, feature: str) -> Path:
        """The override folder of a switched-on feature: experimental/<feature>/ of this
        recipe, or of the recipe named by its `from:` (checked at load)."""
        for entry in self.recipe.experimental:
            if entry.from_ is not None and entry.name == feature:
                return self.dir.parent / entry.from_ / "experimental" / feature
        return self.dir / "experimental" / feature


def _cross_checks(loaded: LoadedRecipe) -> list[str]:
    """Rules that span sections, reported at the line of the field that breaks them."""
    rec = loaded.recipe
    problems = []
    wanted = rec.smoke.served_model_name
    if wanted is not None and wanted != rec.launch.served_model_name:
        problems.append(
            f"{loaded.where('smoke', 'served_model_name')}: smoke.served_model_name: {wanted!r} is not "
            f"served (launch.served_model_name is {rec.launch.served_model_name!r})"
        )
    for feature in rec.smoke.features:
        if feature not in rec.features:
            problems.append(
                f"{loaded.where('smoke', 'features', feature)}: smoke.features.{feature}: "
                f"not switched on (experimental: {rec.features or []})"
            )
    spec = rec.launch.speculative_config or {}
    if spec.get("method") == "draft_model" and "model" not in spec and rec.model.draft is None:
        problems.append(
            f"{loaded.where('launch', 'speculative_config')}: launch.speculative_config: method "
            "draft_model needs model.draft (or a model key here)"
        )
    problems += envpolicy.problems(rec.launch.env, rec.launch.allow_unsafe_env, loaded.where,
                                   ("launch", "env"), ("launch", "allow_unsafe_env"))
    problems += specbounds.problems(rec.launch.speculative_config or {}, rec.launch.args, loaded.where)
    return problems + topology_problems(loaded)


def _check_files(loaded: LoadedRecipe) -> list[str]:
    problems = []
    rec = loaded.recipe
    if rec.name != loaded.dir.name:
        problems.append(f"{loaded.where('name')}: name: {rec.name!r} must equal its folder name {loaded.dir.name!r}")
    if not (loaded.dir / DOCKERFILE).is_file():
        problems.append(f"{loaded.where()}: (recipe): missing file {display_path(loaded.dir / DOCKERFILE)}")
    for i, use in enumerate(rec.experimental):
        if use.from_ is not None:
            problems += _shared_feature_problems(loaded, i, use.name, use.from_)
            continue
        feature = use.name
        fdir = loaded.dir / "experimental" / feature
        if not (fdir / "override.yaml").is_file():
            problems.append(
                f"{loaded.where('experimental', i)}: experimental[{i}]: no overlay at {display_path(fdir)}/override.yaml"
            )
    problems += _shared_file_problems(loaded)
    names = rec.features
    for i, name in enumerate(names):
        if name in names[:i]:
            problems.append(f"{loaded.where('experimental', i)}: experimental[{i}]: {name!r} is switched on twice")
    return problems


def _shared_file_problems(loaded: LoadedRecipe) -> list[str]:
    """`build.shared`: each file exists in recipes/_shared/, once, and the recipe folder
    holds no file of that name (the context would get two)."""
    problems = []
    names = loaded.recipe.build.shared
    for i, name in enumerate(names):
        where = f"{loaded.where('build', 'shared', i)}: build.shared[{i}]"
        path = loaded.shared_file(name)
        if name in names[:i]:
            problems.append(f"{where}: {name!r} is named twice")
        elif not path.is_file() or path.is_symlink():
            problems.append(f"{where}: no file {display_path(path)}")
        elif (loaded.dir / name).exists():
            problems.append(f"{where}: {display_path(loaded.dir / name)} exists too; keep one of them")
    return problems


def _shared_feature_problems(loaded: LoadedRecipe, i: int, name: str, source: str) -> list[str]:
    """`{name, from: source}`: a sibling recipe (same recipes/ folder) that ships that override."""
    where = f"{loaded.where('experimental', i, 'from')}: experimental[{i}].from"
    root = loaded.dir.parent
    other = root / source
    if source == loaded.recipe.name:
        return [f"{where}: {source!r} is this recipe; write the plain name {name!r} instead"]
    if not (other / RECIPE_FILE).is_file():
        return [f"{where}: no recipe {source!r} in {display_path(root)}/"]
    fdir = other / "experimental" / name
    try:
        inside = fdir.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):
        inside = False
    if not inside:
        return [f"{where}: {display_path(fdir)} leads outside {display_path(root)}/"]
    if not (fdir / "override.yaml").is_file():
        return [f"{where}: recipe {source!r} has no overlay at {display_path(fdir)}/override.yaml"]
    return []


def _entry_problem(path: Path, root: Path) -> str | None:
    """Why one entry of a recipe folder must not be read (the build context takes them
    all): a symlink leading outside the folder would ship e.g. ~/.docker/config.json."""
    try:
        mode = path.lstat().st_mode
        if stat.S_ISLNK(mode):
            try:
                target = path.resolve(strict=True)
            except (OSError, RuntimeError):
                return "broken or looping symlink"
            if not target.is_relative_to(root):
                return f"symlink to {target}, outside the recipe folder"
            mode = target.stat().st_mode
    except OSError as exc:
        return f"cannot read it: {exc.strerror}"
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        return "not a regular file or folder"
    return None


def tree_problems(directory: Path) -> list[str]:
    """Entries of the recipe folder kiln refuses, one `path:1: (file): why` line each."""
    root = directory.resolve()
    problems: list[str] = []
    count = 0
    for dirpath, dirnames, filenames in os.walk(directory):
        for name in sorted(dirnames + filenames):
            count += 1
            if count > MAX_FILES:
                return [*problems, f"{display_path(directory)}:1: (recipe): more than {MAX_FILES} files and folders"]
            path = Path(dirpath, name)
            why = _entry_problem(path, root)
            if why:
                problems.append(f"{display_path(path)}:1: (file): {why}")
    return problems


def load_recipe(directory: Path) -> LoadedRecipe:
    """Load and validate one recipe folder; raise RecipeInvalid with every problem found."""
    refused = tree_problems(directory)
    if refused:
        raise RecipeInvalid(refused, hint="keep every file of a recipe inside its folder; copy it in instead of linking")
    doc = load_validated(directory / RECIPE_FILE, Recipe, missing_hint="each recipe folder needs a recipe.yaml")
    loaded = LoadedRecipe(doc.value, directory, doc.source)
    problems = _cross_checks(loaded) + _check_files(loaded)
    if problems:
        raise RecipeInvalid(problems)
    return loaded


def recipe_names() -> list[str]:
    """Folders under recipes/ that hold a recipe.yaml, sorted."""
    root = recipes_dir()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / RECIPE_FILE).is_file())


def recipe_dir(name: str) -> Path:
    """The folder of the recipe called ``name``: a simple name of a folder inside
    recipes/, so `kiln build ../x` or `/etc` cannot reach anything else."""
    root = recipes_dir()
    directory = root / name
    if re.fullmatch(NAME_PATTERN, name) and directory.is_dir():
        if not directory.resolve().is_relative_to(root.resolve()):
            raise RecipeInvalid(
                [f"{display_path(directory)}:1: (file): symlink to {directory.resolve()}, outside {display_path(root)}/"],
                hint="move the recipe folder into recipes/ instead of linking it",
            )
        return directory
    known = recipe_names()
    if name in known:  # listed by `kiln check --all`, but no name a recipe can have
        raise RecipeInvalid([f"{display_path(directory)}:1: (file): folder name must match {NAME_PATTERN}"])
    shown = ", ".join(known[:20]) + (", ..." if len(known) > 20 else "") if known else "none"
    what = "no recipe named {!r} in {}/" if re.fullmatch(NAME_PATTERN, name) else "{!r} is not a recipe name in {}/"
    raise RecipeInvalid(
        [f"{what.format(name, display_path(root))} (known: {shown})"],
        hint="`kiln list` shows the recipes; a recipe is a folder recipes/NAME/ holding a recipe.yaml",
    )


def json_schema() -> dict:
    schema = Recipe.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "kiln recipe.yaml"
    return schema
