"""Knobs of draft_trunc, as the feature registry (``kiln_engine.features``) parses them.

The registry holds the one parser of ``KILN_DRAFT_TRUNC*`` (the plugin, kiln's smoke
test and this module all go through it); this module only gives the result a typed
shape. Pure Python on purpose: importing the package must stay cheap and must not pull
torch, triton or vLLM.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ..features import DRAFT_TRUNC

PREFIX = DRAFT_TRUNC.env
_DEFAULT = {knob.name: knob.default for knob in DRAFT_TRUNC.knobs}


@dataclass(frozen=True)
class Knobs:
    """The truncation policy and its bookkeeping.

    tau: keep draft m while its survival S_m = p_1 * ... * p_m >= tau.
    min_keep: never keep fewer drafts than this (nor more than were proposed).
    warmup: acceptance-estimator refits to wait for before truncating at all.
    explore: share of (step, slot) pairs that verify every draft, so the
        estimator keeps seeing labels for deep positions.
    log_interval: flush the device-side statistics every this many steps (0: off).
    with_av: also truncate when adaptive verification is on.
    av_calibrate: feed adaptive verification survivals corrected by the cost
        policy's calibration (``_av.av_confidences``; needs ``with_av``).
    av_min_batch: below this many requests ``av_calibrate``'s hook steps aside.
    av_timing: time ``av_calibrate``'s hook into the statistics (needs
        ``av_calibrate`` and ``log_interval``).
    policy: "cost" picks tau on the device every step, maximising expected
        tokens per unit of verify time; "tau" keeps the fixed ``tau``. Default:
        "tau" when KILN_DRAFT_TRUNC_TAU is set, else "cost".
    other_share: share of a verify step's time outside the routed experts when
        every draft is verified (policy "cost"; not measured, an assumption).
    moe_layer: (experts, top_k, expert_bytes) the cost-aware policy prices
        instead of the served model's MoE shape (None: the model's).
    draft_cost: (requests, share, first) points: what drafting costs (policy "cost";
        () : drafting not priced); see ``_cost.DraftCost``.
    depth: also decide how far to draft (policy "cost", needs ``draft_cost``).
    trace: append one JSON line per verify step to this file ("" : off).
    """

    enabled: bool = DRAFT_TRUNC.switch.default
    tau: float = _DEFAULT["tau"]
    min_keep: int = _DEFAULT["min_keep"]
    warmup: int = _DEFAULT["warmup"]
    explore: float = _DEFAULT["explore"]
    log_interval: int = _DEFAULT["log_interval"]
    with_av: bool = _DEFAULT["with_av"]
    av_calibrate: bool = _DEFAULT["av_calibrate"]
    av_min_batch: int = _DEFAULT["av_min_batch"]
    av_timing: bool = _DEFAULT["av_timing"]
    policy: str = "cost"
    other_share: float = _DEFAULT["other_share"]
    moe_layer: tuple[int, int, float] | None = _DEFAULT["moe_layer"]
    draft_cost: tuple[tuple[int, float, float], ...] = _DEFAULT["draft_cost"]
    depth: bool = _DEFAULT["depth"]
    trace: str = _DEFAULT["trace"]


POLICIES = ("cost", "tau")


def env_name(knob: str) -> str:
    """The environment variable of a knob, by its short name (``Knobs``' field)."""
    for declared in DRAFT_TRUNC.knobs:
        if declared.name == knob:
            return declared.env
    raise KeyError(knob)


def read_knobs(env: Mapping[str, str] | None = None) -> Knobs:
    """Knobs from ``env`` (default: os.environ); ValueError naming the bad variable."""
    environ: Mapping[str, str] = os.environ if env is None else env
    values = DRAFT_TRUNC.read(environ)
    # "auto" resolves here because it depends on whether a tau was given, which the
    # parsed value (default or not) no longer says
    tau_set = (environ.get(f"{PREFIX}_TAU") or "").strip() != ""
    if values["policy"] == "auto":
        values["policy"] = "tau" if tau_set else "cost"
    elif values["policy"] == "cost" and tau_set:
        raise ValueError(f"{PREFIX}_POLICY=cost ignores {PREFIX}_TAU: unset one of them")
    if values["depth"] and (values["policy"] != "cost" or not values["draft_cost"]):
        raise ValueError(
            f"{PREFIX}_DEPTH=1 decides how far to draft from the cost policy's prices: it needs "
            f"{PREFIX}_POLICY=cost (no {PREFIX}_TAU) and {PREFIX}_DRAFT_COST"
        )
    if values["av_calibrate"] and (values["policy"] != "cost" or not values["with_av"]):
        raise ValueError(
            f"{PREFIX}_AV_CALIBRATE=1 feeds adaptive verification the cost policy's calibration: "
            f"it needs {PREFIX}_WITH_AV=1 and {PREFIX}_POLICY=cost (no {PREFIX}_TAU)"
        )
    if values["av_timing"] and not (values["av_calibrate"] and values["log_interval"] > 0):
        raise ValueError(
            f"{PREFIX}_AV_TIMING=1 times the {PREFIX}_AV_CALIBRATE hook into the statistics: it "
            f"needs {PREFIX}_AV_CALIBRATE=1 and {PREFIX}_LOG_INTERVAL > 0"
        )
    return Knobs(**values)
