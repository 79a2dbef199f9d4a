"""sim_adaptive: drafting priced, vLLM's rules replayed as vLLM runs them,
the bounds above every policy, and draft-trunc's depth decision on drafts worth nothing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from kiln_testkit.scripts import load_script

sa = load_script("benchmarks/draft_trunc/sim_adaptive.py")
costs = load_script("benchmarks/draft_trunc/sim_adaptive_costs.py")
rules = load_script("benchmarks/draft_trunc/sim_adaptive_rules.py")
report = load_script("benchmarks/draft_trunc/sim_adaptive_report.py")
sim_traces = load_script("benchmarks/draft_trunc/sim_trunc_traces.py")
sim_policies = load_script("benchmarks/draft_trunc/sim_trunc_policies.py")
FIXTURE = Path(__file__).parent / "fixtures" / "trace-small.jsonl"


def _model():
    return costs.AdaptiveModel(256.0, other_share=0.5)


def test_drafting_is_priced_per_position_and_the_first_pass_always():
    model, drafter = _model(), costs.table_drafter("t", {1: (0.1, 2.0), 64: (0.02, 1.0)})
    full = float(model.step_us(5, 5, 1))
    assert drafter.step_us(model, 1, 0) == pytest.approx(full * 0.1 * 2.0)  # K = 0: first pass
    assert drafter.step_us(model, 1, 1) == pytest.approx(full * 0.1 * 2.0)
    assert drafter.step_us(model, 1, 4) == pytest.approx(full * 0.1 * 5.0)
    assert drafter.knob == "1:0.1:2,64:0.02:1"


def test_other_time_follows_scheduled_tokens_only_in_part():
    """A shorter K saves the token-proportional share phi of the non-routed time; at
    full verification the model is sim_trunc's."""
    model = _model()
    base = sim_policies.Model(other_share=0.5)
    assert float(model.step_us(40, 40, 8)) == pytest.approx(float(base.step_us(np.array(40), np.array(40))))
    routed = float(base.step_us(np.array(8), np.array(8))) / (1 + base.ratio)
    other_full = float(base.step_us(np.array(40), np.array(40))) * base.ratio / (1 + base.ratio)
    phi = model.phi(8)
    assert phi == pytest.approx(40 / (40 + 256))
    want = routed + other_full * (1 - phi + phi * 8 / 40)
    assert float(model.step_us(8, 8, 8)) == pytest.approx(want)


def test_schedule_carries_the_last_profiled_k_forward():
    table = {1: 2, 4: 3, 16: 4}
    assert [rules.schedule_k(table, r) for r in (1, 3, 4, 15, 16, 512)] == [2, 2, 3, 3, 4, 4]


def test_confidence_exit_by_hand():
    """Conditional probabilities 0.9, 0.3, ...: at threshold 0.5 the request verifies
    one draft and drafting ran two positions (the low one was drafted)."""
    b = sim_policies.Batches(
        surv=np.array([[[0.9, 0.27, 0.2, 0.18], [0.2, 0.1, 0.05, 0.01]]]),
        n=np.array([[4, 4]]),
        accepted=np.array([[1, 0]]),
    )
    plan = rules.confidence(b, 0.5)
    assert plan.n.tolist() == [[1, 0]] and plan.depth.tolist() == [2]
    assert rules.confidence(b, 0.0).depth.tolist() == [4]


@pytest.mark.parametrize("reqs", [1, 8])
def test_bounds_sit_above_every_policy(reqs):
    rng = np.random.default_rng(reqs)
    records = sim_traces.synthetic(0.5, 3000, 4, rng)
    b = sim_policies.draw(records, reqs, rng, target_records=3000, explore=0.05)
    model, drafter = _model(), costs.constant_drafter(0.05)
    plans = {
        "K=4": rules.fixed_k(b, 4),
        "K=1": rules.fixed_k(b, 1),
        "conf": rules.confidence(b, 0.4),
        "dt": rules.dt_plan(b, model, drafter),
        "dt-depth": rules.dt_plan(b, model, drafter, depth_policy=True),
    }
    oracle = rules.bound(b, model, drafter, oracle=True).tokens_per_s
    informed = rules.bound(b, model, drafter, oracle=False).tokens_per_s
    assert informed <= oracle
    for name, plan in plans.items():
        tps = rules.replay(b, plan, model, drafter).tokens_per_s
        assert tps <= oracle, name
        assert tps <= informed * 1.005, name  # realised outcomes vs expected worth: noise only


def test_depth_decision_stops_drafting_what_is_never_accepted():
    """Drafts that are never accepted, predictions saying so: with drafting priced,
    draft-trunc stops after the first position (the exploring steps aside) and beats
    drafting all four; without the depth decision it must draft them all."""
    rng = np.random.default_rng(2)
    records = sim_traces.Records(rng.uniform(0.0, 0.05, size=(4000, 4)), np.full(4000, 4), np.zeros(4000, int), "never")
    b = sim_policies.draw(records, 2, rng, target_records=8000, explore=0.05)
    model, drafter = _model(), costs.constant_drafter(0.05)
    depth = rules.dt_plan(b, model, drafter, depth_policy=True)
    plain = rules.dt_plan(b, model, drafter)
    assert plain.depth.mean() == 4
    assert depth.depth.mean() < 1.3
    assert (
        rules.replay(b, depth, model, drafter).tokens_per_s > 1.1 * rules.replay(b, plain, model, drafter).tokens_per_s
    )


def test_main_writes_json_and_png(tmp_path):
    assert (
        sa.main(
            [
                "--out",
                str(tmp_path),
                "--quick",
                "--request-steps",
                "1500",
                "--sizes",
                "1",
                "--trace",
                str(FIXTURE),
                "--draft-share",
                "0.05",
                "--other-half",
                "256",
            ]
        )
        == 0
    )
    data = json.loads(next(tmp_path.glob("sim-adaptive-*.json")).read_text())
    row = next(r for r in data["rows"] if r["trace"] == "trace-small")
    assert {
        "vllm-schedule",
        "vllm-best-K",
        "confidence",
        "vllm-av",
        "vllm-schedule+av",
        "kiln-av",
        "vllm-av+dt",
        "kiln-av+dt",
        "dt-depth",
        "bound",
    } <= set(row["tokens_per_s"])
    assert row["vs_best_upstream"][row["best_upstream"]] == pytest.approx(1.0)
    assert next(tmp_path.glob("sim-adaptive-*.png")).stat().st_size > 10_000
    md = next(tmp_path.glob("sim-adaptive-*.md")).read_text()
    assert "| trace-small | " in md and "R=1" in md
    assert data["summary"]["kiln_vs_upstream"][0] <= data["summary"]["kiln_vs_upstream"][1]


def test_adaptive_verification_admits_the_best_slots_and_shrinks_the_batch():
    """Two requests: one whose drafts are sure, one whose drafts are hopeless. vLLM's
    adaptive verification admits the first's drafts (a prefix, the best slots) and none
    of the second's: 1 + 4 + 1 tokens verified instead of 10."""
    b = sim_policies.Batches(
        surv=np.array([[[0.99, 0.98, 0.97, 0.96], [0.01, 0.001, 1e-4, 1e-5]]]),
        n=np.array([[4, 4]]),
        accepted=np.array([[4, 0]]),
    )
    model, drafter = _model(), costs.constant_drafter(0.05)
    plan = rules.adaptive_verification(b, model, drafter, rules.fixed_k(b, 4))
    assert plan.n.tolist() == [[4, 0]] and plan.j.tolist() == [[4, 0]]
    assert plan.depth.tolist() == [4]  # drafting is unchanged
    assert (
        rules.replay(b, plan, model, drafter).tokens_per_s
        > rules.replay(b, rules.fixed_k(b, 4), model, drafter).tokens_per_s
    )


def test_adaptive_verification_admits_nothing_when_no_draft_pays():
    b = sim_policies.Batches(surv=np.full((3, 2, 4), 1e-6), n=np.full((3, 2), 4), accepted=np.zeros((3, 2), int))
    plan = rules.adaptive_verification(b, _model(), costs.constant_drafter(0.05), rules.fixed_k(b, 4))
    assert plan.n.sum() == 0


def _overconfident(count, rng):
    """An estimator that says 0.9 where drafts survive one time in ten."""
    p = np.full((count, 4), 0.9)
    accepted = np.cumprod(rng.random((count, 4)) < 0.1, axis=1).sum(axis=1)
    return sim_traces.Records(p, np.full(count, 4), accepted, "overconfident")


def test_calibrated_av_corrects_an_overconfident_estimator_and_leaves_a_calibrated_one():
    """Where the estimator is wrong, draft-trunc's calibration moves adaptive
    verification's budget (here: verify almost nothing, at least 1.3x faster); where it
    is right, the calibrated rule stays within noise of vLLM's own."""
    rng = np.random.default_rng(5)
    model, drafter = _model(), costs.constant_drafter(0.01)
    bad = sim_policies.draw(_overconfident(6000, rng), 4, rng, target_records=6000)
    tps = {
        name: rules.replay(bad, plan, model, drafter).tokens_per_s
        for name, plan in {
            "av": rules.adaptive_verification(bad, model, drafter, rules.fixed_k(bad, 4)),
            "kiln": rules.calibrated_av(bad, model, drafter, rules.fixed_k(bad, 4)),
        }.items()
    }
    assert tps["kiln"] > 1.3 * tps["av"]
    good = sim_policies.draw(sim_traces.synthetic(0.7, 6000, 4, rng), 4, rng, target_records=6000)
    av = rules.replay(good, rules.adaptive_verification(good, model, drafter, rules.fixed_k(good, 4)), model, drafter)
    kiln = rules.replay(good, rules.calibrated_av(good, model, drafter, rules.fixed_k(good, 4)), model, drafter)
    assert kiln.tokens_per_s == pytest.approx(av.tokens_per_s, rel=0.01)


def test_the_variable_length_rules_stay_under_the_oracle():
    rng = np.random.default_rng(3)
    b = sim_policies.draw(sim_traces.synthetic(0.5, 3000, 4, rng), 8, rng, target_records=3000, explore=0.05)
    model, drafter = _model(), costs.constant_drafter(0.05)
    oracle = rules.bound(b, model, drafter, oracle=True).tokens_per_s
    for plan in (
        rules.adaptive_verification(b, model, drafter, rules.fixed_k(b, 4)),
        rules.calibrated_av(b, model, drafter, rules.fixed_k(b, 4)),
    ):
        assert rules.replay(b, plan, model, drafter).tokens_per_s <= oracle


def _row(**tps):
    base = {
        "none": 1.0,
        "vllm-schedule": 1.0,
        "vllm-best-K": 1.0,
        "confidence": 1.0,
        "vllm-av": 1.0,
        "vllm-schedule+av": 1.0,
        "vllm-best-K+dt": 1.0,
        "vllm-best-K+dt-depth": 1.0,
        "vllm-av+dt": 1.0,
        "kiln-av+dt": 1.0,
    }
    return {"tokens_per_s": {**base, **tps}}


def test_kiln_config_against_the_shipped_rules_and_every_upstream_rule():
    row = _row(**{"vllm-best-K": 2.0, "vllm-av": 2.1, "confidence": 2.5, "vllm-best-K+dt": 2.2, "kiln-av+dt": 2.4})
    assert report.kiln_config(row, "schedule+dt") == pytest.approx({"vs_shipped": 2.2 / 2.1, "vs_upstream": 0.88})
    assert report.kiln_config(row, "kiln-av") == pytest.approx({"vs_shipped": 2.4 / 2.1, "vs_upstream": 0.96})


def test_one_configuration_per_recipe_by_the_worst_case():
    """kiln-av helps in one case and loses more in another: the recipe keeps the
    configuration whose worst case is best; a near tie goes to the simpler one."""
    rows = [_row(**{"vllm-best-K+dt": 1.0, "kiln-av+dt": 1.1}), _row(**{"vllm-best-K+dt": 1.0, "kiln-av+dt": 0.95})]
    assert report.recipe_config(rows) == "schedule+dt"
    assert report.recipe_config(rows[:1]) == "kiln-av"
    assert report.recipe_config([_row(**{"kiln-av+dt": 1.0005})]) == "schedule+dt"


def test_hook_price_interpolates_in_log_batch_from_the_measurement(tmp_path):
    """bench_av.py's rows priced per variant (the larger of GPU and host time over the
    verify step), held flat past the measured sizes; 'none' always there."""
    path = tmp_path / "av.json"
    path.write_text(
        json.dumps(
            {
                "rows": [
                    {"requests": 1, "eager_share_of_step": 0.02, "fused_share_of_step": 0.004},
                    {"requests": 4, "eager_share_of_step": 0.01, "fused_share_of_step": None},
                    {"requests": 16, "eager_share_of_step": 0.004, "fused_share_of_step": 0.001},
                ]
            }
        )
    )
    prices = costs.hook_prices(path)
    assert list(prices) == ["none", "eager", "fused"]
    assert prices["eager"].share(2) == pytest.approx(0.015)
    assert prices["eager"].share(512) == pytest.approx(0.004)
    assert prices["fused"].share(4) == pytest.approx(0.0025)  # an unmeasured point is skipped
    assert prices["none"].share(7) == 0.0
    model = _model()
    assert prices["eager"].step_us(model, 1) == pytest.approx(0.02 * float(model.step_us(5, 5, 1)))


def test_the_committed_measurement_prices_the_eager_hook_dearer_than_the_compiled():
    prices = costs.hook_prices(costs.HOOK_PRICES)
    assert {"none", "eager", "compiled"} <= set(prices)
    for reqs in (1, 2, 4, 512):
        assert prices["eager"].share(reqs) > prices["compiled"].share(reqs) > 0


def test_the_hook_price_is_paid_every_step():
    rng = np.random.default_rng(4)
    b = sim_policies.draw(sim_traces.synthetic(0.7, 2000, 4, rng), 2, rng, target_records=2000)
    model, drafter = _model(), costs.constant_drafter(0.05)
    plan = rules.fixed_k(b, 2)
    free = rules.replay(b, plan, model, drafter)
    paid = rules.replay(b, plan, model, drafter, extra_us=100.0)
    assert paid.tokens == free.tokens
    assert paid.time_us == pytest.approx(free.time_us + 100.0 * b.n.shape[0])


def test_kiln_av_steps_aside_below_the_minimum_batch_and_pays_its_hook_above():
    """As the engine runs it: below the minimum batch kiln-av is adaptive verification
    (no hook); from it on, the rule under the chosen price, which a dearer price
    never helps."""
    rng = np.random.default_rng(6)
    records = sim_traces.synthetic(0.6, 3000, 4, rng)
    model, drafter = _model(), costs.constant_drafter(0.05)
    prices = {"none": costs.NO_HOOK_PRICE, "eager": costs.HookPrice("eager", ((1, 0.05),))}
    table = {1: 2}
    small, big = (
        sa.run_load(records, r, model, drafter, table, 0, 0.05, steps=1500, prices=prices, hook="eager", min_batch=2)
        for r in (1, 2)
    )
    for row in (small, big):
        t = row["tokens_per_s"]
        assert t["kiln-av@eager"] < t["kiln-av@none"]
        assert t["kiln-av+dt@eager"] < t["kiln-av+dt@none"]
    assert small["av_stepped_aside"] and not big["av_stepped_aside"]
    assert small["tokens_per_s"]["kiln-av+dt"] == small["tokens_per_s"]["vllm-av+dt"]
    assert small["tokens_per_s"]["kiln-av"] == small["tokens_per_s"]["vllm-av"]
    assert big["tokens_per_s"]["kiln-av+dt"] == big["tokens_per_s"]["kiln-av+dt@eager"]


def _hook_row(trace, batch, **ratio):
    t = {"vllm-av": 1.0, "vllm-av+dt": 1.0}
    for price, v in ratio.items():
        t[f"kiln-av@{price}"] = t[f"kiln-av+dt@{price}"] = v
    return {"trace": trace, "batch": batch, "tokens_per_s": t, "hook_share": dict.fromkeys(ratio, 0.0)}


def test_minimum_batch_maximises_kiln_avs_gain_over_the_batches_it_runs_at():
    """Real traces only (on calibrated traffic kiln-av ties and its hook only costs),
    averaged per batch: stepping aside below 8 drops the losses at 1 and 4, which
    outweigh the small win at 2; no price: on everywhere; losses everywhere: above
    every batch."""
    rows = [
        _hook_row("tiny-a", 1, eager=0.98, none=1.01),
        _hook_row("tiny-a", 2, eager=1.004, none=1.02),
        _hook_row("tiny-a", 4, eager=0.99, none=1.01),
        _hook_row("tiny-a", 8, eager=1.02, none=1.03),
        _hook_row("tiny-b", 1, eager=0.97, none=1.0),
        _hook_row("tiny-b", 2, eager=1.0, none=1.0),
        _hook_row("tiny-b", 4, eager=1.0, none=1.0),
        _hook_row("tiny-b", 8, eager=1.01, none=1.0),
        _hook_row("synthetic-x", 8, eager=0.9, none=0.9),
    ]
    assert report.min_batch(rows, "eager") == 8
    assert report.min_batch(rows, "none") == 1
    losing = [_hook_row("tiny-a", s, eager=0.99, none=1.0) for s in (1, 2, 4)]
    assert report.min_batch(losing, "eager") == 8
