"""Fit the routed-expert cost model to the H200 benchmark and state its error.

Reads benchmarks/draft_trunc/results-2026-11-30-h200.json (bench_moe.py's 16
points: 8-512 requests x dead 0-75%), fits

    t_routed = t_fixed + t_byte * U * expert_bytes + t_token * N + t_route * L * top_k

(non-negative least squares on relative error), and prints, per point, the
measured time, the fit with the measured experts touched U, and the fit with U
from the routing model (uniform, and a Zipf-skewed variant), plus the error
summary. ``--check`` exits 1 if the constants in _cost.H200_FIT drift from a
fresh fit by more than 1%.

Usage: python benchmarks/draft_trunc/fit_cost.py [--json FILE] [--check]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kiln_engine.draft_trunc import _cost
from kiln_testkit import dt_cost

HERE = Path(__file__).resolve().parent

DEFAULT_JSON = HERE / "results-2026-11-30-h200.json"


def report(rows: list[dict], layer: _cost.MoELayer) -> dict:
    fit = dt_cost.fit_routed_cost(rows, layer)
    measured_u = dt_cost.fit_errors(rows, layer, fit, expected=False)
    model_u = dt_cost.fit_errors(rows, layer, fit, expected=True)
    lines = []
    for r, e1, e2 in zip(rows, measured_u, model_u, strict=True):
        live = r["tokens"] - round(r["dead_frac"] * r["tokens"])
        lines.append(
            f"R={r['requests']:<4} dead={r['dead_frac']:.2f} live={live:<5} "
            f"U={r['experts_touched']:<3} (model {_cost.experts_touched(layer, live):6.1f}) "
            f"measured={r['routed_skip_us']:7.0f} us  fit(U measured) {e1:+6.1%}  fit(U model) {e2:+6.1%}"
        )

    def stats(errs):
        return {
            "max_abs": max(abs(e) for e in errs),
            "rms": (sum(e * e for e in errs) / len(errs)) ** 0.5,
        }

    return {
        "fit": vars(fit),
        "lines": lines,
        "measured_u": stats(measured_u),
        "model_u": stats(model_u),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    rows = json.loads(args.json.read_text())["moe"]
    layer = _cost.MoELayer()
    out = report(rows, layer)
    print("\n".join(out["lines"]))
    f = out["fit"]
    print(
        f"fit: t_fixed={f['t_fixed']:.2f} us, t_byte={f['t_byte']:.4e} us/B "
        f"(effective {1.0 / f['t_byte'] / 1e6:.2f} TB/s), t_token={f['t_token']:.4f} us, "
        f"t_route={f['t_route']:.4f} us"
    )
    for name in ("measured_u", "model_u"):
        s = out[name]
        print(f"error with U {name.split('_')[0]}: max {s['max_abs']:.1%}, rms {s['rms']:.1%}")
    for skew in (0.0, 0.5, 1.0):
        skewed = _cost.MoELayer(skew=skew)
        touched = [round(_cost.experts_touched(skewed, n)) for n in (5, 10, 20, 40, 160, 640)]
        print(f"experts touched, skew {skew}: live 5/10/20/40/160/640 -> {touched}")
    if args.check:
        now = _cost.H200_FIT
        drift = [abs(getattr(now, k) - v) / max(abs(v), 1e-30) for k, v in f.items() if v]
        if max(drift, default=0.0) > 0.01:
            print(f"H200_FIT drifted from the fit: {now} vs {f}")
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
