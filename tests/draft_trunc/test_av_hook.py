"""kiln-av's hook made cheap and observable: the fused kernel against the
eager reference, bit for bit; stepping aside below KILN_DRAFT_TRUNC_AV_MIN_BATCH; the
statistics and counters of its corrections; its own time, with KILN_DRAFT_TRUNC_AV_TIMING.
Kernels run under TRITON_INTERPRET=1 without a GPU (conftest)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from kiln_engine.draft_trunc import _av, _av_stats, _cost, _metrics
from kiln_engine.draft_trunc._env import read_knobs
from kiln_engine.draft_trunc._kernels.av import launch_av

GRID = _cost.TAU_GRID


def _calibration(rng, k: int):
    """hits/counts as the device keeps them (k x GRID cells and the sink), rates
    anywhere from far below to far above the bins' middles."""
    counts = rng.integers(0, 5000, size=k * GRID + 1).astype(np.float32)
    mids = np.tile((np.arange(GRID) + 0.5) / GRID, k)
    rate = np.clip(mids * rng.uniform(0.0, 2.5, size=k * GRID), 0, 1)
    hits = np.append(np.round(counts[:-1] * rate), 0).astype(np.float32)
    return torch.from_numpy(hits), torch.from_numpy(counts)


def _confidences(rng, rows: int, k: int) -> torch.Tensor:
    """Confidences as a speculator leaves them, with what it should never hold too:
    NaN (no prediction), 0, 1, out of [0, 1] and infinite values."""
    conf = rng.uniform(0.0, 1.0, size=(rows, k)).astype(np.float32)
    odd = rng.random(size=conf.shape)
    conf[odd < 0.05] = np.nan
    conf[(odd >= 0.05) & (odd < 0.08)] = 1.0
    conf[(odd >= 0.08) & (odd < 0.1)] = 0.0
    conf[(odd >= 0.1) & (odd < 0.11)] = 1.5
    conf[(odd >= 0.11) & (odd < 0.12)] = -0.2
    conf[(odd >= 0.12) & (odd < 0.125)] = np.inf
    return torch.from_numpy(conf)


@pytest.mark.parametrize("rows,num_reqs,k", [(8, 1, 4), (40, 37, 4), (300, 260, 4), (64, 64, 3), (20, 9, 6)])
def test_fused_kernel_is_the_eager_arithmetic_bit_for_bit(rows, num_reqs, k):
    """Every row in one launch, past one block of rows (260 > 128), K other than 4:
    equal to corrected_confidences in every bit, rows past the batch copied."""
    rng = np.random.default_rng(rows + num_reqs + k)
    hits, counts = _calibration(rng, k)
    conf = _confidences(rng, rows, k)
    want = _av.corrected_confidences(conf, num_reqs, hits, counts)
    got = launch_av(conf, num_reqs, hits, counts, _av.AV_PRIOR, torch.full_like(conf, -7.0))
    same = (got == want) | (torch.isnan(got) & torch.isnan(want))  # copied NaN rows
    assert bool(same.all()), (got - want).abs().nan_to_num().max()
    assert not torch.equal(want[:num_reqs], conf[:num_reqs])  # the calibration moved them


def test_the_kernels_sums_are_the_steps_survivals():
    """The statistics the kernel adds up: the estimator's survival, the corrected one
    (what the returned conditionals multiply back to) and their distance, over the
    batch only, added to what the accumulator held."""
    rng = np.random.default_rng(7)
    hits, counts = _calibration(rng, 4)
    conf = _confidences(rng, 50, 4)
    stats = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    out = launch_av(conf, 30, hits, counts, _av.AV_PRIOR, torch.empty_like(conf), stats)
    raw = torch.nan_to_num(conf[:30].double(), nan=1.0).clamp(0, 1).cumprod(dim=1)
    fixed = out[:30].double().cumprod(dim=1)
    want = torch.tensor([1.0 + raw.sum(), 2.0 + fixed.sum(), 3.0 + (fixed - raw).abs().sum()], dtype=torch.float64)
    assert torch.allclose(stats, want, rtol=1e-5), (stats, want)


def _serve(draft_trunc, rows: int = 16, **knobs):
    """draft_trunc with kiln-av on and a calibration on the device (as the runner's
    first verify step leaves it), graded so that the correction moves every draft."""
    dt = draft_trunc(with_av=1, av_calibrate=1, **knobs)
    dt.prepare(rows, "cpu", max_num_tokens=64, num_spec=4)
    cal = dt.snapshot().calibration
    cal.counts.fill_(4096.0)
    cal.hits.copy_(cal.counts * 0.05)  # drafts survive far less often than predicted
    return dt


def test_below_the_minimum_batch_the_hook_steps_aside(draft_trunc):
    dt = _serve(draft_trunc, av_min_batch=4)
    conf = torch.full((16, 4), 0.9)
    assert dt.av_confidences(conf, 3) is conf  # stepped aside: vLLM's own confidences
    out = dt.av_confidences(conf, 4)
    assert out is not conf and bool((out[:4, 0] < 0.5).all())  # corrected
    assert torch.equal(
        out, _av.corrected_confidences(conf, 4, dt.snapshot().calibration.hits, dt.snapshot().calibration.counts)
    )


def test_the_default_minimum_batch_is_the_registrys():
    from kiln_engine.features import DRAFT_TRUNC

    knob = next(k for k in DRAFT_TRUNC.knobs if k.env == "KILN_DRAFT_TRUNC_AV_MIN_BATCH")
    knobs = read_knobs({"KILN_DRAFT_TRUNC": "1", "KILN_DRAFT_TRUNC_WITH_AV": "1", "KILN_DRAFT_TRUNC_AV_CALIBRATE": "1"})
    assert knobs.av_min_batch == knob.default
    assert read_knobs({"KILN_DRAFT_TRUNC_AV_MIN_BATCH": "16"}).av_min_batch == 16
    with pytest.raises(ValueError, match="KILN_DRAFT_TRUNC_AV_MIN_BATCH='-1'"):
        read_knobs({"KILN_DRAFT_TRUNC_AV_MIN_BATCH": "-1"})


def test_timing_needs_the_hook_and_the_statistics():
    base = {"KILN_DRAFT_TRUNC": "1", "KILN_DRAFT_TRUNC_WITH_AV": "1", "KILN_DRAFT_TRUNC_AV_TIMING": "1"}
    with pytest.raises(ValueError, match=r"AV_TIMING=1 .* needs KILN_DRAFT_TRUNC_AV_CALIBRATE=1"):
        read_knobs({**base, "KILN_DRAFT_TRUNC_LOG_INTERVAL": "10"})
    with pytest.raises(ValueError, match="LOG_INTERVAL > 0"):
        read_knobs({**base, "KILN_DRAFT_TRUNC_AV_CALIBRATE": "1"})
    knobs = read_knobs({**base, "KILN_DRAFT_TRUNC_AV_CALIBRATE": "1", "KILN_DRAFT_TRUNC_LOG_INTERVAL": "10"})
    assert knobs.av_timing


def _samples(registry) -> dict[str, float]:
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    text = generate_latest(registry).decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


@pytest.mark.parametrize("timing", [0, 1])
def test_a_flush_reports_what_the_hook_did(draft_trunc, monkeypatch, timing):
    """Five hook calls, two of them below the minimum batch, flushed every 5: the
    counters get the calls, the draft slots and the survival sums, and with timing the
    hook's (host) time; the truncation's counters are left alone."""
    prom = pytest.importorskip("prometheus_client")
    registry = prom.CollectorRegistry()
    counters = _metrics.FeatureCounters.register(registry)
    monkeypatch.setattr(_metrics.FeatureCounters, "register", classmethod(lambda cls, r=None: counters))
    dt = _serve(draft_trunc, av_min_batch=3, log_interval=5, av_timing=timing)
    conf = torch.full((16, 4), 0.8)
    raw = float(torch.tensor([0.8, 0.64, 0.512, 0.4096]).sum())
    for reqs in (2, 4, 1, 3, 5):
        out = dt.av_confidences(conf, reqs)
    fixed = float(out[:5].double().cumprod(dim=1).sum()) / 5  # one request's corrected survival
    got = _samples(registry)
    assert got["kiln_draft_trunc_av_steps_total"] == 3
    assert got["kiln_draft_trunc_av_stepped_aside_total"] == 2
    assert got["kiln_draft_trunc_av_drafts_total"] == (4 + 3 + 5) * 4
    assert got["kiln_draft_trunc_av_survival_raw_total"] == pytest.approx(12 * raw, rel=1e-5)
    assert got["kiln_draft_trunc_av_survival_corrected_total"] == pytest.approx(12 * fixed, rel=1e-5)
    assert got["kiln_draft_trunc_av_survival_shift_total"] == pytest.approx(12 * (raw - fixed), rel=1e-5)
    assert got["kiln_draft_trunc_av_hook_timed_total"] == (3 if timing else 0)
    assert (got["kiln_draft_trunc_av_hook_host_seconds_total"] > 0) == bool(timing)
    assert got["kiln_draft_trunc_av_hook_seconds_total"] == 0  # no CUDA events off CUDA
    assert got["kiln_draft_trunc_proposed_total"] == 0
    summary = _av.last_summary()
    assert summary is not None and summary["av_steps"] == 3
    line = _av_stats.line(summary, timed=bool(timing))
    assert line.startswith("draft_trunc av: steps=3 stepped_aside=2 drafts=48 ")
    assert ("hook_us_per_step" in line) == bool(timing)


def test_no_statistics_no_accumulator(draft_trunc):
    """LOG_INTERVAL=0: the hook corrects, and counts nothing (no summary, no sums)."""
    dt = _serve(draft_trunc)
    conf = torch.full((16, 4), 0.8)
    for _ in range(3):
        dt.av_confidences(conf, 4)
    assert _av.last_summary() is None


def test_a_calibration_for_fewer_drafts_is_refused_not_read_past():
    hits = counts = torch.zeros(2 * GRID + 1)
    conf = torch.full((4, 4), 0.5)
    with pytest.raises(ValueError, match="calibration of 65 cells for 4 drafts"):
        launch_av(conf, 4, hits, counts, _av.AV_PRIOR, torch.empty_like(conf))


@pytest.mark.gpu
@pytest.mark.parametrize("num_reqs", [1, 64, 512, 1024])
def test_fused_kernel_matches_eager_on_gpu(num_reqs):
    """On CUDA, where Triton's plain division is approximate and the eager cumprod a
    float32 tree unless told otherwise: still the eager arithmetic, element by element."""
    rng = np.random.default_rng(num_reqs)
    hits, counts = (t.cuda() for t in _calibration(rng, 4))
    conf = _confidences(rng, 1024 + 8, 4).cuda()
    want = _av.corrected_confidences(conf, num_reqs, hits, counts)
    got = launch_av(conf, num_reqs, hits, counts, _av.AV_PRIOR, torch.empty_like(conf))
    assert bool(((got == want) | (got.isnan() & want.isnan())).all())


@pytest.mark.gpu
def test_hook_time_is_read_from_cuda_events_on_gpu(draft_trunc):
    dt = draft_trunc(with_av=1, av_calibrate=1, log_interval=4, av_timing=1)
    dt.prepare(16, "cuda", max_num_tokens=64, num_spec=4)
    conf = torch.full((16, 4), 0.8, device="cuda")
    for _ in range(12):
        dt.av_confidences(conf, 8)
        torch.cuda.synchronize()
    summary = _av.last_summary()
    assert summary is not None and summary["av_hook_timed"] >= 1
    assert summary["av_hook_seconds"] > 0 and summary["av_hook_host_seconds"] > 0
