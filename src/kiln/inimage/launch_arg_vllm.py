"""The vLLM half of the launch-argument probe (launch_arg_probe.py, the entry point, says how it
runs): vLLM's own `serve` parser, its config dataclasses' field validators and its
speculative config's model-free checks, over the recipe's command line; and the shape of
one problem, as both halves report it. vLLM is imported only inside functions.

Sent inside the probe's one script, before launch_arg_probe.py (kiln.inimage.script): so it
uses no name of the entry point, and none of its top-level names is bound there too.
"""

from __future__ import annotations

import argparse
import re
import typing
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # types only: the probe is sent alone (`python -c`), see launch_arg_protocol.py
    from .launch_arg_protocol import FlagInfo, ProbeProblem  # noqa: TID252

_MAX_MESSAGE = 600


class Refused(Exception):
    """argparse's error() or exit(): vLLM's parser would stop the server here."""


# replaces a method: takes self
def _refuse(self: argparse.ArgumentParser, message: str) -> typing.NoReturn:  # noqa: ARG001
    raise Refused(message)


def _exit(
    # replaces a method: takes self
    self: argparse.ArgumentParser,  # noqa: ARG001
    status: int = 0,
    message: str | None = None,
) -> typing.NoReturn:
    # --help, --version: the parser prints and exits instead of serving
    raise Refused(f"the parser exits (status {status}) instead of serving" + (f": {message}" if message else ""))


def _raise_instead_of_exiting() -> None:
    """argparse's error() and exit() raise Refused from now on, in this whole process."""
    # argparse has no hook for its error/exit (they print and exit); the probe wants them raised
    argparse.ArgumentParser.error = _refuse  # type: ignore[method-assign]  # patched on purpose, see above
    argparse.ArgumentParser.exit = _exit  # type: ignore[method-assign]  # patched on purpose, see above


def _tidy(text: str) -> str:
    """One line: pydantic's multi-line reports joined, its doc links dropped."""
    lines = [ln.strip() for ln in str(text).splitlines()]
    out = " ".join(ln for ln in lines if ln and not ln.startswith("For further information visit"))
    return out if len(out) <= _MAX_MESSAGE else out[:_MAX_MESSAGE] + "..."


def _problem(
    stage: str, message: str, group: int | None = None, key: str | None = None, var: str | None = None
) -> ProbeProblem:
    """One problem of the answer, as both halves of the probe report it."""
    return {"stage": stage, "group": group, "key": key, "var": var, "message": _tidy(message)}


class _Vllm:
    """vLLM's serve parser and the pieces of vLLM the checks use."""

    def __init__(self) -> None:
        import vllm  # late: in-image only
        import vllm.platforms  # late: in-image only
        from vllm.platforms.interface import UnspecifiedPlatform  # late: in-image only

        # Without a GPU (the build host) vLLM detects no platform, and building the
        # parser instantiates a DeviceConfig that refuses an empty device type. The flags
        # do not depend on the device, so name the one this torch was built for.
        if not vllm.platforms.current_platform.device_type:
            import torch  # late: in-image only

            device_type = "cuda" if torch.version.cuda else "cpu"
            parser_only = type("ParserOnly", (UnspecifiedPlatform,), {"device_type": device_type})
            vllm.platforms._current_platform = parser_only()
        self.version: str = vllm.__version__
        self.root, self.serve, self.command = self._parsers()

    @staticmethod
    def _parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser, Any]:
        from vllm.utils.argparse_utils import FlexibleArgumentParser  # late: in-image only

        root = FlexibleArgumentParser(prog="vllm")
        try:
            from vllm.entrypoints.cli.serve import ServeSubcommand  # late: in-image only
        except ImportError:  # older vLLM: the parser without the CLI's subcommand
            ServeSubcommand = None
        if ServeSubcommand is not None:  # as `vllm serve` (vllm/entrypoints/cli/main.py) builds it
            command = ServeSubcommand()
            serve = command.subparser_init(root.add_subparsers(required=False, dest="subparser"))
            serve.set_defaults(dispatch_function=command.cmd)
            return root, serve, command
        for mod in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args"):
            try:
                make = __import__(mod, fromlist=["make_arg_parser"]).make_arg_parser
            except ImportError:
                continue
            parser = make(FlexibleArgumentParser())
            return parser, parser, None
        raise SystemExit("no vllm serve parser found")

    def flags(self) -> dict[str, FlagInfo]:
        out: dict[str, FlagInfo] = {}
        for action in self.serve._actions:
            for opt in action.option_strings:
                if opt.startswith("--"):
                    out[opt[2:]] = {"takes_value": action.nargs != 0, "default_on": action.default is True}
        return out

    def parse(self, argv: list[str]) -> argparse.Namespace:
        # the root parser takes `serve ...`; an older one without subcommands takes the rest
        return self.root.parse_args(argv if self.command is not None else argv[1:])

    def action(self, token: str) -> argparse.Action | None:
        opt = token.split("=", 1)[0]
        table = self.serve._option_string_actions
        return table.get(opt) or table.get(opt.replace("_", "-"))

    def owners(self) -> dict[str, Any]:
        """dest -> the vLLM config dataclass that declares it (argument groups are titled
        by their config class: `--help=SchedulerConfig`)."""
        import vllm.config  # late: in-image only

        out = {}
        for group in self.serve._action_groups:
            cls = getattr(vllm.config, group.title or "", None)
            if isinstance(cls, type) and hasattr(cls, "__pydantic_fields__"):
                for action in group._group_actions:
                    if action.dest in cls.__pydantic_fields__:
                        out[action.dest] = cls
        return out


def _speculative_fields() -> tuple[list[str] | None, list[str] | None]:
    import dataclasses  # late: in-image only

    try:
        from vllm.config import SpeculativeConfig  # late: in-image only

        keys = sorted(f.name for f in dataclasses.fields(SpeculativeConfig) if f.init)
        import vllm.config.speculative as sp  # late: in-image only

        return keys, sorted(typing.get_args(sp.SpeculativeMethod)) or None
    except Exception:
        return None, None


def _blame(message: str, groups: list[list[str]], vllm: _Vllm) -> int | None:
    """The group whose flag the message names first (argparse writes `argument --x/-y:`)."""
    for opt in re.findall(r"--[A-Za-z0-9][A-Za-z0-9_-]*", message):
        wanted = vllm.action(opt)
        for i, group in enumerate(groups[1:], 1):
            if wanted is not None and vllm.action(group[0]) is wanted:
                return i
            if group[0].split("=", 1)[0] == opt:
                return i
    return None


def _contains_dataclass(annotation: Any) -> bool:
    import dataclasses  # late: in-image only

    if dataclasses.is_dataclass(annotation):
        return True
    return any(_contains_dataclass(arg) for arg in typing.get_args(annotation))


class _FieldCheck:
    """A recipe value through the validator of the config dataclass field it sets.

    Each class's instance is made without __init__ (whose __post_init__ would read the
    model): its defaults, then the recipe's values for its fields, then
    `validate_assignment` per field, as pydantic does for `config.field = value`. Only
    errors located at that field count: a class-wide validator that needs what
    __post_init__ derives cannot judge a half-made instance. Where a class's validators
    cannot run at all, the field's annotated type and constraints (ge, le, Literal) do."""

    def __init__(self) -> None:
        self.instances: dict[Any, Any] = {}

    def instance(self, cls: Any, values: dict[str, Any]) -> Any:
        """cls: a pydantic dataclass of vLLM's (its __pydantic_fields__, __pydantic_validator__)."""
        if cls not in self.instances:
            inst: Any = object.__new__(cls)
            for name, info in cls.__pydantic_fields__.items():
                try:  # the except line says why it passes  # noqa: SIM105
                    inst.__dict__[name] = info.get_default(call_default_factory=True, validated_data={})
                except Exception:
                    pass  # no usable default: the field stays unset
            self.instances[cls] = inst
        inst = self.instances[cls]
        inst.__dict__.update(values)
        return inst

    def errors(self, cls: Any, name: str, value: Any, inst: Any) -> list[str]:
        from pydantic import ValidationError  # late: in-image only

        where = f"{cls.__name__}.{name}"
        try:
            cls.__pydantic_validator__.validate_assignment(inst, name, value)
            return []
        except ValidationError as exc:
            return [f"{where}: {e['msg']}" for e in exc.errors() if tuple(e.get("loc", ()))[:1] == (name,)]
        except Exception:
            pass  # a validator that needs the whole object: fall back to the type
        info = cls.__pydantic_fields__.get(name)
        if info is None or _contains_dataclass(info.annotation):
            return []
        from pydantic import ConfigDict, TypeAdapter  # late: in-image only

        try:
            # Any: the annotation is a runtime object (pydantic >= 2.14 types TypeAdapter's
            # argument as type[T], which an Annotated[...] form or a union is not)
            hint: Any = typing.Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
            TypeAdapter(hint, config=ConfigDict(arbitrary_types_allowed=True)).validate_python(value)
        except ValidationError as exc:
            return [f"{where}: {e['msg']}" for e in exc.errors()]
        except Exception:
            pass
        return []


def _check_argv(vllm: _Vllm, groups: list[list[str]]) -> tuple[list[ProbeProblem], list[str]]:
    problems: list[ProbeProblem] = []
    stages = ["parse"]
    head = groups[0]
    bad: set[int] = set()
    for i, group in enumerate(groups):
        try:
            vllm.parse(head + (group if i else []))
        except Refused as exc:
            problems.append(_problem("parse", str(exc), group=i))
            bad.add(i)
    if 0 in bad:
        return problems, stages
    argv = [tok for i, group in enumerate(groups) if i not in bad for tok in group]
    try:
        args = vllm.parse(argv)
    except Refused as exc:  # only the whole line is wrong (two flags that exclude each other)
        problems.append(_problem("parse", str(exc), group=_blame(str(exc), groups, vllm)))
        return problems, stages
    if vllm.command is not None:
        stages.append("serve")
        try:
            vllm.command.validate(args)
        except Exception as exc:
            problems.append(_problem("serve", str(exc), group=_blame(str(exc), groups, vllm)))
    try:
        from vllm.engine.arg_utils import AsyncEngineArgs  # late: in-image only
    except ImportError:
        AsyncEngineArgs = None
    if AsyncEngineArgs is not None:
        stages.append("engine-args")
        try:
            if hasattr(args, "model_tag") and args.model_tag is not None:
                args.model = args.model_tag  # as ServeSubcommand.cmd does
            AsyncEngineArgs.from_cli_args(args)
        except Exception as exc:
            problems.append(
                _problem("engine-args", f"{type(exc).__name__}: {exc}", group=_blame(str(exc), groups, vllm))
            )
    try:
        owners = vllm.owners()
    except Exception:
        owners = {}
    if owners:
        stages.append("config")
        problems += _config_problems(vllm, groups, bad, args, owners)
    spec = _speculative_problems(vllm, groups, bad, args)
    if spec is not None:
        stages.append("speculative")
        problems += spec
    return problems, stages


def _config_problems(
    vllm: _Vllm, groups: list[list[str]], bad: set[int], args: argparse.Namespace, owners: dict[str, Any]
) -> list[ProbeProblem]:
    check = _FieldCheck()
    chosen: list[tuple[int, str, Any]] = []
    for i, group in enumerate(groups[1:], 1):
        action = vllm.action(group[0])
        if i in bad or action is None or action.dest not in owners:
            continue
        cls = owners[action.dest]
        if _contains_dataclass(cls.__pydantic_fields__[action.dest].annotation):
            continue  # a nested config: parsed by its own dataclass already (parse, engine-args)
        chosen.append((i, action.dest, cls))
    per_class: dict[Any, dict[str, Any]] = {}
    for _, dest, cls in chosen:
        per_class.setdefault(cls, {})[dest] = getattr(args, dest)
    out = []
    for i, dest, cls in chosen:
        inst = check.instance(cls, per_class[cls])
        for message in check.errors(cls, dest, getattr(args, dest), inst):
            out.append(_problem("config", message, group=i))
    return out


def _speculative_problems(
    vllm: _Vllm, groups: list[list[str]], bad: set[int], args: argparse.Namespace
) -> list[ProbeProblem] | None:
    spec = getattr(args, "speculative_config", None)
    if not isinstance(spec, dict):
        return None
    try:
        from vllm.config import SpeculativeConfig  # late: in-image only
    except ImportError:
        return None
    index = next(
        (
            i
            for i, g in enumerate(groups[1:], 1)
            if i not in bad and (a := vllm.action(g[0])) is not None and a.dest == "speculative_config"
        ),
        None,
    )
    check = _FieldCheck()
    values = {k.replace("-", "_"): v for k, v in spec.items()}  # as create_speculative_config does
    inst = check.instance(SpeculativeConfig, values)
    out = []
    for key, value in spec.items():
        name = key.replace("-", "_")
        if name not in SpeculativeConfig.__pydantic_fields__:
            out.append(_problem("speculative", f"SpeculativeConfig has no field {key!r}", group=index, key=key))
            continue
        for message in check.errors(SpeculativeConfig, name, value, inst):
            out.append(_problem("speculative", message, group=index, key=key))
    if not out:  # the whole-config checks judge valid fields only
        out = [
            _problem("speculative", message, group=index, key=key)
            for key, message in _speculative_whole(SpeculativeConfig, inst, spec)
        ]
    return out


# Methods whose SpeculativeConfig.__post_init__ reads no model (vllm/config/speculative.py:
# the ngram branch fills in and compares prompt_lookup_min/max, suffix's checks its own
# numbers and that Arctic Inference is installed); for every other method it loads the
# draft's or the target's config.json, which the probe does not have.
_MODEL_FREE_METHODS = ("ngram", "[ngram]", "ngram_gpu", "suffix")
_SCHEDULE_KEY = "num_speculative_tokens_per_batch_size"


def _named_key(message: str, spec: dict[str, Any]) -> str | None:
    """The speculative-config key a complaint names first (None: it names none)."""
    hits = [(m.start(), key) for key in spec if (m := re.search(rf"\b{re.escape(key)}\b", message))]
    return min(hits)[1] if hits else None


def _speculative_whole(cls: Any, inst: Any, spec: dict[str, Any]) -> list[tuple[str | None, str]]:
    """vLLM's own checks of the speculative config as a whole that need no model, run on
    the half-made instance: __post_init__ for the model-free methods, then the class's
    after-validators (tensor_parallel_size misplaced, synthetic acceptance rates and
    length against num_speculative_tokens, ...) once num_speculative_tokens is known (it
    is otherwise read from the draft model), then vLLM's dynamic-speculation schedule
    check (what the scheduler runs on the schedule at start). A check that fails for
    want of what the model would have given (AttributeError, TypeError on a None) is not
    a refusal: only ValueError (and a missing package, ImportError, in __post_init__) is."""
    out: list[tuple[str | None, str]] = []
    method = spec.get("method")
    if method in _MODEL_FREE_METHODS:
        try:
            cls.__post_init__(inst)
        except (ValueError, ImportError) as exc:  # unnamed: the method's own requirement
            return [(_named_key(str(exc), spec) or "method", f"{cls.__name__}: {exc}")]
        except Exception:
            pass
    decorators = getattr(cls, "__pydantic_decorators__", None)
    validators = decorators.model_validators.values() if decorators is not None else []
    if method is not None and getattr(inst, "num_speculative_tokens", None) is not None:
        for dec in validators:
            if dec.info.mode != "after":
                continue
            try:
                dec.func(inst)
            except ValueError as exc:
                out.append((_named_key(str(exc), spec), f"{cls.__name__}: {exc}"))
            except Exception:
                pass
    if spec.get(_SCHEDULE_KEY) is not None:
        try:
            from vllm.v1.spec_decode.dynamic.utils import (  # late: in-image only
                validate_and_normalize_dynamic_sd_schedule as check_schedule,
            )
        except ImportError:  # a vLLM without dynamic speculation: the field check said so
            return out
        try:
            check_schedule(spec[_SCHEDULE_KEY])
        except (ValueError, TypeError) as exc:
            out.append((_SCHEDULE_KEY, f"dynamic speculation schedule: {exc}"))
    return out
