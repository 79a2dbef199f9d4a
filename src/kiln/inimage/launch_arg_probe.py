"""The in-image half of `launch_arg_check`: runs INSIDE an engine image, with that image's own
python, vLLM and kiln-engine, in a network-less container. kiln never imports it: it
imports nothing of kiln, and vLLM only inside functions.

The probe is two modules sent as the text of one script (`python -c`): launch_arg_vllm.py
(vLLM's parser and config checks) and then this one (the request, kiln-engine's env
checks, the answer), joined by kiln.inimage.script in launch_arg_check.

It reads one request, JSON in $KILN_ARGPROBE, and prints one line,
`KILN-ARGPROBE <json>`: both documents are typed in launch_arg_protocol.py.

How deep it goes is the answer's `stages` (launch_arg_protocol.py says what each one checks).
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only: the probe is sent alone (`python -c`), see launch_arg_protocol.py
    from .launch_arg_protocol import JobAnswer, ProbeAnswer, ProbeProblem, ProbeRequest  # noqa: TID252

# One import per place this runs: relative on the host (kiln.inimage.launch_arg_probe, and
# not `kiln.` by name: inimage imports no kiln); none in the probe's script, where
# launch_arg_vllm's text comes first and its names are already defined (`python -c` leaves
# __package__ unset).
if TYPE_CHECKING or __package__:
    from .launch_arg_vllm import (  # noqa: TID252  (see above)
        _check_argv,
        _problem,
        _raise_instead_of_exiting,
        _speculative_fields,
        _Vllm,
    )

MARKER = "KILN-ARGPROBE"
REQUEST_ENV = "KILN_ARGPROBE"
# set by launch_arg_check for this container only; the server never sees them
_PROBE_ENV = (REQUEST_ENV, "VLLM_PLUGINS", "HF_HUB_OFFLINE", "VLLM_LOGGING_LEVEL", "VLLM_NO_USAGE_STATS")


def _check_env(env: dict[str, str]) -> tuple[list[ProbeProblem], str | None]:
    """kiln-engine's own refusals of the env the server would run with: each knob by its
    own parser (every bad one named), then check_environment (combinations)."""
    try:
        import kiln_engine  # late: in-image only
        from kiln_engine import features  # late: in-image only
    except ModuleNotFoundError:
        return [], None
    version = getattr(kiln_engine, "__version__", "?")
    # kiln-serve: the baked env, then the container's (the image's ENV, `docker run -e`)
    environ = {**env, **{k: v for k, v in os.environ.items() if k not in _PROBE_ENV}}
    problems: list[ProbeProblem] = []
    try:
        for feature in features.FEATURES:
            for knob in (feature.switch, *feature.knobs):
                try:
                    knob.parse(environ.get(knob.env))
                except ValueError as exc:
                    problems.append(_problem("env", f"kiln-engine: {feature.name}: {exc}", var=knob.env))
    except AttributeError:
        pass  # another kiln-engine: its check_environment alone says what it refuses
    if not problems:
        try:
            features.check_environment(environ)
        except Exception as exc:
            named = [v for v in re.findall(r"\b[A-Z][A-Z0-9_]*(?==)", str(exc)) if v in environ]
            problems.append(_problem("env", str(exc), var=(named or [None])[0]))
    return problems, version


def _strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _read_request(text: str) -> ProbeRequest:
    """$KILN_ARGPROBE as kiln sends it (launch_arg_protocol.ProbeRequest), with plain checks (no
    pydantic of kiln's here); SystemExit naming the field, one line, when it is not."""
    try:
        request: ProbeRequest = json.loads(text)
    except ValueError as exc:
        raise SystemExit(f"{REQUEST_ENV}: not JSON ({exc})") from None
    raw: object = request  # what it really is, until the checks below say otherwise
    if not isinstance(raw, dict):
        raise SystemExit(f"{REQUEST_ENV}: not a JSON object")
    if not isinstance(raw.get("dump", False), bool):
        raise SystemExit(f"{REQUEST_ENV}: dump: must be true or false")
    jobs = raw.get("jobs", [])
    if not isinstance(jobs, list):
        raise SystemExit(f"{REQUEST_ENV}: jobs: must be a list")
    for i, job in enumerate(jobs):
        if not isinstance(job, dict) or not isinstance(job.get("groups"), list):
            raise SystemExit(f"{REQUEST_ENV}: jobs[{i}]: missing field 'groups'")
        if not all(_strings(group) for group in job["groups"]):
            raise SystemExit(f"{REQUEST_ENV}: jobs[{i}].groups: must be lists of strings")
        env = job.get("env", {})
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise SystemExit(f"{REQUEST_ENV}: jobs[{i}].env: must map names to strings")
    return request


def main() -> None:
    """Answer the request in the environment: parse each job's arguments with the image's vLLM; print the answer."""
    request = _read_request(os.environ.get(REQUEST_ENV) or "{}")
    _raise_instead_of_exiting()
    answer: ProbeAnswer = {"version": None, "kiln_engine": None, "jobs": []}
    vllm: _Vllm | None = None
    try:
        vllm = _Vllm()
        answer["version"] = vllm.version
    except ModuleNotFoundError as exc:  # no vLLM at all (a stand-in engine)
        if exc.name != "vllm":
            raise
    if request.get("dump") and vllm is not None:
        keys, methods = _speculative_fields()
        answer["flags"] = vllm.flags()
        answer["speculative_keys"], answer["speculative_methods"] = keys, methods
    jobs: list[JobAnswer] = []
    for job in request.get("jobs", []):
        problems: list[ProbeProblem] = []
        stages: list[str] = []
        if vllm is not None:
            problems, stages = _check_argv(vllm, job["groups"])
        env_problems, answer["kiln_engine"] = _check_env(job.get("env", {}))
        if answer["kiln_engine"] is not None:
            stages.append("env")
        jobs.append({"problems": problems + env_problems, "stages": stages})
    answer["jobs"] = jobs
    sys.stdout.flush()
    print(f"{MARKER} {json.dumps(answer)}", flush=True)


if __name__ == "__main__":
    main()
