"""Cost of one verify step, for the cost-aware truncation policy.

Routed-expert time of one MoE layer, fitted to the H200 benchmark
(``benchmarks/draft_trunc/results-2026-11-30-h200.json``, 16 points):

    t_routed(L, N) = t_fixed + t_byte * U(L) * expert_bytes + t_token * N + t_route * L * top_k

L: live tokens (their routes reach the experts), N: all scheduled tokens (the
router, sort and scatter still see dead ones), U(L): experts touched by the live
tokens. The layer streams each touched expert's weights once, so U(L) carries
almost all of it; the fit says what a live route costs beyond that.

U(L) follows from routing: each token picks ``top_k`` distinct experts of
``experts``. With uniform routing an expert is missed by one token with
probability ``1 - top_k / experts``, so ``U = E * (1 - (1 - k/E)^L)``, the upper
bound for a given L. Real routers are skewed; with expert popularity
``w_e ~ (e + 1)^-skew`` (Zipf), expert e is hit by a token with probability
``min(1, k * w_e)`` and ``U = sum_e 1 - (1 - min(1, k w_e))^L``: fewer experts
touched, so more to save at small L. ``skew = 0`` is the uniform case.

The rest of a step (attention, dense layers, shared experts, lm_head, the
drafter, the runner) is not measured here. Dead draft rows still run all of it,
so truncation never changes it: it enters only as a constant in the
denominator, ``other_share`` of the step's time when every draft is verified
(``KILN_DRAFT_TRUNC_OTHER_SHARE``). Only ratios of times matter to the policy,
so the number of MoE layers cancels.

Pure Python: importing it must stay cheap. The fit of the coefficients and the
numpy twin of the device policy (what the simulator replays and the tests check
the kernel against) live in ``kiln_testkit.dt_cost``, outside the engine image.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

# The cost-aware policy chooses tau among g / TAU_GRID, g = 0..TAU_GRID-1: a
# power of two, so every candidate is exact in fp32 and tau = 0 is one of them.
TAU_GRID = 32

# Online calibration of the estimator (see ``calibrated_values``). CAL_PRIOR:
# pseudo-drafts that vouch for the prediction itself in a cell with no grades yet
# (a power of two, so an empty cell gives back its bin's middle exactly in fp32).
# CAL_CAP: grades per cell before both counts are halved, so that the
# calibration follows a drifting estimator (a half-life of ~CAL_CAP grades).
CAL_PRIOR = 8.0
CAL_CAP = 4096.0


@dataclass(frozen=True)
class MoELayer:
    """The shape that decides what a routed-expert pass costs."""

    experts: int = 256
    top_k: int = 8
    expert_bytes: float = 3 * 6144 * 2048 * 2  # gate + up + down, bf16 (GLM-5-like)
    skew: float = 0.0  # Zipf exponent of expert popularity; 0 = uniform


@dataclass(frozen=True)
class RoutedCost:
    """Per-layer routed-expert time coefficients, microseconds."""

    t_fixed: float
    t_byte: float  # per byte of touched expert weights
    t_token: float  # per scheduled token (live or dead)
    t_route: float  # per live route (live token x top_k)


# Fitted by ``kiln_testkit.dt_cost.fit_routed_cost`` to the H200 table (see
# benchmarks/draft_trunc/fit_cost.py, which re-derives and checks these;
# tests/draft_trunc/test_cost.py fails if they drift from the JSON).
H200_FIT = RoutedCost(t_fixed=298.96, t_byte=3.0107e-07, t_token=0.76686, t_route=0.0)


def hit_probabilities(layer: MoELayer) -> list[float]:
    """Probability that one token routes to each expert."""
    e, k = layer.experts, layer.top_k
    if layer.skew <= 0.0:
        return [k / e] * e
    w = [(i + 1) ** -layer.skew for i in range(e)]
    total = sum(w)
    return [min(1.0, k * x / total) for x in w]


def experts_touched(layer: MoELayer, live: float) -> float:
    """Expected number of distinct experts the ``live`` tokens route to."""
    if live <= 0:
        return 0.0
    if layer.skew <= 0.0:
        return layer.experts * -math.expm1(live * math.log1p(-layer.top_k / layer.experts))
    return sum(1.0 if p >= 1.0 else -math.expm1(live * math.log1p(-p)) for p in hit_probabilities(layer))


def live_table(layer: MoELayer, cost: RoutedCost, max_tokens: int) -> list[float]:
    """The live-token-dependent part of t_routed(L, N) (the formula above) for
    L = 0..max_tokens.

    The policy kernel reads it by index, so any routing model works on device.
    """
    return [
        cost.t_byte * experts_touched(layer, n) * layer.expert_bytes + cost.t_route * n * layer.top_k
        for n in range(max_tokens + 1)
    ]


def other_ratio(other_share: float) -> float:
    """Non-routed time per unit of routed time at full verification."""
    return other_share / (1.0 - other_share)


@dataclass(frozen=True)
class DraftCost:
    """What drafting costs, as shares of a fully verified step at the same batch
    (``KILN_DRAFT_TRUNC_DRAFT_COST``).

    ``points``: (verifying requests, share of one further drafting position,
    first pass in units of that share), sorted by requests; between them the
    share and the first pass are interpolated in log(requests), past the ends
    they stay at the end's value. Drafting D >= 1 positions costs
    share x (first + D - 1) of the full step; D = 0 pays the first pass too
    (vLLM runs it to keep the draft's KV cache in step). No points: drafting is
    not priced."""

    points: tuple[tuple[int, float, float], ...] = ()

    def at(self, reqs: int) -> tuple[float, float]:
        """(share, first) at ``reqs`` verifying requests."""
        pts = self.points
        if not pts:
            return 0.0, 0.0
        if reqs <= pts[0][0]:
            return pts[0][1], pts[0][2]
        for (r0, s0, f0), (r1, s1, f1) in itertools.pairwise(pts):
            if reqs <= r1:
                w = math.log(reqs / r0) / math.log(r1 / r0)
                return s0 + w * (s1 - s0), f0 + w * (f1 - f0)
        return pts[-1][1], pts[-1][2]

    def positions(self, reqs: int, depth: int) -> float:
        """Drafting D positions, in units of a fully verified step."""
        share, first = self.at(reqs)
        return share * (first + max(depth - 1, 0))
