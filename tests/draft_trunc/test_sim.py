"""The trace-driven simulator (benchmarks/draft_trunc/sim_trunc.py): its trace
reader, a replay checked by hand, and the oracle as an upper bound."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from kiln_testkit import dt_cost
from kiln_testkit.scripts import load_script

sim = load_script("benchmarks/draft_trunc/sim_trunc.py")
sim_traces = load_script("benchmarks/draft_trunc/sim_trunc_traces.py")
sim_policies = load_script("benchmarks/draft_trunc/sim_trunc_policies.py")
FIXTURE = Path(__file__).parent / "fixtures" / "trace-small.jsonl"


def test_reader_keeps_uncensored_records():
    rec = sim_traces.read_trace(FIXTURE)
    # Step 2's window was cut at 1 and accepted it: censored, dropped.
    assert rec.censored == 1
    assert rec.k == 3 and len(rec.n) == 4
    assert rec.accepted.tolist() == [2, 0, 3, 1]
    assert rec.n.tolist() == [3, 3, 3, 2]
    # Tested drafts: a + 1 unless the window accepted all n.
    assert rec.conditional_acceptance == pytest.approx(6 / 9)
    assert rec.acceptance == pytest.approx(6 / 11)
    assert np.isnan(rec.p[1, 1])  # null: the estimator had no prediction
    # A missing prediction counts as 1, drafts past n survive with 0.
    s = sim_traces.survival(rec.p, rec.n)
    assert s[1].tolist() == pytest.approx([0.5, 0.5, 0.2])
    assert s[3, 2] == 0.0


@pytest.mark.parametrize(
    "line,message",
    [
        ("not json", "not JSON"),
        ('{"k": 2}', "reqs: missing"),
        ('{"k": 2, "reqs": [{"p": [0.5], "kept": 1, "accepted": 0}]}', "p: expected 2"),
        ('{"k": 2, "reqs": [{"p": [0.5, 0.5], "kept": 2, "accepted": 3}]}', "accepted: 3"),
        ('{"k": 2, "reqs": [{"p": [0.5, 0.5], "kept": 3, "accepted": 0}]}', "kept: 3"),
        (
            '{"k": 2, "reqs": [{"p": [0.5, 0.5], "kept": "2", "accepted": 0}]}',
            "kept: expected an integer",
        ),
    ],
)
def test_reader_names_line_and_field(tmp_path, line, message):
    path = tmp_path / "t.jsonl"
    path.write_text('{"step": 0, "k": 2, "reqs": []}\n' + line + "\n")
    with pytest.raises(sim_traces.TraceError, match=f"t.jsonl:2: .*{message}"):
        sim_traces.read_trace(path)


def test_no_truncation_replay_by_hand():
    """Two steps of one request, K = 2, accepting 0 then 2 drafts: 1 + 3 tokens
    in two full-price steps of 3 live tokens each."""
    model = sim_policies.Model(other_share=0.25, moe_layers=2)
    b = sim_policies.Batches(
        surv=np.array([[[0.5, 0.25]], [[0.9, 0.8]]]),
        n=np.array([[2], [2]]),
        accepted=np.array([[0], [2]]),
    )
    out = sim_policies.replay(b, b.n, model)
    c, layer = model.cost, model.layer
    routed = c.t_fixed + c.t_token * 3 + c.t_byte * sim._cost.experts_touched(layer, 3) * layer.expert_bytes
    step = 2 * routed * (1 + 0.25 / 0.75)
    assert out.tokens == 4
    assert out.time_us == pytest.approx(2 * step, rel=1e-9)
    assert out.tokens_per_s == pytest.approx(4 / (2 * step * 1e-6), rel=1e-9)
    assert out.accepted_per_req_step == 1.0 and out.kept_frac == 1.0
    # Keeping one draft: the second step yields 2 tokens at 2 live tokens.
    cut = sim_policies.replay(b, np.array([[1], [1]]), model)
    assert cut.tokens == 3 and cut.time_us < out.time_us


@pytest.mark.parametrize("size", [1, 8, 64])
@pytest.mark.parametrize("alpha", [0.3, 0.8])
def test_oracle_bounds_every_policy(size, alpha):
    rng = np.random.default_rng(size)
    records = sim_traces.synthetic(alpha, 3000, 4, rng)
    model = sim_policies.Model(other_share=0.3)
    b = sim_policies.draw(records, size, rng, target_records=3000)
    results = sim_policies.run_policies(b, model)
    best = results["oracle"].tokens_per_s
    for name, outcome in results.items():
        assert outcome.tokens_per_s <= best * (1 + 1e-12), name
    # ...and it is not trivially the no-truncation run at small batches.
    if size == 1:
        assert best > results["none"].tokens_per_s * 1.05


def test_cost_policy_never_loses_at_large_batches():
    """At 256 requests every expert is touched: the cost-aware policy must
    keep everything (equal to no truncation), unlike a fixed tau."""
    rng = np.random.default_rng(3)
    b = sim_policies.draw(sim_traces.synthetic(0.4, 5000, 4, rng), 256, rng, target_records=5000)
    results = sim_policies.run_policies(b, sim_policies.Model())
    assert results["cost"].tokens_per_s == pytest.approx(results["none"].tokens_per_s, rel=1e-12)
    assert results["tau=0.5"].tokens_per_s < results["none"].tokens_per_s


def test_main_writes_json_and_png(tmp_path):
    assert sim.main(["--out", str(tmp_path), "--quick", "--sizes", "1", "128", "--trace", str(FIXTURE)]) == 0
    (json_path,) = tmp_path.glob("sim-trunc-*.json")
    data = json.loads(json_path.read_text())
    assert {r["trace"] for r in data["rows"]} >= {"trace-small", "synthetic-a0.3"}
    assert all(r["goals"]["never_1pct_slower_than_none"] for r in data["rows"])
    assert next(tmp_path.glob("sim-trunc-*.png")).stat().st_size > 10_000


def noisy_records(count, k, alpha, rng):
    """Predictions that carry no information: p ~ U(0, 1) while every draft is
    accepted with probability ``alpha`` (the CPU twin's estimator in the
    extreme)."""
    accept = rng.random((count, k)) < alpha
    accepted = np.cumprod(accept, axis=1).sum(axis=1)
    return sim_traces.Records(rng.random((count, k)), np.full(count, k), accepted, "noise")


@pytest.mark.parametrize("size", [1, 8])
def test_calibration_rescues_uninformative_predictions(size):
    """Drafts accepted 80% of the time, predictions noise: trusting them, the
    policy cuts drafts it believes unlikely and loses to no truncation;
    calibrated online from the drafts it verified (and the 5% it explores), it
    learns they are good and keeps them."""
    rng = np.random.default_rng(size)
    b = sim_policies.draw(noisy_records(20_000, 4, 0.8, rng), size, rng, explore=0.05)
    model = sim_policies.Model()
    none = sim_policies.replay(b, b.n, model).tokens_per_s
    raw = sim_policies.replay(b, sim_policies.cost_j(b, model, calibrate=False)[0], model).tokens_per_s
    calibrated = sim_policies.replay(b, sim_policies.cost_j(b, model)[0], model).tokens_per_s
    assert raw < 0.95 * none
    assert calibrated >= 0.99 * none


def test_calibration_update_grades_verified_drafts_only():
    hits = np.zeros((3, sim._cost.TAU_GRID))
    counts = np.zeros_like(hits)
    surv = np.array([[0.9, 0.5, 0.2], [0.9, 0.5, 0.2]])
    # first request: 2 verified, 1 accepted; second: 3 verified, 3 accepted
    dt_cost.calibration_update(hits, counts, surv, np.array([2, 3]), np.array([1, 3]))
    b9, b5, b2 = (int(x * sim._cost.TAU_GRID) for x in (0.9, 0.5, 0.2))
    assert counts[0, b9] == 2 and hits[0, b9] == 2
    assert counts[1, b5] == 2 and hits[1, b5] == 1
    assert counts[2, b2] == 1 and hits[2, b2] == 1
    assert counts.sum() == 5 and hits.sum() == 4
    values = dt_cost.calibrated_values(hits, counts)
    # an empty cell is the prediction itself; a graded one moves toward its rate
    assert values[2, 0] == pytest.approx(0.5 / sim._cost.TAU_GRID)
    prior = sim._cost.CAL_PRIOR
    mid = (b5 + 0.5) / sim._cost.TAU_GRID
    assert values[1, b5] == pytest.approx((1 + prior * mid) / (2 + prior))


@pytest.mark.parametrize("trace", ["synthetic", "noise"])
def test_informed_bound_sits_between_policies_and_oracle(trace):
    """The informed bound knows each draft's (position, bin) cell's true rate
    and prices at the run's optimal rate: no policy using those cells beats it
    (beyond the noise of realised outcomes), and the oracle beats it."""
    rng = np.random.default_rng(5)
    records = sim_traces.synthetic(0.4, 5000, 4, rng) if trace == "synthetic" else noisy_records(5000, 4, 0.35, rng)
    b = sim_policies.draw(records, 4, rng, target_records=20_000)
    model = sim_policies.Model()
    results = sim_policies.run_policies(b, model)
    bound = results["informed_bound"].tokens_per_s
    assert bound <= results["oracle"].tokens_per_s
    for name, outcome in results.items():
        if name not in ("oracle", "informed_bound"):
            assert outcome.tokens_per_s <= bound * 1.003, name
    assert bound > results["none"].tokens_per_s * 1.02
