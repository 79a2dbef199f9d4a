"""The feature registry: the engine features kiln ships, what switches them, how they
are checked and what they publish.

Each feature declares, in one place:
- its switch and knobs (environment variables with defaults) and the ONE parser of
  them (`Feature.read`): a bad value fails with the variable's name, never silently;
- the Prometheus counters it publishes (names as they appear on /metrics);
- its smoke checks: log lines that must appear once per server, counters that must be
  on /metrics, and named ratios of counters a recipe's smoke spec can bound;
- env the smoke container runs with (e.g. a short statistics interval).
The kiln plugin (plugin.py), `python -m kiln_engine info` and `kiln smoke` read
features from here; none of them names a feature.

A feature is off unless its switch is set ("1", "true", "on", "yes"). Recipes switch
features on through their launch env (`experimental:` overrides set it); users turn
one off per container with e.g. `docker run -e KILN_DRAFT_TRUNC=0`.

Pure Python and standard library only: kiln (on the host) and vLLM's processes (in the
image) both import it, so it must not pull torch, triton or vLLM.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Knob:
    """One environment variable of a feature. `kind`: flag, int, float, path, choice,
    moe_layer ("EXPERTS,TOP_K,EXPERT_BYTES", parsed to a tuple) or draft_cost
    ("REQS:SHARE[:FIRST],...", parsed to a tuple of triples)."""

    name: str  # short name, the key in Feature.read()'s result
    env: str
    kind: str
    default: Any
    lo: float | None = None
    hi: float | None = None
    doc: str = ""
    choices: tuple[str, ...] = ()  # kind "choice": the accepted values

    def parse(self, raw: str | None) -> Any:
        """The knob's value from its environment variable's raw text; the default when unset or blank."""
        if raw is None or raw.strip() == "":
            return self.default
        value = raw.strip()
        if self.kind == "path":
            return value
        if self.kind == "moe_layer":
            return _parse_moe_layer(self.env, raw, value)
        if self.kind == "draft_cost":
            return _parse_draft_cost(self.env, raw, value)
        if self.kind == "choice":
            if value.lower() not in self.choices:
                raise ValueError(f"{self.env}={raw!r}: expected one of {', '.join(self.choices)}")
            return value.lower()
        if self.kind == "flag":
            if value.lower() in _TRUE:
                return True
            if value.lower() in _FALSE:
                return False
            raise ValueError(f"{self.env}={raw!r}: expected 0/1/true/false/on/off/yes/no")
        cast = int if self.kind == "int" else float
        try:
            number = cast(value)
        except ValueError:
            raise ValueError(f"{self.env}={raw!r}: not {'an integer' if cast is int else 'a number'}") from None
        lo, hi = self.lo, self.hi
        if lo is None or hi is None:  # a declaration error, not a user's
            raise TypeError(f"knob {self.env}: kind {self.kind!r} needs lo and hi")
        if not (lo <= number <= hi):  # also refuses NaN
            raise ValueError(f"{self.env}={raw!r}: must lie in [{lo:g}, {hi:g}]")
        return number


def _parse_moe_layer(env: str, raw: str, value: str) -> tuple[int, int, float]:
    fields = [f.strip() for f in value.split(",")]
    bad = f"{env}={raw!r}: expected EXPERTS,TOP_K,EXPERT_BYTES (e.g. 256,8,75497472)"
    if len(fields) != 3:
        raise ValueError(bad)
    try:
        experts, top_k, expert_bytes = int(fields[0]), int(fields[1]), float(fields[2])
    except ValueError:
        raise ValueError(bad) from None
    if not (0 < top_k <= experts <= 1 << 20 and 0 < expert_bytes < 1e15):  # also refuses NaN
        raise ValueError(f"{bad}; need 0 < TOP_K <= EXPERTS <= 1048576 and 0 < EXPERT_BYTES < 1e15")
    return experts, top_k, expert_bytes


def _parse_draft_cost(env: str, raw: str, value: str) -> tuple[tuple[int, float, float], ...]:
    """``REQS:SHARE[:FIRST],...``, REQS strictly increasing (FIRST defaults to 1)."""
    bad = f"{env}={raw!r}: expected REQS:SHARE[:FIRST],... with REQS increasing (e.g. 1:0.08,64:0.02:1.5)"
    points = []
    for item in value.split(","):
        fields = [f.strip() for f in item.split(":")]
        if len(fields) not in (2, 3):
            raise ValueError(bad)
        try:
            reqs, share = int(fields[0]), float(fields[1])
            first = float(fields[2]) if len(fields) == 3 else 1.0
        except ValueError:
            raise ValueError(bad) from None
        if not (1 <= reqs <= 1 << 20 and 0.0 <= share <= 1.0 and 0.0 <= first <= 100.0):  # also refuses NaN
            raise ValueError(f"{bad}; need 1 <= REQS <= 1048576, 0 <= SHARE <= 1, 0 <= FIRST <= 100")
        points.append((reqs, share, first))
    if any(a[0] >= b[0] for a, b in itertools.pairwise(points)):
        raise ValueError(bad)
    return tuple(points)


@dataclass(frozen=True)
class Ratio:
    """A quantity smoke specs can bound: sum(numerator) / sum(denominator) on /metrics."""

    name: str
    numerator: str
    denominator: str
    doc: str = ""


@dataclass(frozen=True)
class Feature:
    """One engine feature: its module, the vLLM module that imports it, its switch, knobs and what it reports."""

    name: str
    module: str  # our implementation
    vllm_module: str  # where patched vLLM code imports it from
    switch: Knob
    knobs: tuple[Knob, ...] = ()
    metrics: tuple[str, ...] = ()  # counters on /metrics, as exposed (with _total)
    ratios: tuple[Ratio, ...] = ()
    log_lines: tuple[str, ...] = ()  # substrings the server log must show (start, summary)
    start_line: str = ""  # the one that must appear exactly once per server
    smoke_env: Mapping[str, str] = field(default_factory=dict)
    # (requests in flight, tokens each) the smoke test sends before checking the feature
    smoke_load: tuple[int, int] = (0, 0)

    @property
    def env(self) -> str:
        """The environment variable that switches the feature on."""
        return self.switch.env

    def read(self, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The switch and every knob, parsed: {"enabled": bool, <knob name>: value}."""
        environ = os.environ if environ is None else environ
        values = {"enabled": self.switch.parse(environ.get(self.switch.env))}
        for knob in self.knobs:
            values[knob.name] = knob.parse(environ.get(knob.env))
        return values

    def enabled(self, environ: Mapping[str, str] | None = None) -> bool:
        """Whether the feature's switch is on in `environ` (default: this process's environment)."""
        environ = os.environ if environ is None else environ
        return bool(self.switch.parse(environ.get(self.switch.env)))

    def ratio(self, name: str) -> Ratio:
        """The feature's ratio called `name`; KeyError naming the known ones when it has none."""
        for r in self.ratios:
            if r.name == name:
                return r
        known = ", ".join(r.name for r in self.ratios) or "none"
        raise KeyError(f"feature {self.name} has no ratio {name!r} (known: {known})")


_DT = "KILN_DRAFT_TRUNC"
_DT_METRIC = "kiln_draft_trunc_{}_total"

DRAFT_TRUNC = Feature(
    name="draft-trunc",
    module="kiln_engine.draft_trunc",
    vllm_module="vllm.v1.worker.gpu.spec_decode.draft_trunc",
    switch=Knob("enabled", _DT, "flag", False, doc="turn draft truncation on"),
    knobs=(
        Knob(
            "tau", f"{_DT}_TAU", "float", 0.25, 0.0, 1.0, "keep draft m while its predicted survival p_1*...*p_m >= tau"
        ),
        Knob("min_keep", f"{_DT}_MIN_KEEP", "int", 1, 0, 1 << 16, "never keep fewer drafts"),
        Knob(
            "warmup", f"{_DT}_WARMUP", "int", 1, 0, 1 << 30, "acceptance-estimator refits before the first truncation"
        ),
        Knob(
            "explore",
            f"{_DT}_EXPLORE",
            "float",
            0.05,
            0.0,
            1.0,
            "share of (step, request) pairs that verify every draft",
        ),
        Knob(
            "log_interval",
            f"{_DT}_LOG_INTERVAL",
            "int",
            0,
            0,
            1 << 30,
            "log a summary and publish the counters every N steps (0: off)",
        ),
        Knob("with_av", f"{_DT}_WITH_AV", "flag", False, doc="also truncate when adaptive verification is on"),
        Knob(
            "av_calibrate",
            f"{_DT}_AV_CALIBRATE",
            "flag",
            False,
            doc="with adaptive verification and KILN_DRAFT_TRUNC_WITH_AV=1 (cost policy): size "
            "its draft budget and admit its drafts from survivals corrected by "
            "draft-trunc's calibration",
        ),
        Knob(
            "av_min_batch",
            f"{_DT}_AV_MIN_BATCH",
            "int",
            1,
            0,
            1 << 20,
            "with AV_CALIBRATE: leave adaptive verification's confidences as they are below this "
            "many requests (where the hook costs more than the correction wins)",
        ),
        Knob(
            "av_timing",
            f"{_DT}_AV_TIMING",
            "flag",
            False,
            doc="with AV_CALIBRATE and LOG_INTERVAL: time the AV_CALIBRATE hook in the engine "
            "(CUDA events and the host clock, read without waiting) into the statistics",
        ),
        Knob(
            "policy",
            f"{_DT}_POLICY",
            "choice",
            "auto",
            doc="cost: choose tau on the device each step from the verify-cost model; tau: the fixed "
            "tau; auto: tau when KILN_DRAFT_TRUNC_TAU is set, else cost",
            choices=("auto", "cost", "tau"),
        ),
        Knob(
            "other_share",
            f"{_DT}_OTHER_SHARE",
            "float",
            0.5,
            0.0,
            0.95,
            "share of a full verify step's time outside the routed experts (cost policy; an assumption)",
        ),
        Knob(
            "moe_layer",
            f"{_DT}_MOE_LAYER",
            "moe_layer",
            None,
            doc="price routed experts as this layer (EXPERTS,TOP_K,EXPERT_BYTES) instead of the "
            "served model's config (cost policy): e.g. a CPU twin priced as its GPU sibling",
        ),
        Knob(
            "draft_cost",
            f"{_DT}_DRAFT_COST",
            "draft_cost",
            (),
            doc="cost policy: what one drafting position costs, as a share of a fully verified "
            "step, at some batch sizes (REQS:SHARE[:FIRST],...; FIRST: the drafter's first "
            "pass in such shares); unset: drafting is not priced",
        ),
        Knob(
            "depth",
            f"{_DT}_DEPTH",
            "flag",
            False,
            doc="cost policy: also decide how far to draft, after each drafted position "
            "(needs KILN_DRAFT_TRUNC_DRAFT_COST; a host sync per drafting step)",
        ),
        Knob(
            "trace",
            f"{_DT}_TRACE",
            "path",
            "",
            doc="append one JSON line per verify step to this file (predictions and outcomes)",
        ),
    ),
    metrics=tuple(
        _DT_METRIC.format(k)
        for k in (
            "proposed",
            "kept",
            "accepted",
            "dead",
            "expert_slots_saved",
            "wasted",
            "boundary",
            "tokens",
            "av_steps",
            "av_stepped_aside",
            "av_drafts",
            "av_survival_raw",
            "av_survival_corrected",
            "av_survival_shift",
            "av_hook_timed",
            "av_hook_seconds",
            "av_hook_host_seconds",
            "graded",
            "excluded",
        )
    ),
    ratios=(
        Ratio(
            "dead_fraction",
            _DT_METRIC.format("dead"),
            _DT_METRIC.format("tokens"),
            "share of scheduled tokens whose routed experts were skipped",
        ),
        Ratio(
            "acceptance",
            _DT_METRIC.format("accepted"),
            _DT_METRIC.format("kept"),
            "accepted share of the drafts kept for verification",
        ),
        Ratio(
            "kept_fraction",
            _DT_METRIC.format("kept"),
            _DT_METRIC.format("proposed"),
            "share of proposed drafts that were verified",
        ),
        Ratio(
            "av_correction",
            _DT_METRIC.format("av_survival_corrected"),
            _DT_METRIC.format("av_survival_raw"),
            "kiln-av: corrected / estimated survival of the drafts it corrected (1: no net change)",
        ),
        Ratio(
            "av_hook_seconds_per_step",
            _DT_METRIC.format("av_hook_seconds"),
            _DT_METRIC.format("av_hook_timed"),
            "kiln-av: GPU seconds of its hook per timed step (KILN_DRAFT_TRUNC_AV_TIMING=1)",
        ),
    ),
    # start, statistics interval, periodic summary (last: what smoke waits for)
    log_lines=("draft_trunc on:", "draft_trunc statistics:", "draft_trunc: steps="),
    start_line="draft_trunc on:",
    # flush within the smoke test's handful of requests
    smoke_env={f"{_DT}_LOG_INTERVAL": "20"},
    # enough verify steps past the estimator's warm-up (100 steps) for a few flushes
    smoke_load=(8, 64),
)

FEATURES: tuple[Feature, ...] = (DRAFT_TRUNC,)


def by_name(name: str) -> Feature:
    """The feature called `name`; KeyError when there is none."""
    for feature in FEATURES:
        if feature.name == name:
            return feature
    raise KeyError(name)


def states(environ: Mapping[str, str] | None = None) -> dict[str, bool]:
    """Each feature's name and whether it is on in `environ`."""
    return {f.name: f.enabled(environ) for f in FEATURES}


def describe(feature: Feature) -> dict[str, Any]:
    """The declaration as plain data (`python -m kiln_engine info --json`)."""
    return {
        "env": feature.env,
        "knobs": {k.env: k.default for k in feature.knobs},
        "metrics": list(feature.metrics),
        "ratios": {r.name: [r.numerator, r.denominator] for r in feature.ratios},
    }


class UnsafeConfiguration(RuntimeError):
    """A feature combination that would produce wrong tokens: refuse to start."""


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Parse every feature's knobs (a bad value stops start-up, naming the variable),
    then refuse combinations we can see from the environment alone, at plugin load."""
    environ = environ if environ is not None else os.environ
    for feature in FEATURES:
        try:
            feature.read(environ)
        except ValueError as exc:
            raise UnsafeConfiguration(f"kiln-engine: {feature.name}: {exc}") from None
    if DRAFT_TRUNC.enabled(environ):
        skip = environ.get("VLLM_MOE_SKIP_PADDING", "1").strip().lower()
        if skip not in _TRUE:
            raise UnsafeConfiguration(
                "kiln-engine: KILN_DRAFT_TRUNC=1 needs VLLM_MOE_SKIP_PADDING=1 (dead draft tokens are "
                "skipped through the MoE padding mask); set it or turn draft-trunc off"
            )
        # vLLM reads this variable as bool(int(value))
        runner = environ.get("VLLM_USE_V2_MODEL_RUNNER", "").strip()
        if runner.lstrip("+-").isdigit() and int(runner) == 0:
            raise UnsafeConfiguration(
                f"kiln-engine: KILN_DRAFT_TRUNC=1 needs Model Runner V2, but "
                f"VLLM_USE_V2_MODEL_RUNNER={runner} selects the V1 runner, which has no "
                "draft-trunc hooks; unset it or turn draft-trunc off"
            )
