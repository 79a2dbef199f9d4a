"""sim_adaptive's prices: the drafter's per-step cost, kiln-av's hook as bench_av.py measured it,
and sim_trunc's verification model with drafting added (one step's time in microseconds)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from kiln_engine.draft_trunc import _cost
from kiln_engine.features import DRAFT_TRUNC
from kiln_testkit.scripts import load_script

sim_policies = load_script("benchmarks/draft_trunc/sim_trunc_policies.py")


HERE = Path(__file__).resolve().parent
K = 4
PROFILE_SIZES = (1, 4, 16, 64, 256)  # vLLM's generate_config.py default batch sizes
PROFILE_TRACE = "synthetic-a0.7"
# kiln-av: shrinkage of each cell's correction toward none (pseudo-drafts; 8, what
# draft-trunc's truncation uses, lost up to 0.4% to noise on calibrated traffic)
AV_PRIOR = 64.0
THETAS = tuple(round(0.1 * i, 1) for i in range(10))
# the rules vLLM 0.32.0/0.33.0 ship: the batch-size schedule (as profiled, and its
# hindsight best K) and adaptive verification (on the best K, and on the schedule)
SHIPPED = ("vllm-schedule", "vllm-best-K", "vllm-av", "vllm-schedule+av")
UPSTREAM = (*SHIPPED, "confidence")  # and vllm#35301's exit, in no released vLLM
# kiln-av's hook, measured on an H100 (bench_av.py): eager and compiled, and fused once
# a run of the fused kernel is committed; the engine's default for stepping aside
HOOK_PRICES = HERE / "results-2026-12-07-h100-av-hook-fused.json"
AV_MIN_BATCH = next(k.default for k in DRAFT_TRUNC.knobs if k.name == "av_min_batch")


@dataclass(frozen=True)
class Drafter:
    """What drafting costs: ``_cost.DraftCost`` (the engine's own arithmetic, the
    KILN_DRAFT_TRUNC_DRAFT_COST knob), shares of a fully verified step at the same
    batch: one further position costs ``share``, the first pass ``first`` such
    shares; D >= 1 positions cost share x (first + D - 1), D = 0 pays the first pass
    (vLLM keeps the draft's KV cache in step)."""

    name: str
    cost: _cost.DraftCost

    def share(self, reqs: int) -> float:
        return self.cost.at(reqs)[0]

    def first(self, reqs: int) -> float:
        return self.cost.at(reqs)[1]

    def step_us(self, model, reqs: int, depth) -> np.ndarray:
        full = float(model.step_us(reqs * (1 + K), reqs * (1 + K), reqs))
        share, first = self.cost.at(reqs)
        d = np.asarray(depth, dtype=np.float64)
        return full * share * (first + np.maximum(d - 1, 0))

    @property
    def knob(self) -> str:
        """The KILN_DRAFT_TRUNC_DRAFT_COST value that prices drafting as here."""
        return ",".join(f"{r}:{s:.4g}:{f:.3g}" for r, s, f in self.cost.points)


def constant_drafter(share: float) -> Drafter:
    return Drafter(f"share{share:g}", _cost.DraftCost(((1, share, 1.0),)))


def table_drafter(name: str, points: dict[int, tuple[float, float]]) -> Drafter:
    """Shares measured at some batch sizes, interpolated in log(batch)."""
    return Drafter(name, _cost.DraftCost(tuple((r, *points[r]) for r in sorted(points))))


@dataclass(frozen=True)
class HookPrice:
    """What kiln-av's hook costs a step, as a share of a fully verified step at the same
    batch (``bench_av.py``'s ``share_of_step``: the larger of its GPU and host time over
    the TP-8 verify step ``fit_draft.py`` prices), measured at some batch sizes,
    interpolated in log(batch) and held flat past the ends."""

    name: str
    points: tuple[tuple[int, float], ...]

    def share(self, reqs: int) -> float:
        xs = np.log([r for r, _ in self.points])
        return float(np.interp(np.log(reqs), xs, [v for _, v in self.points]))

    def step_us(self, model, reqs: int) -> float:
        return float(model.step_us(reqs * (1 + K), reqs * (1 + K), reqs)) * self.share(reqs)


NO_HOOK_PRICE = HookPrice("none", ((1, 0.0),))


def hook_prices(path: Path) -> dict[str, HookPrice]:
    """Every variant a bench_av.py result prices (``<variant>_share_of_step``), and none."""
    rows = json.loads(path.read_text())["rows"]
    suffix = "_share_of_step"
    names = dict.fromkeys(k[: -len(suffix)] for row in rows for k in row if k.endswith(suffix))
    prices = {"none": NO_HOOK_PRICE}
    for name in names:
        points = tuple(
            (int(row["requests"]), float(row[name + suffix]))
            for row in rows
            if row.get(name + suffix) is not None and np.isfinite(row[name + suffix])
        )
        prices[name] = HookPrice(name, points)
    return prices


class AdaptiveModel(sim_policies.Model):
    """sim_trunc's verify-step model, with the non-routed time depending on how many
    tokens are scheduled, which a shorter K changes (truncation never does).

    ``other_share`` still fixes the non-routed time at full verification (N_full = R x
    (1 + K) tokens); a share phi(R) of it grows with the tokens (attention, shared
    expert and lm_head arithmetic), the rest is paid whatever N is (their weights, the
    KV cache reads, the runner): other(N) = other(N_full) x (1 - phi + phi N / N_full),
    phi = N_full / (N_full + other_half), ``other_half`` fitted to the H200
    (``bench_draft.py``: where the measured non-routed time is half per-token)."""

    def __init__(self, other_half: float, **kw):
        super().__init__(**kw)
        self.other_half = other_half

    def phi(self, reqs: int) -> float:
        full = reqs * (1 + K)
        return full / (full + self.other_half)

    def step_us(self, live, tokens, reqs=None):  # type: ignore[override]
        live = np.clip(live, 0, self.max_tokens).astype(int)
        tokens = np.asarray(tokens).astype(int)
        if reqs is None:  # sim_trunc's callers: other at the scheduled tokens
            return super().step_us(live, tokens)
        full = reqs * (1 + K)
        shared = self.cost.t_fixed + self.cost.t_token * tokens
        other_full = self.ratio * (self.table[full] + self.cost.t_fixed + self.cost.t_token * full)
        phi = self.phi(reqs)
        other = other_full * (1 - phi + phi * tokens / full)
        return self.moe_layers * (shared + other + self.table[live])
