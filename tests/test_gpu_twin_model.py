"""benchmarks/gpu_twin/model_check.py on runner-format documents made from chosen step
costs: the costs come back, each configuration's tokens/s is predicted from what it
verified, and a configuration that runs slower than its shape prices is the largest
disagreement."""

from __future__ import annotations

import json
import lzma
import math
from pathlib import Path

import pytest
from kiln_testkit.scripts import load_script

mc = load_script("benchmarks/gpu_twin/model_check.py")

LOADS = (1, 4, 8, 32)
T1 = {1: 2.0, 4: 3.0, 8: 3.5, 32: 6.0}  # ms, the step with one token a request, no drafter
# ms per verified draft token; 0 at one request, the launch-bound split's premise
C = {1: 0.0, 4: 0.10, 8: 0.15, 32: 0.08}
D = 1.5  # ms per drafting position
HOOK = {1: 1.0, 4: 1.2, 8: 0.8, 32: 1.5}  # ms a step of draft-trunc's hook
P = (0.7, 0.5, 0.35, 0.25)  # fixed K = 4: accepted per window at each position
SCHEDULE = {1: 1, 4: 2, 8: 2, 32: 3}
REACH = (0.5, 0.3, 0.2, 0.1)  # adaptive verification: windows admitting position i
# twin_models.SHAPES["tiny"]: 8 experts x 3 x 128 x 64 routed, attention and gate beside
ROUTED = 196_608 / (196_608 + 49_152 + 1_024)


def _metrics(c: dict) -> str:
    lab = 'engine="0",model_name="m"'
    lines = [
        f"vllm:spec_decode_num_drafts_total{{{lab}}} {c['drafts']}",
        f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {c['draft_tokens']}",
        f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {c['accepted']}",
    ]
    lines += [
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {a}'
        for i, a in enumerate(c["per_pos"])
    ]
    if c["proposed"]:
        lines += [f"kiln_draft_trunc_proposed_total {c['proposed']}", f"kiln_draft_trunc_kept_total {c['kept']}"]
    return "\n".join(lines) + "\n"


def _shape(name: str, b: int) -> dict:
    """What ``name`` verified at load b, per window: drafts scheduled, verified, kept,
    drafted, accepted at each position; and whether draft-trunc's hook runs."""
    if name == "spec-off":
        return {"sched": 0, "n": 0, "j": 0, "depth": 0, "pos": (), "dt": False}
    if name in ("spec", "dt-cost"):
        return {"sched": 4, "n": 4, "j": 4, "depth": 4, "pos": P, "dt": name == "dt-cost"}
    if name == "dt-tau":  # 1.5 of 4 kept, the rest dead (routed experts skipped)
        return {"sched": 4, "n": 4, "j": 1.5, "depth": 4, "pos": (0.7, 0.15, 0.05, 0.0), "dt": True}
    if name == "shipped":  # the schedule's K, drafted and verified
        k = SCHEDULE[b]
        return {"sched": k, "n": k, "j": k, "depth": k, "pos": P[:k], "dt": True}
    n = sum(REACH)  # adaptive verification: 4 drafted, a prefix admitted
    return {
        "sched": 4,
        "n": n,
        "j": n,
        "depth": 4,
        "pos": tuple(p * r for p, r in zip(P, REACH, strict=True)),
        "dt": name != "av",
    }


def _step_ms(s: dict, b: int, hook: dict[int, float]) -> float:
    verify = C[b] * b * (ROUTED * s["j"] + (1 - ROUTED) * s["n"])
    return T1[b] + verify + D * s["depth"] + (hook[b] if s["dt"] else 0.0)


def _plan_config(name: str) -> dict:
    env = {"KILN_DRAFT_TRUNC": "1" if _shape(name, 1)["dt"] else "0"}
    if name == "spec-off":
        return {"argv": [], "env": env, "speculative_config": None}
    spec: dict = {"method": "draft_model", "model": "d", "num_speculative_tokens": 4}
    if name == "shipped":
        spec["num_speculative_tokens_per_batch_size"] = [[1, 3, 1], [4, 15, 2], [16, 255, 3]]
    if name in ("av", "av-dt", "kiln-av"):
        spec["enable_adaptive_verification"] = True
    return {"argv": [], "env": env, "speculative_config": spec}


def twin_doc(
    hook=HOOK, slower: dict[tuple[str, int], float] | None = None, silent: set[tuple[str, int]] = frozenset()
) -> dict:
    """A runner results document served at exactly the costs above; ``slower`` stretches
    a (config, load)'s step by a factor, ``silent`` leaves its draft-trunc counters still
    (published every 20 steps, a short load may not move them)."""
    names = ["spec-off", "spec", "dt-cost", "dt-tau", "shipped", "av", "av-dt", "kiln-av"]
    configs = {}
    for name in names:
        c = {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0, "per_pos": [0.0] * 4, "proposed": 0.0, "kept": 0.0}
        rows = []
        for b in LOADS:
            s = _shape(name, b)
            before = _metrics(c) if name != "spec-off" else ""
            windows = 1000.0 * b
            accepted = sum(s["pos"])
            c["drafts"] += windows
            c["draft_tokens"] += windows * s["sched"]
            c["accepted"] += windows * accepted
            c["per_pos"] = [t + windows * p for t, p in zip(c["per_pos"], list(s["pos"]) + [0] * 4, strict=False)]
            if s["dt"] and (name, b) not in silent:
                c["proposed"] += windows * s["n"]
                c["kept"] += windows * s["j"]
            step = _step_ms(s, b, hook) * (slower or {}).get((name, b), 1.0)
            rows.append(
                {
                    "load": b,
                    "requests": 4 * b,
                    "tokens": 256 * b,
                    "seconds": 1.0,
                    "tokens_per_s": 1e3 * b * (1 + accepted) / step,
                    "metrics_before": before,
                    "metrics_after": _metrics(c) if name != "spec-off" else "",
                }
            )
        configs[name] = {"timed": rows}
    return {
        "date": "2026-12-08T00:00:00Z",
        "preflight": "torch x gpu FAKE GPU\nvllm 0.33.0",
        "plan": {
            "commit": "c0ffee",
            "recipe": "glm53-kindling",
            "engine": "0.33.0",
            "shape": "tiny",
            "configs": {n: _plan_config(n) for n in names},
        },
        "configs": configs,
    }


def _row(report: dict, config: str, load: int) -> dict:
    return next(r for r in report["rows"] if r["config"] == config and r["load"] == load)


def test_the_chosen_costs_come_back_from_spec_off_and_spec():
    report = mc.check(twin_doc(), Path("doc.json"))
    costs = report["costs"]
    assert costs["draft_position_ms"]["launch-bound"] == pytest.approx(D)
    assert costs["draft_position_ms"]["all-verify"] == 0.0
    assert costs["pinned_at"] == 1 and costs["routed_share"] == pytest.approx(ROUTED)
    for b in LOADS:
        e = costs["loads"][str(b)]
        assert e["t1_ms"] == pytest.approx(T1[b])
        assert e["c_ms_launch-bound"] == pytest.approx(C[b], abs=1e-12)
        assert e["dt_hook_ms"] == pytest.approx(HOOK[b])


def test_each_configuration_is_priced_from_what_it_verified():
    report = mc.check(twin_doc(silent={("kiln-av", 4)}), Path("doc.json"))
    for r in report["rows"]:
        # the hook is priced only in ratio_hook: with it every configuration is served
        # exactly at its shape's price, without it those running the hook are over-predicted
        hooked = r["config"] not in ("spec", "av")
        key = "ratio_hook" if hooked and r["config"] != "dt-cost" else "ratio"
        if r["config"] == "dt-cost":
            assert r["ratio"] == pytest.approx(1 + HOOK[r["load"]] / (r["served_step_ms"] - HOOK[r["load"]]))
        else:
            assert r[key] == pytest.approx(1.0), r
        assert (r["ratio"] > 1.0 + 1e-9) is hooked, r
    # adaptive verification's admitted drafts: counted by draft-trunc where its counters
    # moved, else estimated from acceptance against fixed K (exact here: independent cut)
    assert _row(report, "av", 8)["verified_from"] == "estimated"
    assert _row(report, "kiln-av", 4)["verified_from"] == "estimated"
    assert _row(report, "kiln-av", 8)["verified_from"] == "counted"
    assert _row(report, "av", 8)["verified_per_window"] == pytest.approx(sum(REACH))
    assert _row(report, "shipped", 4)["drafted"] == pytest.approx(SCHEDULE[4])


def test_a_configuration_slower_than_its_shape_is_the_largest_disagreement():
    report = mc.check(
        twin_doc(hook=dict.fromkeys(LOADS, 0.0), slower={("av", 8): 1.5, ("dt-tau", 4): 1.2}), Path("doc.json")
    )
    top = report["largest"]
    assert (top["config"], top["load"]) == ("av", 8)
    assert top["ratio"] == pytest.approx(1.5)
    # pricing draft-trunc's hook changes nothing for a configuration without it
    assert (report["largest_hook"]["config"], report["largest_hook"]["load"]) == ("av", 8)
    assert _row(report, "dt-tau", 4)["ratio"] == pytest.approx(1.2)
    assert _row(report, "av", 8)["unpriced_ms"] == pytest.approx(0.5 * _row(report, "av", 8)["predicted_step_ms"])
    assert all(
        r["ratio"] == pytest.approx(1.0)
        for r in report["rows"]
        if (r["config"], r["load"]) not in {("av", 8), ("dt-tau", 4)}
    )
    # all of spec's extra step in the verify: adaptive verification, which drafts all
    # four and verifies a few, is predicted faster still
    assert _row(report, "av", 1)["ratio_all_verify"] > 1.2


def test_main_reads_a_raw_xz_and_writes_json_markdown_and_plot(tmp_path, capsys):
    raw = tmp_path / "gpu-twin-2026-12-08-glm53-kindling-raw.json.xz"
    with lzma.open(raw, "wt") as f:
        json.dump(twin_doc(hook=dict.fromkeys(LOADS, 0.0), slower={("kiln-av", 32): 0.8}), f)
    assert mc.main([str(raw), "--out", str(tmp_path / "out")]) == 0
    stem = tmp_path / "out" / "gpu-twin-2026-12-08-glm53-kindling-model"
    report = json.loads(stem.with_suffix(".json").read_text())
    assert report["largest"]["config"] == "kiln-av" and report["largest"]["load"] == 32
    assert math.isclose(report["largest"]["ratio"], 0.8)  # served faster than its shape prices
    assert "Largest disagreement: kiln-av at 32 requests: predicted" in stem.with_suffix(".md").read_text()
    assert stem.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"


def test_a_run_without_fixed_k_is_refused_in_one_line(tmp_path):
    doc = twin_doc()
    del doc["configs"]["spec"]
    path = tmp_path / "gpu-twin-results.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(SystemExit) as exc:
        mc.main([str(path), "--out", str(tmp_path / "out")])
    assert str(exc.value.code) == (f"gpu-twin model: {path}: configs: no timed 'spec' run to fit the step costs to")
