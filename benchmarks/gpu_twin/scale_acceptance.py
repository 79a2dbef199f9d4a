"""The scale twin's informative acceptance: a table made from recorded draft windows.

The twin's patch 0005 (`KILN_GPU_TWIN_ACCEPTANCE=<table.json>`) gives each request slot a
level that persists across steps, and each step draws one recorded draft window near
that level: the acceptance estimator reads the window's recorded confidences, and the
sampler accepts draft i with the probability such a confidence had in the recording.

The recording is benchmarks/draft_trunc/traces/ (tiny-kindling on vLLM's V2 runner, every
draft verified): per window the estimator's conditional predictions p[i] and how many
drafts were accepted. From it:
- features[n][i] = logit(p[i]), the windows sorted by their mean (the level axis);
- accept_logits[n][i] = logit of the acceptance that windows with such a p[i] had at
  position i (binned by quantile, add-one smoothed): the recording's own calibration;
- shift[i], one per position, added to both, so that the mean conditional acceptance is
  the level the recipe's traffic is priced at (flat rates [0.8, 0.6, 0.45, 0.33]
  unconditional by default). The recording's level is its twin's (0.13-0.16: half its
  requests sampled against a greedy drafter), not production's; its spread between and
  within requests is what the table keeps.

Standard library only: it runs on the host (tests) and on the device.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

TRACES = Path(__file__).resolve().parents[1] / "draft_trunc" / "traces"
FLAT_RATES = (0.8, 0.6, 0.45, 0.33)  # unconditional per position: the probe's rates
BINS = 10
WINDOW = 0.05  # a slot's draws come from within +-5% of the windows around its level
RENEW = 1 / 64  # a slot's level is redrawn about once per 64 steps (a request's life)
_CLAMP = 8.0  # log-odds bound: p of 0 or 1 in a recording are finite here


def _logit(p: float) -> float:
    p = min(max(p, 1 / (1 + math.exp(_CLAMP))), 1 / (1 + math.exp(-_CLAMP)))
    return math.log(p / (1 - p))


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def conditional(rates: tuple[float, ...] | list[float]) -> list[float]:
    """Unconditional per-position rates -> the conditional ones (vLLM's conversion)."""
    out, prev = [], 1.0
    for rate in rates:
        out.append(rate / prev if prev > 0 else 0.0)
        prev = rate
    return out


def windows(paths: list[Path]) -> list[tuple[list[float], int]]:
    """(p, accepted) of every fully predicted, fully verified window in the traces."""
    out = []
    for path in paths:
        for line in path.read_text().splitlines():
            step = json.loads(line)
            for req in step["reqs"]:
                p = req["p"]
                if req["n"] == step["k"] == req["kept"] and all(x is not None for x in p):
                    out.append(([float(x) for x in p], int(req["accepted"])))
    if not out:
        raise ValueError(f"no usable draft windows in {', '.join(str(p) for p in paths)}")
    return out


def _calibration(rows: list[tuple[list[float], int]], position: int) -> tuple[list[float], list[float]]:
    """Quantile bin edges of p at `position` among windows that reached it, and each
    bin's smoothed acceptance."""
    reached = sorted((p[position], accepted > position) for p, accepted in rows if accepted >= position)
    edges = [reached[min(len(reached) - 1, (len(reached) * b) // BINS)][0] for b in range(1, BINS)]
    hits, seen = [1.0] * BINS, [2.0] * BINS
    for p, hit in reached:
        b = _bin(edges, p)
        hits[b] += hit
        seen[b] += 1
    return edges, [h / n for h, n in zip(hits, seen, strict=True)]


def _bin(edges: list[float], p: float) -> int:
    return sum(1 for e in edges if p > e)


def _shift(accept_logits: list[float], target: float) -> float:
    """The log-odds offset that makes the mean of sigmoid(x + shift) equal target."""
    low, high = -30.0, 30.0
    for _ in range(60):
        mid = (low + high) / 2
        if sum(_sigmoid(x + mid) for x in accept_logits) / len(accept_logits) < target:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def table(paths: list[Path] | None = None, rates: tuple[float, ...] = FLAT_RATES) -> dict[str, object]:
    """The document patch 0005 reads."""
    paths = paths or sorted(TRACES.glob("*.jsonl"))
    rows = windows(paths)
    k = min(len(rates), len(rows[0][0]))
    rows.sort(key=lambda row: sum(row[0][:k]) / k)
    calibration = [_calibration(rows, i) for i in range(k)]
    accept = [[_logit(calibration[i][1][_bin(calibration[i][0], p[i])]) for i in range(k)] for p, _ in rows]
    targets = conditional(rates)[:k]
    shift = [_shift([a[i] for a in accept], targets[i]) for i in range(k)]
    return {
        "source": [p.name for p in paths],
        "windows": len(rows),
        "rates": list(rates[:k]),
        "conditional": targets,
        "recorded_acceptance": [
            sum(a > i for _, a in rows if a >= i) / sum(1 for _, a in rows if a >= i) for i in range(k)
        ],
        "calibration": [bins for _, bins in calibration],
        "features": [[round(_logit(x), 4) for x in p[:k]] for p, _ in rows],
        "accept_logits": [[round(x, 4) for x in a] for a in accept],
        "shift": [round(s, 4) for s in shift],
        "window": WINDOW,
        "renew": RENEW,
    }


def spread(doc: dict[str, object]) -> dict[str, float]:
    """What the table keeps of the recording: the acceptance at position 1 of the
    lowest and highest tenth of levels, after the shift (1.0 would be a flat table)."""
    accept = doc["accept_logits"]
    shift = doc["shift"]
    if not isinstance(accept, list) or not isinstance(shift, list):
        raise TypeError("not an acceptance table: accept_logits and shift must be lists")
    tenth = max(1, len(accept) // 10)
    low = sum(_sigmoid(a[0] + shift[0]) for a in accept[:tenth]) / tenth
    high = sum(_sigmoid(a[0] + shift[0]) for a in accept[-tenth:]) / tenth
    return {"low_tenth": round(low, 3), "high_tenth": round(high, 3)}


if __name__ == "__main__":
    import sys

    doc = table()
    Path(sys.argv[1]).write_text(json.dumps(doc))
    print(json.dumps({k: doc[k] for k in ("windows", "conditional", "recorded_acceptance", "shift")}), spread(doc))
