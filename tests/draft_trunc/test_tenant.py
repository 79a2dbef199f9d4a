"""One tenant cannot steer the calibration: the drafts of requests
whose sampling settings act on the target only stay out of the cost policy's
calibration cells, and nothing else moves (``kiln_engine.draft_trunc._tenant``)."""

from __future__ import annotations

from types import SimpleNamespace as NS

import numpy as np
import pytest
import torch
from kiln_testkit.dt_batches import random_batch

pytest.importorskip("triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
K = 4
NUM_REQS = 40
FLAGGED_ROWS = list(range(0, NUM_REQS, 3))  # a third of the batch: one tenant's requests


def _params(**over):
    """vLLM's SamplingParams as the worker receives them, by attribute (vLLM's defaults)."""
    fields = dict(
        temperature=1.0,
        seed=None,
        top_p=1.0,
        top_k=0,
        min_p=0.0,
        repetition_penalty=1.0,
        frequency_penalty=0.0,
        presence_penalty=0.0,
        logit_bias=None,
        allowed_token_ids=None,
        bad_words_token_ids=None,
        structured_outputs=None,
        thinking_token_budget=None,
        trace_decode_token_ids=None,
        min_tokens=0,
        all_stop_token_ids=set(),
    )
    return NS(**{**fields, **over})


PENALISED = _params(repetition_penalty=1.3)


@pytest.mark.parametrize(
    "over,expected",
    [
        ({}, []),
        ({"temperature": 0.0}, []),
        ({"temperature": 0.7, "seed": 3}, []),  # the drafter samples with both
        ({"repetition_penalty": 1.2}, ["repetition_penalty"]),
        ({"frequency_penalty": 0.5}, ["frequency_penalty"]),
        ({"temperature": 0.0, "presence_penalty": -0.5}, ["presence_penalty"]),  # moves the argmax
        ({"temperature": 0.8, "top_k": 5}, ["top_k"]),
        ({"temperature": 0.8, "top_k": -1}, []),  # every token
        ({"top_p": 0.9}, ["top_p"]),
        ({"min_p": 0.1}, ["min_p"]),
        ({"temperature": 0.0, "top_k": 5, "top_p": 0.5}, []),  # greedy: the argmax survives
        ({"logit_bias": {5: 10.0}}, ["logit_bias"]),
        ({"logit_bias": {}}, []),
        ({"allowed_token_ids": [1, 2]}, ["allowed_token_ids"]),
        ({"bad_words_token_ids": [[3]]}, ["bad_words"]),
        ({"structured_outputs": NS(regex="[0-9]+")}, ["structured_outputs"]),
        ({"thinking_token_budget": 0}, ["thinking_token_budget"]),
        ({"trace_decode_token_ids": [7]}, ["trace_decode_token_ids"]),
        ({"min_tokens": 4, "all_stop_token_ids": {2}}, ["min_tokens"]),
        ({"min_tokens": 4}, []),  # no stop token to mask
    ],
)
def test_target_only_settings(over, expected):
    from kiln_engine.draft_trunc import target_only_settings

    assert target_only_settings(_params(**over)) == expected


def test_the_servers_defaults_are_everyones_traffic():
    """A model whose generation config sets a penalty or top_p gives them to every
    request: only a request that departs from them is one tenant's choice."""
    from kiln_engine.draft_trunc import target_only_settings

    defaults = {"repetition_penalty": 1.05, "top_p": 0.95, "temperature": 0.6}
    as_served = _params(temperature=0.6, top_p=0.95, repetition_penalty=1.05)
    assert target_only_settings(as_served, defaults) == []
    # vLLM resets a greedy request's top_p to 1.0: not a departure
    assert target_only_settings(_params(temperature=0.0, repetition_penalty=1.05), defaults) == []
    assert target_only_settings(_params(temperature=0.6, top_p=0.95), defaults) == ["repetition_penalty"]
    assert target_only_settings(_params(temperature=0.6, top_p=0.5, repetition_penalty=1.05), defaults) == ["top_p"]


def test_check_config_reads_the_servers_defaults(draft_trunc):
    dt = draft_trunc()
    defaults = {"repetition_penalty": 1.05, "top_p": 0.95, "max_tokens": 512}
    model = NS(get_diff_sampling_param=lambda: defaults, hf_text_config=NS(num_experts_per_tok=8))
    dt.check_config(NS(model_config=model))
    assert dt.snapshot().sampling_defaults == defaults
    dt.note_request(1, _params(top_p=0.95, repetition_penalty=1.05))
    dt.note_request(2, _params(top_p=0.95))  # the tenant turned the server's penalty off
    assert dt.snapshot().target_only == {2}


def test_note_request_is_a_no_op_when_off(draft_trunc):
    dt = draft_trunc()
    dt.reload({})
    dt.note_request(3, PENALISED)
    assert dt.snapshot().target_only == frozenset()


def _step(dt, seed, only_rows=None):
    """One verify step on the seed's batch (the same batch in every state): mark_dead,
    then graded with random outcomes, seeing only ``only_rows`` (others: slot -1, as
    vLLM's padded rows). Returns the censored counts and the accepted drafts."""
    b = random_batch(np.random.default_rng(seed), NUM_REQS, K).to(DEVICE)
    assert b.mark_dead(dt)
    j = dt.snapshot().buffers.live[b.idx_mapping].long().cpu()
    u = torch.rand(NUM_REQS, generator=torch.Generator().manual_seed(seed))
    accepted = (j.float() * u).round().long()
    num_rejected = (torch.from_numpy(b.num_drafts) - accepted).to(torch.int32).to(DEVICE)
    idx = b.idx_mapping
    if only_rows is not None:
        keep = torch.zeros(NUM_REQS, dtype=torch.bool)
        keep[only_rows] = True
        idx = torch.where(keep.to(DEVICE), idx, torch.full_like(idx, -1))
    return dt.graded(num_rejected, b.cu_num_logits, idx), accepted, b


def _cells(dt):
    cal = dt.snapshot().calibration
    return torch.stack([cal.counts, cal.hits]).cpu().clone()


def _slots(seed, rows):
    b = random_batch(np.random.default_rng(seed), NUM_REQS, K)
    return [int(b.idx_mapping[r]) for r in rows]


def _cost_policy(draft_trunc, explore=0.3):
    return draft_trunc(policy="cost", explore=explore, min_keep=1, log_interval=1)


def test_flagged_rows_leave_the_calibration_and_nothing_else(draft_trunc):
    """The same step three times: every row graded (A), a third of the rows flagged
    (B), and only that third graded (C): B's cells are A's less C's, exactly; the
    estimator's censored labels are the same in A and B."""
    seed = 5
    dt = _cost_policy(draft_trunc)
    censored_a, _, _ = _step(dt, seed)
    all_rows = _cells(dt)
    dt = _cost_policy(draft_trunc)
    for slot in _slots(seed, FLAGGED_ROWS):
        dt.note_request(slot, PENALISED)
    censored_b, accepted, b = _step(dt, seed)
    kept_out = _cells(dt)
    summary = (
        dt.log_step(b.cu_num_logits, (accepted + 1).to(torch.int32).to(DEVICE), b.idx_mapping, b.num_tokens)
        or dt.poll_summary()
    )
    dt = _cost_policy(draft_trunc)
    _step(dt, seed, only_rows=FLAGGED_ROWS)
    flagged_only = _cells(dt)
    assert flagged_only[0].sum() > 0, "the flagged rows had no drafts to grade"
    assert torch.equal(kept_out + flagged_only, all_rows)
    assert torch.equal(censored_a, censored_b)
    # the statistics count both: drafts graded, and drafts kept out
    assert summary is not None
    assert summary.values["graded"] == float(kept_out[0].sum())
    assert summary.values["excluded"] == float(flagged_only[0].sum())


def test_a_batch_of_normal_requests_grades_exactly_as_before(draft_trunc):
    seed = 6
    dt = _cost_policy(draft_trunc)
    censored_before, _, _ = _step(dt, seed)
    before = _cells(dt)
    dt = _cost_policy(draft_trunc)
    normal = [_params(), _params(temperature=0.0), _params(temperature=0.8, seed=1)]
    slots = _slots(seed, range(NUM_REQS))
    for i, slot in enumerate(slots):
        dt.note_request(slot, PENALISED)  # a flagged request left the slot ...
        dt.note_request(slot, normal[i % len(normal)])  # ... and a normal one took it
    assert dt.snapshot().target_only == frozenset()
    censored, accepted, b = _step(dt, seed)
    summary = (
        dt.log_step(b.cu_num_logits, (accepted + 1).to(torch.int32).to(DEVICE), b.idx_mapping, b.num_tokens)
        or dt.poll_summary()
    )
    assert torch.equal(_cells(dt), before)
    assert torch.equal(censored, censored_before)
    assert summary is not None and summary.values["excluded"] == 0.0
    assert summary.values["graded"] == float(before[0].sum()) > 0


def test_a_slots_flag_follows_its_request_across_steps(draft_trunc):
    """Slot flags change on the device mask once it exists: step 1 keeps rows S out,
    then S's slots get normal requests and rows T's flagged ones, and step 2 keeps T
    out. Every draft is verified (explore 1), so the marks do not depend on what
    the calibration learnt and three fresh states give the parts to compare."""
    seed, s_rows, t_rows = 7, FLAGGED_ROWS, list(range(1, NUM_REQS, 3))
    dt = _cost_policy(draft_trunc, explore=1.0)
    for slot in _slots(seed, s_rows):
        dt.note_request(slot, PENALISED)
    _step(dt, seed)
    for slot in _slots(seed, s_rows):
        dt.note_request(slot, _params())
    for slot in _slots(seed, t_rows):
        dt.note_request(slot, _params(allowed_token_ids=[1, 2, 3]))
    _step(dt, seed)
    flagged = _cells(dt)
    dt = _cost_policy(draft_trunc, explore=1.0)
    _step(dt, seed)
    _step(dt, seed)
    everything = _cells(dt)
    dt = _cost_policy(draft_trunc, explore=1.0)
    _step(dt, seed, only_rows=s_rows)  # S in step 1
    _step(dt, seed, only_rows=t_rows)  # T in step 2
    parts = _cells(dt)
    assert parts[0].sum() > 0
    assert torch.equal(flagged + parts, everything)
