"""Censored grading feeds the estimator only verified drafts; log_step's totals."""

from __future__ import annotations

from types import SimpleNamespace as NS

import numpy as np
import pytest
import torch
from kiln_testkit.dt_batches import random_batch

pytest.importorskip("triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _marked_batch(dt, seed=11, num_reqs=96, k=5):
    batch = random_batch(np.random.default_rng(seed), num_reqs, k).to(DEVICE)
    dt.prepare(batch.predictions.shape[0], DEVICE)
    assert batch.mark_dead(dt, refits=10)
    n = torch.from_numpy(batch.num_drafts).to(DEVICE)
    j = dt.snapshot().buffers.live[batch.idx_mapping].long()
    # Accepted a <= j; force many a = j to exercise the censored boundary.
    gen = torch.Generator().manual_seed(seed)
    u, v = torch.rand(num_reqs, generator=gen), torch.rand(num_reqs, generator=gen)
    a = torch.where(u.to(DEVICE) < 0.5, j, (j.float() * v.to(DEVICE)).floor().long())
    return batch, n, j, a


def _stats(ae, k, max_reqs, idx_mapping, num_sampled, num_rejected, features, preds):
    est = ae.OnlineAcceptanceEstimator(max_reqs, k, torch.device(DEVICE))
    est.features.copy_(features)
    est.predictions.copy_(preds)
    est.step(idx_mapping, num_sampled.to(torch.int32), num_rejected.to(torch.int32))
    return torch.cat([est.info.flatten(), est.grad.flatten(), est.counts])


@pytest.mark.network
@pytest.mark.kernels  # vLLM's sources (conftest vllm_src)
def test_censored_grading_equals_truly_truncated(draft_trunc, vllm_kernels):
    dt = draft_trunc(tau=0.4, min_keep=0, explore=0.0)
    k = 5
    batch, n, j, a = _marked_batch(dt, k=k)
    assert bool((a == j).logical_and(j < n).any()), "need boundary hits"
    num_sampled = a + 1
    rejected_full = (n + 1) - num_sampled  # what vLLM reports for the full window
    rejected_trunc = (j + 1) - num_sampled  # what a batch truncated to j reports
    graded = dt.graded(rejected_full.to(torch.int32), batch.cu_num_logits, batch.idx_mapping)
    assert torch.equal(graded.long(), rejected_trunc)
    max_reqs = batch.predictions.shape[0]
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(max_reqs, k, generator=gen).to(DEVICE)
    preds = torch.rand(max_reqs, k, generator=gen).to(DEVICE)
    args = (vllm_kernels.ae, k, max_reqs, batch.idx_mapping, num_sampled)
    censored = _stats(*args, graded, features, preds)
    truth = _stats(*args, rejected_trunc, features, preds)
    uncensored = _stats(*args, rejected_full, features, preds)
    torch.testing.assert_close(censored, truth, rtol=0, atol=0)
    assert not torch.allclose(uncensored, truth), "control: uncensored labels differ"


def test_log_step_totals(draft_trunc, caplog):
    dt = draft_trunc(tau=0.4, min_keep=0, explore=0.0, log_interval=2)
    # the model's config says top-8 routing (what check_config reads at start)
    dt.check_config(NS(model_config=NS(hf_text_config=NS(num_experts_per_tok=8))))
    assert dt.snapshot().top_k == 8
    expect = dict.fromkeys(["proposed", "kept", "accepted", "dead", "boundary", "tokens"], 0.0)
    summary = None
    with caplog.at_level("INFO", logger="kiln_engine.draft_trunc"):
        for seed in (1, 2):
            batch, n, j, a = _marked_batch(dt, seed=seed)
            summary = (
                dt.log_step(
                    batch.cu_num_logits,
                    (a + 1).to(torch.int32),
                    batch.idx_mapping,
                    batch.num_tokens,
                )
                or summary
            )
            expect["proposed"] += float(n.sum())
            expect["kept"] += float(j.sum())
            expect["accepted"] += float(a.sum())
            expect["dead"] += float((n - j).sum())
            expect["boundary"] += float(((a == j) & (j < n)).sum())
            expect["tokens"] += batch.num_tokens
    if summary is None and torch.cuda.is_available():
        # The flush never waits for its copy; once the copy has landed, the
        # next poll reports it.
        torch.cuda.synchronize()
        summary = dt.poll_summary()
    assert summary is not None, "the second step should flush"
    for key, value in expect.items():
        assert summary.values[key] == pytest.approx(value), key
    assert summary.values["steps"] == 2
    assert f"expert_slots_saved={8 * expect['dead']:.0f}" in caplog.text


def test_log_step_off_without_marks(draft_trunc):
    dt = draft_trunc(log_interval=1)
    dt.reload({"KILN_DRAFT_TRUNC": "1", "KILN_DRAFT_TRUNC_LOG_INTERVAL": "1"})
    assert dt.log_step(None, None, None, 0) is None  # nothing was marked this step


def test_trace_records_predictions_kept_and_accepted(draft_trunc, tmp_path):
    """KILN_DRAFT_TRUNC_TRACE: one JSON line per verify step with the predictions the
    marks were made from (snapshotted at mark time: the speculator overwrites the
    buffer before the outcome is known), kept j and accepted a <= j per request."""
    import json

    path = tmp_path / "trace.jsonl"
    dt = draft_trunc(tau=0.4, min_keep=0, explore=0.0, trace=path)
    k = 5
    steps = []
    for seed in (3, 4):
        batch, n, j, a = _marked_batch(dt, seed=seed, k=k)
        expected_p = batch.predictions[batch.idx_mapping].tolist()
        batch.predictions.fill_(0.5)  # the next step's drafts overwrite the buffer
        assert (
            dt.log_step(batch.cu_num_logits, (a + 1).to(torch.int32), batch.idx_mapping, batch.num_tokens) is None
        )  # no statistics without an interval
        steps.append((n.tolist(), j.tolist(), a.tolist(), expected_p))
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1] and all(x["k"] == k for x in lines)
    for line, (n, j, a, p) in zip(lines, steps, strict=True):
        verifying = [i for i in range(len(n)) if n[i] > 0]
        assert len(line["reqs"]) == len(verifying) > 0
        for req, i in zip(line["reqs"], verifying, strict=True):
            assert (req["n"], req["kept"], req["accepted"]) == (n[i], j[i], a[i])
            assert req["accepted"] <= req["kept"] <= req["n"]
            want = [None if x != x else x for x in p[i]]  # NaN (no prediction) is null  # noqa: PLR0124
            assert req["p"] == pytest.approx(want, abs=1e-6)


def test_trace_alone_turns_log_step_on(draft_trunc, tmp_path):
    assert draft_trunc(log_interval=0).LOG is False
    assert draft_trunc(log_interval=0, trace=tmp_path / "t.jsonl").LOG is True
