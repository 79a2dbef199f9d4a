"""The request and the answer of the launch-argument probe (launch_arg_probe.py with
launch_arg_vllm.py, which run inside an engine image; kiln.domain.imagecheck.launch_arg_check
sends the one and reads the other).

The probe names these types for the type checker only: it is sent alone, as
`python -c <its text>` (its two modules joined), so nothing here is imported where it runs.

The request is JSON in $KILN_ARGPROBE. A job's groups, concatenated, are the exact `vllm`
argv a recipe image runs (group 0 is `serve MODEL`, every other group one flag and its
values) and its env is the environment the image bakes. The answer is one printed line,
`KILN-ARGPROBE <json>`.

How deep it goes (`stages`), each as vLLM itself does it and stopping before anything
touches a model or a device:
  parse         vLLM's `serve` parser (FlexibleArgumentParser) parses each group on its
                own (so every bad flag is named, not only the first) and then the whole
                argv; argparse's message is the complaint
  serve         the `serve` subcommand's own checks of the parsed args (validate)
  engine-args   AsyncEngineArgs.from_cli_args, as `vllm serve` builds it (the nested
                JSON configs, e.g. --compilation-config, become their config objects)
  config        each recipe flag's value through the pydantic validator of the vLLM
                config dataclass that owns it (SchedulerConfig.max_num_seqs >= 1, ...)
  speculative   each --speculative-config key through SpeculativeConfig's validator, then
                its model-free whole-config checks and the dynamic-speculation
                schedule check (_speculative_whole says which)
  env           kiln-engine's own knob parsers and check_environment over the env
Not reached: EngineArgs.create_engine_config, which reads the model's config.json and
sizes the device, and each config's __post_init__ (the same; but SpeculativeConfig's for
the methods that read no model).
"""

from __future__ import annotations

from typing import NotRequired, TypedDict


class ProbeJob(TypedDict):
    """One probe job: launch argument groups, and the environment they are parsed under."""

    groups: list[list[str]]
    env: NotRequired[dict[str, str]]


class ProbeRequest(TypedDict, total=False):
    """What the host asks the probe: jobs to check, and whether to dump vLLM's options."""

    dump: bool  # also answer every --option of `vllm serve` (flags, speculative_*)
    jobs: list[ProbeJob]


class FlagInfo(TypedDict):
    """How a `vllm serve` option is spelt: whether it takes a value and whether it is on by default."""

    takes_value: bool
    default_on: bool


class ProbeProblem(TypedDict):
    """One complaint: the engine's own message, and which part it blames."""

    stage: str  # how far the probe got when it was raised (launch_arg_probe.py names the stages)
    group: int | None  # index of the argv group
    key: str | None  # speculative-config key
    var: str | None  # env name
    message: str


class JobAnswer(TypedDict):
    """The probe's answer to one job: its problems and the stages it got through."""

    problems: list[ProbeProblem]
    stages: list[str]


class ProbeAnswer(TypedDict):
    """The probe's whole answer: the vLLM and kiln-engine versions, each job's answer and the dumped options."""

    version: str | None  # vLLM's; None: the image has no vLLM
    kiln_engine: str | None  # kiln-engine's; None: the image has none
    flags: NotRequired[dict[str, FlagInfo]]  # only when dump
    speculative_keys: NotRequired[list[str] | None]
    speculative_methods: NotRequired[list[str] | None]
    jobs: list[JobAnswer]
