"""Knobs of draft_trunc, read from ``KILN_DRAFT_TRUNC*`` environment variables.

Pure Python on purpose: importing the package must stay cheap and must not pull
torch, triton or vLLM. The ``KILN_`` prefix keeps vLLM's unknown-``VLLM_*``
check quiet, so nothing needs registering in ``vllm/envs.py``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

PREFIX = "KILN_DRAFT_TRUNC"


def _flag(env: dict[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={raw!r}: expected 0/1/true/false")


def _number(env: dict[str, str], name: str, default: float, cast, lo: float, hi: float):
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = cast(raw.strip())
    except ValueError as exc:
        raise ValueError(f"{name}={raw!r}: not a number") from exc
    if not (lo <= value <= hi):  # also rejects NaN
        raise ValueError(f"{name}={raw!r}: must lie in [{lo}, {hi}]")
    return value


@dataclass(frozen=True)
class Knobs:
    """The truncation policy and its bookkeeping.

    tau: keep draft m while its survival S_m = p_1 * ... * p_m >= tau (policy "tau").
    min_keep: never keep fewer drafts than this (nor more than were proposed).
    warmup: acceptance-estimator refits to wait for before truncating at all.
    explore: share of (step, slot) pairs that verify every draft, so the
        estimator keeps seeing labels for deep positions.
    log_interval: flush the device-side statistics every this many steps (0: off).
    with_av: also truncate when adaptive verification is on.
    policy: "cost" picks tau on the device every step, maximising expected
        tokens per unit of verify time; "tau" keeps the fixed ``tau``. Default:
        "tau" when KILN_DRAFT_TRUNC_TAU is set, else "cost".
    other_share: share of a verify step's time outside the routed experts when
        every draft is verified (policy "cost"; not measured, an assumption).
    """

    enabled: bool = False
    tau: float = 0.25
    min_keep: int = 1
    warmup: int = 1
    explore: float = 0.05
    log_interval: int = 0
    with_av: bool = False
    policy: str = "cost"
    other_share: float = 0.5


POLICIES = ("cost", "tau")


def _policy(env: dict[str, str]) -> str:
    """The explicit policy, else "tau" for a recipe that sets a tau, else "cost"."""
    name = f"{PREFIX}_POLICY"
    raw = (env.get(name) or "").strip().lower()
    tau_set = (env.get(f"{PREFIX}_TAU") or "").strip() != ""
    if not raw:
        return "tau" if tau_set else "cost"
    if raw not in POLICIES:
        raise ValueError(f"{name}={env[name]!r}: expected one of {', '.join(POLICIES)}")
    if raw == "cost" and tau_set:
        raise ValueError(f"{name}=cost ignores {PREFIX}_TAU: unset one of them")
    return raw


def read_knobs(env: dict[str, str] | None = None) -> Knobs:
    env = dict(os.environ if env is None else env)
    return Knobs(
        enabled=_flag(env, PREFIX, False),
        tau=_number(env, f"{PREFIX}_TAU", Knobs.tau, float, 0.0, 1.0),
        min_keep=_number(env, f"{PREFIX}_MIN_KEEP", Knobs.min_keep, int, 0, 1 << 16),
        warmup=_number(env, f"{PREFIX}_WARMUP", Knobs.warmup, int, 0, 1 << 30),
        explore=_number(env, f"{PREFIX}_EXPLORE", Knobs.explore, float, 0.0, 1.0),
        log_interval=_number(env, f"{PREFIX}_LOG_INTERVAL", Knobs.log_interval, int, 0, 1 << 30),
        with_av=_flag(env, f"{PREFIX}_WITH_AV", False),
        policy=_policy(env),
        other_share=_number(env, f"{PREFIX}_OTHER_SHARE", Knobs.other_share, float, 0.0, 0.95),
    )
