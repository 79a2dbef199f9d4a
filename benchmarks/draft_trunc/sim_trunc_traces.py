"""sim_trunc's traces: recorded acceptance traces read and checked line by line, synthetic
ones drawn from a Beta prior, and the survival of each draft position."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
ALPHAS = (0.3, 0.5, 0.7, 0.9)

TRACE_GLOB = "traces/*.jsonl"


class TraceError(ValueError):
    """A trace line that cannot be replayed: 'file:line: field: problem'."""


@dataclass
class Records:
    """Request-step records: predictions, drafts proposed, drafts accepted."""

    p: np.ndarray  # [M, K] fp64, NaN where the estimator had none
    n: np.ndarray  # [M] drafts proposed
    accepted: np.ndarray  # [M]
    source: str
    censored: int = 0  # records dropped: all kept drafts accepted with kept < n

    @property
    def k(self) -> int:
        return self.p.shape[1]

    @property
    def acceptance(self) -> float:
        """Accepted drafts per proposed draft."""
        return float(self.accepted.sum() / max(self.n.sum(), 1))

    @property
    def conditional_acceptance(self) -> float:
        """Accepted share of the drafts actually tested: a window accepting a of
        n tested a + 1 (a if it accepted all); the synthetic traces' alpha."""
        tested = np.minimum(self.accepted + 1, self.n)
        return float(self.accepted.sum() / max(tested.sum(), 1))


def _field(where: str, obj: dict, name: str, kind):
    if not isinstance(obj, dict) or name not in obj:
        raise TraceError(f"{where}: {name}: missing")
    value = obj[name]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise TraceError(f"{where}: {name}: expected an integer, got {value!r}")
    if kind is list and not isinstance(value, list):
        raise TraceError(f"{where}: {name}: expected a list, got {type(value).__name__}")
    return value


def read_trace(path: Path) -> Records:
    """Request records of a KILN_DRAFT_TRUNC_TRACE file (TraceError on bad lines).

    Records whose window was cut before its first rejection (accepted == kept <
    n) are censored: how far it would have gone is unknown, so they are
    dropped and counted.
    """
    ps, ns, accs, k, censored = [], [], [], None, 0
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            step = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{where}: not JSON ({exc.msg})") from None
        step_k = _field(where, step, "k", int)
        if step_k < 1 or (k is not None and step_k != k):
            raise TraceError(f"{where}: k: {step_k} (expected {k or 'a positive integer'})")
        k = step_k
        for i, req in enumerate(_field(where, step, "reqs", list)):
            at = f"{where}: reqs[{i}]"
            p = _field(at, req, "p", list)
            if len(p) != k or not all(x is None or isinstance(x, (int, float)) for x in p):
                raise TraceError(f"{at}: p: expected {k} numbers or nulls")
            kept = _field(at, req, "kept", int)
            acc = _field(at, req, "accepted", int)
            n = req.get("n", k)
            if not isinstance(n, int) or not 0 <= n <= k:
                raise TraceError(f"{at}: n: {n!r} not in [0, {k}]")
            if not 0 <= kept <= n:
                raise TraceError(f"{at}: kept: {kept} not in [0, n={n}]")
            if not 0 <= acc <= kept:
                raise TraceError(f"{at}: accepted: {acc} not in [0, kept={kept}]")
            if n == 0:
                continue
            if acc == kept < n:
                censored += 1
                continue
            ps.append([math.nan if x is None else float(x) for x in p])
            ns.append(n)
            accs.append(acc)
    if not ps:
        raise TraceError(f"{path}: no uncensored verify records")
    return Records(np.array(ps), np.array(ns), np.array(accs), Path(path).stem, censored)


def synthetic(alpha: float, count: int, k: int, rng, concentration: float = 3.0) -> Records:
    """Calibrated predictions with mean conditional acceptance ``alpha``."""
    p = rng.beta(alpha * concentration, (1 - alpha) * concentration, size=(count, k))
    accept = rng.random((count, k)) < p
    accepted = np.cumprod(accept, axis=1).sum(axis=1)
    return Records(p, np.full(count, k), accepted, f"synthetic-a{alpha:.1f}")


def survival(p: np.ndarray, n: np.ndarray) -> np.ndarray:
    """S_m per draft as the kernel computes it (NaN -> 1, clamped), 0 past n."""
    k = p.shape[-1]
    q = np.where(np.isnan(p), 1.0, np.clip(p, 0.0, 1.0))
    s = np.cumprod(q.astype(np.float32), axis=-1).astype(np.float64)
    return np.where(np.arange(k) < n[..., None], s, 0.0)


def load_traces(paths: list[Path], k: int, rng, synthetic_records: int) -> list[Records]:
    traces = [synthetic(a, synthetic_records, k, rng) for a in ALPHAS]
    for path in paths:
        traces.append(read_trace(path))
    return traces
