"""Drafting priced and cut short: the DRAFT_COST knob and its arithmetic,
the depth decision's kernel against its numpy twin (the simulator's), mark_dead
with drafts the drafter never made, and the drafting hooks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from kiln_engine.draft_trunc import _cost
from kiln_engine.draft_trunc._env import read_knobs
from kiln_engine.features import DRAFT_TRUNC
from kiln_testkit import dt_cost
from kiln_testkit.dt_batches import random_batch

pytest.importorskip("triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ENV = "KILN_DRAFT_TRUNC_DRAFT_COST"


def _knob(raw: str):
    return DRAFT_TRUNC.read({ENV: raw})["draft_cost"]


def test_draft_cost_knob_parses_and_interpolates():
    cost = _cost.DraftCost(_knob("1:0.08, 64:0.02:1.5"))
    assert cost.points == ((1, 0.08, 1.0), (64, 0.02, 1.5))
    assert cost.at(1) == (0.08, 1.0) and cost.at(512) == (0.02, 1.5)
    share, first = cost.at(8)  # half way in log(requests)
    assert share == pytest.approx(0.05) and first == pytest.approx(1.25)
    # D positions: the first pass, then one share each; D = 0 still pays the first pass
    assert cost.positions(1, 3) == pytest.approx(0.08 * 3)
    assert cost.positions(64, 0) == cost.positions(64, 1) == pytest.approx(0.03)
    assert _cost.DraftCost().positions(4, 4) == 0.0  # unset: drafting unpriced


@pytest.mark.parametrize(
    "raw",
    [
        "0:0.1",
        "1:2",
        "1:0.1,1:0.2",
        "4:0.1,2:0.1",
        "1:x",
        "1",
        "1:0.1:1:2",
        "1:nan",
        "1:0.1:nan",
        "1:inf",
        "2000000:0.1",
        "-1:0.1",
        "1:0.1;rm -rf /",
    ],
)
def test_draft_cost_knob_refuses_bad_values(raw):
    with pytest.raises(ValueError, match=ENV):
        _knob(raw)


def test_depth_needs_the_cost_policy_and_a_draft_cost():
    base = {"KILN_DRAFT_TRUNC": "1", "KILN_DRAFT_TRUNC_DEPTH": "1"}
    with pytest.raises(ValueError, match="KILN_DRAFT_TRUNC_DRAFT_COST"):
        read_knobs(base)
    with pytest.raises(ValueError, match="KILN_DRAFT_TRUNC_POLICY=cost"):
        read_knobs({**base, ENV: "1:0.05", "KILN_DRAFT_TRUNC_TAU": "0.3"})
    assert read_knobs({**base, ENV: "1:0.05"}).depth


def _surv(predictions: torch.Tensor, slots, made: int) -> np.ndarray:
    p = predictions[slots].double().numpy()
    q = np.where(np.isnan(p), 1.0, np.clip(p, 0.0, 1.0))
    s = np.cumprod(q.astype(np.float32), axis=-1).astype(np.float64)
    return np.where(np.arange(p.shape[1]) < made, s, 0.0)


def _depth_case(dt, seed: int) -> tuple[bool, bool, bool]:
    """(kernel's flag, numpy's flag, whether the two options tie) on a random batch,
    drafting stage, prices and learnt calibration."""
    from kiln_engine.draft_trunc._kernels.kernel import launch_depth

    rng = np.random.default_rng(seed)
    k, reqs = 4, int(rng.integers(1, 40))
    batch = random_batch(rng, reqs, k, mixed=False)
    batch.predictions *= float(rng.choice([0.05, 0.3, 1.0]))  # some batches not worth drafting
    dt.prepare(batch.predictions.shape[0], DEVICE, 8192, num_spec=k)
    snap = dt.snapshot()
    cal = snap.calibration
    # grades near what the bins predicted, some cells empty
    counts = rng.integers(0, 30, size=cal.counts.shape[0]).astype(np.float32)
    mids = ((np.arange(counts.shape[0]) % _cost.TAU_GRID) + 0.5) / _cost.TAU_GRID
    rates = np.clip(mids * rng.uniform(0.5, 1.5, size=counts.shape[0]), 0.0, 1.0)
    cal.counts.copy_(torch.from_numpy(counts))
    cal.hits.copy_(torch.from_numpy(np.floor(counts * rates).astype(np.float32)))
    scheduled = int(rng.integers(2, k + 1))
    drafted = int(rng.integers(1, scheduled))
    prices = [dt.draft_time(reqs, d, k) for d in range(k + 1)]
    go = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    launch_depth(
        go,
        batch.idx_mapping.to(DEVICE),
        batch.predictions.to(DEVICE),
        snap.buffers,
        snap.cost,
        cal,
        reqs,
        drafted,
        scheduled,
        dt.KNOBS.min_keep,
        0.0,
        prices[1],
        prices[2] - prices[1],
    )
    n = np.full(reqs, scheduled)
    pos = np.arange(k)
    optional = (pos < n[:, None]) & (pos >= min(dt.KNOBS.min_keep, scheduled))
    values = dt_cost.calibrated_values(
        cal.hits.cpu().numpy()[:-1].reshape(k, -1), cal.counts.cpu().numpy()[:-1].reshape(k, -1)
    )
    args = (
        _surv(batch.predictions, batch.idx_mapping.numpy(), k),
        optional,
        n,
        drafted,
        reqs * (1 + scheduled),
        reqs,
        snap.cost.table.cpu().numpy().astype(np.float64),
        _cost.H200_FIT,
        _cost.other_ratio(0.3),
        values,
    )
    want = bool(dt_cost.depth_continue(*args, prices))
    # a tie: nudging the price of stopping now flips the answer
    nudged = [[p * (1 + e) if d == drafted else p for d, p in enumerate(prices)] for e in (-1e-4, 1e-4)]
    tie = bool(dt_cost.depth_continue(*args, nudged[0])) != bool(dt_cost.depth_continue(*args, nudged[1]))
    return bool(go.item()), want, tie


def test_depth_kernel_matches_its_numpy_twin(draft_trunc):
    """launch_depth's flag equals dt_cost.depth_continue's (what sim_adaptive replays)
    on random batches, both ways, except at a numerical tie (fp32 there, fp64 here)."""
    flags = []
    for seed in range(16):
        dt = draft_trunc(policy="cost", explore=0.0, min_keep=seed % 2, other_share=0.3, draft_cost="1:0.06,64:0.01")
        got, want, tie = _depth_case(dt, seed)
        assert got == want or tie, f"seed {seed}: kernel {got}, numpy {want}"
        flags.append(want)
    assert any(flags) and not all(flags), flags


def test_worthless_drafts_stop_drafting_and_certain_ones_go_on(draft_trunc):
    """One request: survival ~0 after the first draft stops drafting; ~1 goes on."""
    from kiln_engine.draft_trunc._kernels.kernel import launch_depth

    dt = draft_trunc(policy="cost", explore=0.0, draft_cost="1:0.05")
    dt.prepare(4, DEVICE, 8192, num_spec=4)
    snap = dt.snapshot()
    idx = torch.tensor([2], device=DEVICE)
    flags = []
    for p in (0.01, 1.0):
        pred = torch.full((4, 4), p, device=DEVICE)
        go = torch.zeros(1, dtype=torch.int32, device=DEVICE)
        launch_depth(
            go,
            idx,
            pred,
            snap.buffers,
            snap.cost,
            snap.calibration,
            1,
            1,
            4,
            1,
            0.0,
            dt.draft_time(1, 1, 4),
            dt.draft_time(1, 2, 4) - dt.draft_time(1, 1, 4),
        )
        flags.append(bool(go.item()))
    assert flags == [False, True]


class _Estimator:
    def __init__(self, predictions):
        self.predictions = predictions
        self._refits = 5


def test_stop_drafting_at_the_schedule_and_where_it_stops_paying(draft_trunc):
    dt = draft_trunc(policy="cost", explore=0.0, depth=1, draft_cost="1:0.05")
    rng = np.random.default_rng(0)
    batch = random_batch(rng, 3, 4, max_num_reqs=8, mixed=False)
    dt.prepare(8, DEVICE, 8192, num_spec=4)
    idx = batch.idx_mapping.to(DEVICE)
    tokens = torch.arange(32, device=DEVICE).view(8, 4).clone()
    # vLLM schedules 2 drafts: drafting stops at position 2 whatever the predictions say
    dt.begin_drafting(2, idx, 3)
    est = _Estimator(torch.ones(8, 4, device=DEVICE))
    assert not dt.stop_drafting(1, tokens, est, idx, 3)
    assert dt.stop_drafting(2, tokens, est, idx, 3)
    assert (dt.snapshot().buffers.depth[idx] > 4).all()  # nothing left undrafted
    # predictions ~0: stop after the first position; the scheduled tail copies the last draft
    dt.begin_drafting(None, idx, 3)
    est = _Estimator(torch.full((8, 4), 0.01, device=DEVICE))
    before = tokens.clone()
    assert dt.stop_drafting(1, tokens, est, idx, 3)
    assert (tokens[:3, 1:] == before[:3, :1]).all() and (tokens[3:] == before[3:]).all()
    assert dt.snapshot().buffers.depth[idx].tolist() == [1, 1, 1]
    # a dummy run resets nothing and stops nothing
    dt.begin_drafting(None, idx, 3, dummy_run=True)
    assert not dt.stop_drafting(1, tokens, est, idx, 3)


def test_mark_dead_kills_what_was_not_drafted(draft_trunc):
    """Drafts past a request's drafted depth are dead for either policy, explored
    requests included; kept counts never exceed the depth."""
    for policy, extra in (("tau", {"tau": 0.0}), ("cost", {})):
        dt = draft_trunc(policy=policy, explore=0.5, min_keep=1, **extra)
        rng = np.random.default_rng(3)
        batch = random_batch(rng, 24, 4, mixed=False).to(DEVICE)
        dt.prepare(batch.predictions.shape[0], DEVICE, batch.is_padding.shape[0], num_spec=4)
        depth = torch.from_numpy(rng.integers(1, 5, size=batch.predictions.shape[0]).astype(np.int32))
        dt.snapshot().buffers.depth.copy_(depth.to(DEVICE))
        assert batch.mark_dead(dt)
        live = dt.snapshot().buffers.live.cpu()
        qsl, n = batch.query_start_loc.cpu(), batch.num_drafts
        for r in range(batch.num_reqs):
            slot = int(batch.idx_mapping[r])
            made = min(int(n[r]), int(depth[slot]))
            assert int(live[slot]) <= made
            rows = batch.is_padding[int(qsl[r]) : int(qsl[r + 1])].cpu()
            assert not rows[: 1 + int(live[slot])].any()
            assert rows[1 + int(live[slot]) :].all()


def test_drafting_price_keeps_more_drafts(draft_trunc):
    """Drafting in the denominator lowers the rate a draft must beat: the chosen tau
    never rises when drafting is priced (same batch, same calibration)."""
    taus = []
    for cost in ("", "1:0.3"):
        kw = {"draft_cost": cost} if cost else {}
        dt = draft_trunc(policy="cost", explore=0.0, **kw)
        batch = random_batch(np.random.default_rng(11), 6, 4, mixed=False).to(DEVICE)
        dt.prepare(batch.predictions.shape[0], DEVICE, batch.is_padding.shape[0], num_spec=4)
        assert batch.mark_dead(dt)
        taus.append(float(dt.policy_tau().item()))
    assert taus[1] <= taus[0]


def test_a_step_whose_drafting_explored_verifies_everything(draft_trunc):
    """With the depth decision on, the steps its kernel drafts to the end (keyed by
    the step alone) also verify every draft: otherwise the deep cells would be graded
    only in the few requests that explore on their own."""
    from dt_reference import explore_uniform

    steps = [s for s in range(64) if explore_uniform(s, 0xFFFFFFFF) < 0.5]
    cut = {}
    for depth in (False, True):
        env = (
            {"policy": "cost", "explore": 0.5, "depth": 1, "draft_cost": "1:0.05"}
            if depth
            else {"policy": "cost", "explore": 0.5}
        )
        dt = draft_trunc(**env)
        batch = random_batch(np.random.default_rng(4), 32, 4, mixed=False).to(DEVICE)
        batch.predictions.fill_(0.02)  # worth nothing: every draft past min_keep is cut
        dt.prepare(batch.predictions.shape[0], DEVICE, batch.is_padding.shape[0], num_spec=4)
        dt.snapshot().buffers.step.fill_(steps[0])
        assert batch.mark_dead(dt)
        cut[depth] = int(batch.is_padding[: batch.num_tokens].sum())
    assert cut[False] > 0 and cut[True] == 0
