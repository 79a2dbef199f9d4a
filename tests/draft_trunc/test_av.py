"""Adaptive verification fed draft-trunc's calibration: the knob and its
refusals, and ``av_confidences`` against the trace model's arithmetic
(``sim_adaptive_rules.calibrated_av``), which is what the docs' tables measure."""

from __future__ import annotations

from types import SimpleNamespace as NS

import numpy as np
import pytest
import torch
from kiln_engine.draft_trunc import _av, _cost
from kiln_engine.draft_trunc._env import read_knobs
from kiln_testkit import dt_cost

K, GRID = 4, _cost.TAU_GRID


def _calibration(rng, overconfident_at: int | None = None):
    """hits/counts as the device keeps them: K x GRID cells and the sink."""
    counts = rng.integers(0, 400, size=K * GRID + 1).astype(np.float32)
    mids = np.tile((np.arange(GRID) + 0.5) / GRID, K)
    rate = np.clip(mids * rng.uniform(0.5, 1.5, size=K * GRID), 0, 1)
    if overconfident_at is not None:
        rate[overconfident_at * GRID : (overconfident_at + 1) * GRID] = 0.0
    hits = np.append(np.round(counts[:-1] * rate), 0).astype(np.float32)
    return torch.from_numpy(hits), torch.from_numpy(counts)


def _model_worth(conf: np.ndarray, hits, counts) -> np.ndarray:
    """The trace model's corrected survival (sim_adaptive_rules.calibrated_av), per draft."""
    surv = np.cumprod(conf.astype(np.float64), axis=1)
    bins = dt_cost.survival_bins(surv)
    mids = (np.arange(GRID) + 0.5) / GRID
    values = dt_cost.calibrated_values(
        hits.numpy()[:-1].reshape(K, GRID), counts.numpy()[:-1].reshape(K, GRID), _av.AV_PRIOR
    )
    ratio = values / mids
    return np.minimum.accumulate(np.clip(surv * ratio[np.arange(K), bins], 0, 1), axis=1)


def test_corrected_survival_is_the_trace_models():
    rng = np.random.default_rng(1)
    hits, counts = _calibration(rng)
    conf = rng.uniform(0.05, 1.0, size=(6, K)).astype(np.float32)
    out = _av.corrected_confidences(torch.from_numpy(conf), 5, hits, counts)
    survival = torch.cumprod(out[:5].double(), dim=1).numpy()
    assert np.allclose(survival, _model_worth(conf[:5], hits, counts), atol=1e-5)
    assert torch.equal(out[5], torch.from_numpy(conf[5]))  # past num_reqs: untouched


def test_no_grades_leave_the_estimator_as_it_is():
    conf = torch.tensor([[0.9, 0.5, 0.7, 0.2], [0.3, 0.3, 0.3, 0.3]])
    zeros = torch.zeros(K * GRID + 1)
    out = _av.corrected_confidences(conf, 2, zeros, zeros)
    assert torch.allclose(out, conf, atol=1e-6)


def test_a_cell_whose_drafts_never_survive_stops_them_being_admitted():
    """Position 2 graded dead in every bin (4096 grades each, none survived): the
    corrected survival of it and of everything after it falls near 0, while the first
    two positions keep most of theirs."""
    rng = np.random.default_rng(2)
    hits, counts = _calibration(rng, overconfident_at=2)
    counts[2 * GRID : 3 * GRID] = 4096.0
    conf = torch.full((3, K), 0.9)
    survival = torch.cumprod(_av.corrected_confidences(conf, 3, hits, counts), dim=1)
    assert torch.all(survival[:, 2:] < 0.02)  # 0.81 x 64 / (4096 + 64) at most
    assert torch.all(survival[:, :2] > 0.4)


def test_the_hook_is_a_no_op_unless_asked(draft_trunc):
    conf = torch.rand(2, K)
    dt = draft_trunc()
    assert dt.av_confidences(conf, 2) is conf  # knob off
    dt = draft_trunc(with_av=1, av_calibrate=1)
    assert dt.av_confidences(conf, 2) is conf  # no calibration yet (no verify step)


def test_the_knob_needs_adaptive_verification_combined_and_the_cost_policy():
    with pytest.raises(ValueError, match=r"KILN_DRAFT_TRUNC_AV_CALIBRATE=1 .* needs KILN_DRAFT_TRUNC_WITH_AV=1"):
        read_knobs({"KILN_DRAFT_TRUNC": "1", "KILN_DRAFT_TRUNC_AV_CALIBRATE": "1"})
    with pytest.raises(ValueError, match="KILN_DRAFT_TRUNC_AV_CALIBRATE"):
        read_knobs(
            {
                "KILN_DRAFT_TRUNC": "1",
                "KILN_DRAFT_TRUNC_AV_CALIBRATE": "1",
                "KILN_DRAFT_TRUNC_WITH_AV": "1",
                "KILN_DRAFT_TRUNC_TAU": "0.3",
            }
        )
    knobs = read_knobs({"KILN_DRAFT_TRUNC": "1", "KILN_DRAFT_TRUNC_AV_CALIBRATE": "1", "KILN_DRAFT_TRUNC_WITH_AV": "1"})
    assert knobs.av_calibrate and knobs.with_av and knobs.policy == "cost"


def _config(av: bool):
    parallel = NS(
        pipeline_parallel_size=1,
        prefill_context_parallel_size=1,
        data_parallel_size=1,
        all2all_backend="allgather_reducescatter",
    )
    return NS(
        parallel_config=parallel,
        speculative_config=NS(method="draft_model", enable_adaptive_verification=av),
        model_config=NS(hf_text_config=NS(num_experts_per_tok=8)),
    )


def test_start_refuses_the_knob_without_adaptive_verification(draft_trunc):
    dt = draft_trunc(with_av=1, av_calibrate=1)
    with pytest.raises(RuntimeError, match="enable_adaptive_verification is off"):
        dt.check_config(_config(av=False))
    dt.check_config(_config(av=True))
    assert dt.ENABLED
