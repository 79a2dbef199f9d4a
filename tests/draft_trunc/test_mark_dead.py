"""mark_dead's Triton kernel against the pure-PyTorch reference (interpreter on CPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from dt_reference import mark_dead_ref, verify_mask_ref
from kiln_testkit.dt_batches import random_batch

pytest.importorskip("triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def run_both(dt, batch, refits=None, step=None):
    """Launch the kernel via mark_dead and the reference; return both results."""
    b = batch.to(DEVICE)
    dt.prepare(b.predictions.shape[0], DEVICE)
    step = int(dt.snapshot().buffers.step.item()) if step is None else step
    launched = b.mark_dead(dt, num_draft_tokens=int(batch.num_drafts.sum()), refits=refits)
    ref_pad = batch.is_padding.clone()
    max_reqs = batch.predictions.shape[0]
    ref_live = torch.full((max_reqs,), -1, dtype=torch.int32)
    ref_exp = torch.full((max_reqs,), -1.0)
    mark_dead_ref(
        ref_pad,
        batch.query_start_loc,
        batch.cu_num_logits,
        batch.idx_mapping,
        batch.seq_lens,
        batch.prefill_len,
        batch.predictions,
        ref_live,
        ref_exp,
        step,
        batch.num_reqs,
        dt.KNOBS.tau,
        dt.KNOBS.min_keep,
        dt.KNOBS.explore,
    )
    return launched, b, ref_pad, ref_live, ref_exp


@pytest.mark.parametrize("seed", range(24))
def test_kernel_matches_reference(draft_trunc, seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 9))
    dt = draft_trunc(
        tau=float(rng.choice([0.0, 0.1, 0.3, 0.6, 1.0])),
        min_keep=int(rng.integers(0, 3)),
        explore=float(rng.choice([0.0, 0.2])),
    )
    batch = random_batch(
        rng,
        int(rng.integers(1, 80)),
        k,
        pad_reqs=int(rng.integers(0, 4)),
        pad_tokens=int(rng.integers(0, 9)),
    )
    launched, b, ref_pad, ref_live, ref_exp = run_both(dt, batch)
    assert launched == (batch.num_drafts.sum() > 0)
    if not launched:
        assert torch.equal(b.is_padding.cpu(), batch.is_padding)
        return
    assert torch.equal(b.is_padding.cpu(), ref_pad)
    slots = batch.idx_mapping
    assert torch.equal(dt.snapshot().buffers.live.cpu()[slots], ref_live[slots])
    torch.testing.assert_close(dt.snapshot().buffers.expected.cpu()[slots], ref_exp[slots], rtol=1e-5, atol=1e-5)
    eidx, lpos = b.expanded
    mask = dt.verify_mask(type("IB", (), {"expanded_idx_mapping": eidx, "expanded_local_pos": lpos}))
    assert torch.equal(mask.cpu(), verify_mask_ref(ref_live, batch.cu_num_logits, slots))
    # vLLM 0.34.0's hook (in its rejection sampler): the same rows, as -1 draft ids
    drafts = torch.arange(eidx.shape[0], device=eidx.device) + 7
    verified = dt.verify_drafts(drafts, eidx, lpos)
    assert torch.equal(verified.cpu(), drafts.masked_fill(mask, -1).cpu())
    assert torch.equal(drafts.cpu(), (torch.arange(eidx.shape[0]) + 7))  # the real ids stay


def test_marks_only_dead_draft_tails(draft_trunc):
    """Every marked token is a draft past j of an eligible decode request; t0,
    prompt tokens and tokens past num_tokens are never touched."""
    dt = draft_trunc(tau=0.5, min_keep=0, explore=0.0)
    rng = np.random.default_rng(123)
    batch = random_batch(rng, 200, 6, pad_tokens=5)
    _, b, _, _, _ = run_both(dt, batch)
    pad = b.is_padding.cpu()
    live = dt.snapshot().buffers.live.cpu()
    qsl, cu = batch.query_start_loc, batch.cu_num_logits
    marked_total = 0
    for r in range(batch.num_reqs):
        qs, qe = int(qsl[r]), int(qsl[r + 1])
        n = int(cu[r + 1] - cu[r]) - 1
        j = int(live[int(batch.idx_mapping[r])])
        marked = pad[qs:qe].nonzero().flatten().tolist()
        assert marked == [qe - qs - (n - j) + i for i in range(n - j)] if marked else True
        assert qe - qs - n - 1 not in marked  # t0 (and everything before it) stays
        marked_total += len(marked)
    assert marked_total > 0, "the batch should have had something to truncate"
    assert bool(pad[batch.num_tokens :].all())


def test_warmup_and_missing_predictions_write_nothing(draft_trunc):
    dt = draft_trunc(warmup=3, tau=1.0)
    batch = random_batch(np.random.default_rng(7), 30, 4, mixed=False).to(DEVICE)
    dt.prepare(batch.predictions.shape[0], DEVICE)
    before = batch.is_padding.clone()
    args = (batch.is_padding, batch.query_start_loc, batch.cu_num_logits, batch.num_reqs, 4)
    kw = dict(seq_lens=batch.seq_lens, prefill_len=batch.prefill_len)
    assert not dt.mark_dead(*args, batch.predictions, batch.idx_mapping, refits=2, **kw)
    assert not dt.mark_dead(*args, None, batch.idx_mapping, refits=5, **kw)
    assert torch.equal(batch.is_padding, before)
    assert dt.verify_mask(object(), None) is None
    drafts = torch.arange(5)
    assert dt.verify_drafts(drafts, drafts, drafts) is drafts
    rejected = torch.ones(30, dtype=torch.int32)
    assert dt.graded(rejected, batch.cu_num_logits, batch.idx_mapping) is rejected
    assert dt.mark_dead(*args, batch.predictions, batch.idx_mapping, refits=3, **kw)
    assert not torch.equal(batch.is_padding, before)


def test_disabled_is_a_no_op():
    import kiln_engine.draft_trunc as dt

    dt.reload({})
    pad = torch.zeros(4, dtype=torch.bool)
    assert not dt.mark_dead(pad, None, None, 1, 4, torch.zeros(1, 4), None, seq_lens=None, prefill_len=None)
    assert not pad.any() and dt.snapshot().buffers is None


def test_step_counter_advances_and_keys_exploration(draft_trunc):
    """Exploration is keyed by the device step: two launches on the same batch
    explore different slots, each matching the reference at its own step."""
    dt = draft_trunc(tau=1.0, min_keep=0, explore=0.5)
    batch = random_batch(np.random.default_rng(3), 64, 4, mixed=False)
    lives = []
    for step in (0, 1):
        fresh = random_batch(np.random.default_rng(3), 64, 4, mixed=False)
        _, b, ref_pad, _ref_live, _ = run_both(dt, fresh, step=step)
        assert torch.equal(b.is_padding.cpu(), ref_pad)
        lives.append(dt.snapshot().buffers.live.cpu()[batch.idx_mapping].clone())
    assert int(dt.snapshot().buffers.step.item()) == 2
    assert not torch.equal(lives[0], lives[1])
