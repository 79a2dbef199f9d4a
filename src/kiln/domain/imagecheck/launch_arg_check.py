"""The launch command checked by the engine actually built, values included.

A recipe's `launch.args` become `vllm serve --flag value`; a flag the pinned vLLM does
not know, or a value it refuses (`max-model-len: "512; touch /tmp/pwned"`,
`max-num-seqs: .inf`), only fails when the server starts, on the GPU host, minutes into
loading; a bad feature knob in the launch env (`KILN_DRAFT_TRUNC_TAU=2`) only when
kiln-engine's plugin loads. So a network-less container of the engine image runs
`kiln.inimage.launch_arg_probe` (vLLM's own `serve` parser and config validators, kiln-engine's own knob
checks; launch_arg_probe.py says how deep) over the exact argv and env the recipe image bakes
(launch_command.launch_document), and each complaint is mapped back to the recipe line it comes
from.

Two caches: the flags `vllm serve` accepts, per engine image id (the id changes whenever
the engine does); the answer for one command line, per engine image id and digest of
that argv, env and probe. `kiln build` runs this before tagging a recipe image (via
declared_engine), `kiln check` with the engine image, or without it with the parser
environment (launch_checker, parser_env). This module only checks: building a missing
engine image is the caller's decision.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, TypedDict, TypeVar

from kiln import inimage
from kiln.basics import log
from kiln.basics.documents import Shape, read_document
from kiln.basics.errors import KilnError
from kiln.basics.files import write_atomic
from kiln.basics.paths import cache_dir
from kiln.domain.images.image_naming import LABEL_NS
from kiln.domain.recipes.recipe import LoadedRecipe
from kiln.domain.recipes.resolved import ResolvedRecipe
from kiln.domain.serving.launch_command import ArgvPart, argv_parts, launch_document
from kiln.infra.docker import DockerDaemon, Image, id_of
from kiln.inimage import launch_arg_probe
from kiln.inimage.launch_arg_protocol import FlagInfo, JobAnswer, ProbeAnswer, ProbeJob

_SCHEMA = 2  # of the per-image flag cache
_ANSWER_SCHEMA = 1  # of the per-command-line answer cache
# Importing vLLM 0.33.0 and building its configs in a fresh container of the ~8 GB CUDA
# image took 214 s and then more than 300 s on a 2-core host at load 6-11 (other builds
# running): a wait too short for a loaded host fails `kiln check` and `kiln build`
# although the command line is fine. The probe is bounded by its own work, not by this.
_TIMEOUT_S = 900
# The probe's one script: vLLM's checks, then the entry point that uses them and runs last
# (launch_arg_probe.py). Its digest is that of the exact text sent: a change to either
# module asks every engine image again.
_PROBE = inimage.script("launch_arg_vllm", "launch_arg_probe")
_PROBE_DIGEST = hashlib.sha256(_PROBE.encode()).hexdigest()
# The probe container's own env (launch_arg_probe._PROBE_ENV names them; the server never sees
# them). No plugins: kiln-engine's plugin would check the probe's env, not the recipe's,
# and the probe runs kiln-engine's checks itself. HF_HUB_OFFLINE=0: offline, EngineArgs
# resolves the model path through the Hugging Face cache, and the engine image holds no
# model; the container has no network either way.
_PROBE_ENV = {"VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "0", "VLLM_LOGGING_LEVEL": "ERROR", "VLLM_PLUGINS": ""}
_SHOWN_MAX = 160  # characters of a flag's tokens quoted in an error line


class _FlagsEntry(TypedDict):
    """The per-image flag cache (argcheck/<image>.json): the probe's dump."""

    schema: int
    version: str | None
    flags: dict[str, FlagInfo] | None
    speculative_keys: list[str] | None
    speculative_methods: list[str] | None


class _AnswerEntry(TypedDict):
    """The per-command-line answer cache (argcheck/argv/<image>-<job>.json)."""

    schema: int
    version: str | None
    kiln_engine: str | None
    job: JobAnswer


class _CacheHead(TypedDict):
    schema: int  # an entry of another schema is asked again, not read


_T = TypeVar("_T")
_Mounts = dict[str, tuple[str, bool]] | None  # host folder -> (where in the container, writable)
_HEAD = Shape(_CacheHead)
_FLAGS = Shape(_FlagsEntry)
_ANSWER = Shape(_AnswerEntry)
_PROBE_ANSWER = Shape(ProbeAnswer)  # the probe's one printed document


class _EngineArgs:
    """What one engine image's `vllm serve` accepts."""

    def __init__(self, data: _FlagsEntry) -> None:
        self.version: str | None = data["version"]  # None: the image has no vLLM
        self.flags: dict[str, FlagInfo] = data.get("flags") or {}
        self.speculative_keys: set[str] | None = set(data.get("speculative_keys") or []) or None
        self.speculative_methods: set[str] | None = set(data.get("speculative_methods") or []) or None


@dataclass(frozen=True)
class _Refusal:
    """One complaint of the engine, as launch_arg_probe reports it: which part of the command
    line (`group`, an index into argv_parts), speculative-config key or env variable."""

    stage: str
    message: str
    group: int | None = None
    key: str | None = None
    var: str | None = None


@dataclass(frozen=True)
class _ProbeAnswer:
    """What the engine image said about one command line and env."""

    version: str | None  # vLLM's; None: the image has no vLLM (nothing but env checked)
    kiln_engine: str | None  # kiln-engine's; None: the image has none (env not checked)
    refusals: tuple[_Refusal, ...]
    stages: tuple[str, ...]  # how far the probe got (launch_arg_probe.py names them)

    @classmethod
    def from_json(cls, data: _AnswerEntry) -> _ProbeAnswer:
        job = data["job"]
        return cls(
            version=data.get("version"),
            kiln_engine=data.get("kiln_engine"),
            refusals=tuple(
                _Refusal(
                    stage=p["stage"], message=p["message"], group=p.get("group"), key=p.get("key"), var=p.get("var")
                )
                for p in job.get("problems", [])
            ),
            stages=tuple(job.get("stages", [])),
        )


@dataclass(frozen=True)
class _LaunchProblem:
    where: str  # file:line
    field: str
    message: str

    @property
    def line(self) -> str:
        return f"{self.where}: {self.field}: {self.message}"


@dataclass(frozen=True)
class Job:
    """The command line and env of one recipe image, as the probe takes them."""

    parts: tuple[ArgvPart, ...]
    env: dict[str, str]

    @classmethod
    def of(cls, recipe: ResolvedRecipe) -> Job:
        """The probe job for a recipe's launch command: its argument groups and environment."""
        doc = launch_document(recipe)
        parts = tuple(argv_parts(recipe.recipe))
        if ["vllm", *(tok for part in parts for tok in part.tokens)] != doc["argv"]:
            raise AssertionError("launch.argv_parts no longer adds up to the baked argv")
        return cls(parts=parts, env=dict(doc["env"]))

    def request(self) -> ProbeJob:
        """The job as the in-image probe reads it."""
        return {"groups": [list(part.tokens) for part in self.parts], "env": self.env}

    @property
    def digest(self) -> str:
        """The sha256 the job's cached answer is keyed on: of the probe's text and the request."""
        text = json.dumps({"probe": _PROBE_DIGEST, "job": self.request()}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()


# -- the caches ---------------------------------------------------------------------
def _image_key(image_id: str) -> str:
    return image_id.rsplit(":", maxsplit=1)[-1]


def _cache_file(image_id: str) -> Path:
    return cache_dir() / "argcheck" / f"{_image_key(image_id)}.json"


def _answer_file(image_id: str, job: Job) -> Path:
    return cache_dir() / "argcheck" / "argv" / f"{_image_key(image_id)[:24]}-{job.digest[:32]}.json"


def _read(path: Path, shape: Shape[_T], schema: int) -> _T | None:
    """A cache entry as `shape`; None when there is none, when it is of another schema
    (asked again) or damaged (asked again, said in a warning naming the file and field)."""
    if not path.is_file():
        return None
    try:
        if read_document(path, _HEAD, KilnError)["schema"] != schema:
            return None
        return read_document(path, shape, KilnError)
    except KilnError as exc:
        log.warn(f"{exc.message}: a damaged cache entry, asked the engine image again")
        return None


def _write(path: Path, data: _FlagsEntry | _AnswerEntry) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True))


def _probe(docker: DockerDaemon, image_id: str, *, dump: bool, jobs: list[Job], mounts: _Mounts = None) -> ProbeAnswer:
    # no network, no GPU: parsing and validating is pure Python
    request = json.dumps({"dump": dump, "jobs": [job.request() for job in jobs]})
    return docker.run_script(
        image_id,
        _PROBE,
        marker=launch_arg_probe.MARKER,
        answer=_PROBE_ANSWER,
        timeout_s=_TIMEOUT_S,
        what=f"checking the launch command with the engine's own vLLM parser in {image_id[:19]}",
        env={**_PROBE_ENV, launch_arg_probe.REQUEST_ENV: request},
        mounts=mounts,
    )


def _flags_entry(data: ProbeAnswer) -> _FlagsEntry:
    return {
        "schema": _SCHEMA,
        "version": data.get("version"),
        "flags": data.get("flags"),
        "speculative_keys": data.get("speculative_keys"),
        "speculative_methods": data.get("speculative_methods"),
    }


def engine_args(docker: DockerDaemon, image_id: str) -> _EngineArgs:
    """The accepted flags of the image, from the cache or from a container run."""
    data = _read(_cache_file(image_id), _FLAGS, _SCHEMA)
    if data is None:
        data = _flags_entry(_probe(docker, image_id, dump=True, jobs=[]))
        _write(_cache_file(image_id), data)
    return _EngineArgs(data)


class _Asked(NamedTuple):
    """What an engine image said about one launch command."""

    accepted: _EngineArgs  # every flag its parser knows
    answer: _ProbeAnswer  # its parser's verdict on the command


def ask(
    docker: DockerDaemon, image_id: str, job: Job, mounts: _Mounts = None, also: Callable[[], list[Job]] | None = None
) -> _Asked:
    """The image's accepted flags and its answer for `job`, from the caches or from one
    container run (which then fills both; `mounts`: the host folders a parser
    environment's image runs with). `also`: other command lines the same run answers
    when it runs anyway (called only then), each into its own cache entry."""
    flags = _read(_cache_file(image_id), _FLAGS, _SCHEMA)
    answer = _read(_answer_file(image_id, job), _ANSWER, _ANSWER_SCHEMA)
    if flags is None or answer is None:
        log.info(f"checking the launch command with the engine's own parser ({image_id[:19]})")
        jobs = [job] if answer is None else []
        if answer is None and also is not None:
            unasked = (j for j in also() if j.digest != job.digest and not _answer_file(image_id, j).is_file())
            jobs += list({j.digest: j for j in unasked}.values())
        data = _probe(docker, image_id, dump=flags is None, jobs=jobs, mounts=mounts)
        if flags is None:
            flags = _flags_entry(data)
            _write(_cache_file(image_id), flags)
        for asked, said in zip(jobs, data["jobs"], strict=True):
            entry: _AnswerEntry = {
                "schema": _ANSWER_SCHEMA,
                "version": data.get("version"),
                "kiln_engine": data.get("kiln_engine"),
                "job": said,
            }
            _write(_answer_file(image_id, asked), entry)
            answer = entry if asked is job else answer
    if answer is None:
        raise AssertionError("the probe answered no job for the command line it was sent")
    return _Asked(_EngineArgs(flags), _ProbeAnswer.from_json(answer))


# -- flag names, from the cached flag set ---------------------------------------------
def problems(loaded: LoadedRecipe, accepted: _EngineArgs) -> list[str]:
    """One `file:line: field: message` per launch flag name the engine would reject."""
    return [p.line for p in _name_problems(loaded, accepted)]


def _name_problems(loaded: LoadedRecipe, accepted: _EngineArgs) -> list[_LaunchProblem]:
    launch = loaded.recipe.launch
    if accepted.version is None:
        log.warn(f"{loaded.name}: launch args not checked: the engine image has no vllm package")
        return []
    ver = accepted.version
    out = []
    for flag, value in launch.args.items():
        where, field = loaded.where("launch", "args", flag), f"launch.args.{flag}"
        spec = accepted.flags.get(flag)
        if spec is None:
            out.append(_LaunchProblem(where, field, f"vLLM {ver} does not accept --{flag}"))
        elif value is True and spec["takes_value"]:
            out.append(_LaunchProblem(where, field, f"--{flag} takes a value in vLLM {ver}, not a bare switch (true)"))
        elif not spec["takes_value"] and not isinstance(value, bool):
            out.append(_LaunchProblem(where, field, f"--{flag} is a switch in vLLM {ver}: use true or false"))
        elif value is False and spec.get("default_on"):
            # false drops the flag from the command line, which leaves vLLM's default (on)
            fix = f"write `no-{flag}: true`" if f"no-{flag}" in accepted.flags else "it cannot be switched off"
            out.append(_LaunchProblem(where, field, f"false has no effect, vLLM {ver} defaults --{flag} to on; {fix}"))
    spec_cfg = launch.speculative_config or {}
    if accepted.speculative_keys is not None:
        for key in spec_cfg:
            if key not in accepted.speculative_keys:
                out.append(
                    _LaunchProblem(
                        loaded.where("launch", "speculative_config", key),
                        f"launch.speculative_config.{key}",
                        f"vLLM {ver}'s SpeculativeConfig has no field {key!r}",
                    )
                )
    method = spec_cfg.get("method")
    if accepted.speculative_methods is not None and method is not None and method not in accepted.speculative_methods:
        out.append(
            _LaunchProblem(
                loaded.where("launch", "speculative_config", "method"),
                "launch.speculative_config.method",
                f"vLLM {ver} has no speculative method {method!r}",
            )
        )
    return out


# -- values and env, from the probe's answer ------------------------------------------
def _shown(tokens: tuple[str, ...] | list[str]) -> str:
    text = shlex.join(tokens)
    return text if len(text) <= _SHOWN_MAX else text[:_SHOWN_MAX] + "..."


def _value_problems(recipe: ResolvedRecipe, job: Job, answer: _ProbeAnswer) -> list[_LaunchProblem]:
    """Each refusal in the probe's answer as a LaunchProblem at the recipe (or override)
    line its flag, speculative-config key or env entry comes from."""
    return [_map(recipe, job, answer, r) for r in answer.refusals]


def _map(recipe: ResolvedRecipe, job: Job, answer: _ProbeAnswer, refusal: _Refusal) -> _LaunchProblem:
    loaded = recipe.loaded
    complaint = refusal.message
    vllm = f"vLLM {answer.version}"
    if refusal.var is not None:
        where, field = _env_where(recipe, refusal.var)
        said = complaint.removeprefix("kiln-engine: ")
        if f"{refusal.var}=" not in said:
            said = f"{refusal.var}={job.env.get(refusal.var, '')!r}: {said}"
        return _LaunchProblem(where, field, f"kiln-engine {answer.kiln_engine} (the engine image's) refuses it: {said}")
    part = job.parts[refusal.group] if refusal.group is not None and 0 <= refusal.group < len(job.parts) else None
    if part is None:
        return _LaunchProblem(loaded.where("launch"), "launch", f"{vllm} refuses the launch command: {complaint}")
    if refusal.key is not None:
        spec = loaded.recipe.launch.speculative_config or {}
        value = _speculative_value(part, refusal.key)
        shown = f"{refusal.key}={json.dumps(value)}" if value is not _MISSING else refusal.key
        if refusal.key in spec:
            where, field = (
                loaded.where("launch", "speculative_config", refusal.key),
                f"launch.speculative_config.{refusal.key}",
            )
        elif refusal.key == "model" and loaded.recipe.model.draft is not None:  # filled in from model.draft
            where, field = loaded.where("model", "draft", "path"), "model.draft.path"
        else:
            where, field = loaded.where(*part.loc), part.field
        return _LaunchProblem(where, field, f"{vllm} refuses {_shown([shown])} in --speculative-config: {complaint}")
    return _LaunchProblem(loaded.where(*part.loc), part.field, f"{vllm} refuses {_shown(part.tokens)}: {complaint}")


_MISSING: Any = object()


def _speculative_value(part: ArgvPart, key: str) -> Any:
    try:
        return json.loads(part.tokens[-1]).get(key, _MISSING)
    except (ValueError, AttributeError):
        return _MISSING


def _env_where(recipe: ResolvedRecipe, var: str) -> tuple[str, str]:
    """Where the launch env's `var` is set: the recipe's launch.env wins over the
    switched-on features' override.yaml env, the later feature over the earlier, as in
    launch_command.launch_document (whose resolved overrides these are: Job.of read them)."""
    loaded = recipe.loaded
    if var in loaded.recipe.launch.env:
        return loaded.where("launch", "env", var), f"launch.env.{var}"
    for feature in reversed(recipe.features):
        if var in feature.override.env:
            return feature.override.where("env", var), f"env.{var}"
    return loaded.where("launch", "env"), f"launch.env.{var}"


# -- both -----------------------------------------------------------------------------
def launch_problems(recipe: ResolvedRecipe, accepted: _EngineArgs, job: Job, answer: _ProbeAnswer) -> list[str]:
    """Name problems, then value and env problems; a field whose name is already wrong
    is not reported twice."""
    names = _name_problems(recipe.loaded, accepted)
    named = {p.field for p in names}
    values = [p for p in _value_problems(recipe, job, answer) if p.field not in named]
    log.debug(f"{recipe.name}: launch command checked: {', '.join(answer.stages) or 'nothing'}")
    return [p.line for p in names + values]


def check_engine_image(docker: DockerDaemon, recipe: ResolvedRecipe, image_id: str) -> list[str]:
    """Problems with the recipe's launch arguments as the image's vLLM parses them; empty when it accepts them."""
    job = Job.of(recipe)
    accepted, answer = ask(docker, image_id, job)
    return launch_problems(recipe, accepted, job, answer)


def check_image(docker: DockerDaemon, recipe: ResolvedRecipe, image: Image) -> list[str]:
    """Problems against the engine a just-built recipe image was built FROM (its
    `ai.kiln.engine.image` label), so the cached answers are shared with `kiln check`."""
    ref = (image.labels or {}).get(f"{LABEL_NS}.engine.image")
    engine = docker.image(ref) if ref else None
    return check_engine_image(docker, recipe, id_of(engine or image))
