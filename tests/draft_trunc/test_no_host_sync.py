"""draft-trunc's step adds no host sync: every hook of one step (mark, verify, grade,
fold into the statistics) runs without a kiln_engine frame reading a tensor back to the
host. On the CPU twin a read-back costs nothing, which is why it is caught by the call
rather than by time: `.item()`, `.tolist()`, `.cpu()`, `.numpy()` and `bool`/`int`/
`float` of a tensor from kiln_engine's code fail the test. Triton's interpreter, which
runs the kernels here, reads tensors back itself; its frames are not kiln_engine's."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch
from kiln_testkit.dt_batches import random_batch

pytest.importorskip("triton")
_READ_BACKS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


class HostSync(AssertionError):
    """A kiln_engine frame read a tensor back to the host."""


@pytest.fixture
def no_read_back(monkeypatch):
    """Every tensor read-back from a kiln_engine frame raises HostSync."""
    for name in _READ_BACKS:
        original = getattr(torch.Tensor, name)

        def guarded(self, *args, _original=original, _name=name, **kwargs):
            caller = sys._getframe(1).f_globals.get("__name__", "")  # who asked is the point
            if caller.startswith("kiln_engine"):
                raise HostSync(f"{caller} called Tensor.{_name}: a host sync in the step")
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, guarded)


def _one_step(dt, batch) -> None:
    assert batch.mark_dead(dt, refits=10)
    eidx, lpos = batch.expanded
    drafts = torch.arange(eidx.shape[0], dtype=torch.int64)
    dt.verify_drafts(drafts, eidx, lpos)
    num_drafts = torch.from_numpy(batch.num_drafts)
    rejected = torch.zeros_like(num_drafts, dtype=torch.int32) + 1
    dt.graded(rejected, batch.cu_num_logits, batch.idx_mapping)
    dt.log_step(batch.cu_num_logits, (num_drafts + 1 - rejected).to(torch.int32), batch.idx_mapping, batch.num_tokens)


def test_one_draft_trunc_step_reads_nothing_back(draft_trunc, no_read_back):
    dt = draft_trunc(log_interval=1000)  # the shipped statistics, not their flush step
    batch = random_batch(np.random.default_rng(5), 16, 4)
    dt.prepare(batch.predictions.shape[0], "cpu", batch.is_padding.shape[0], num_spec=4)
    _one_step(dt, batch)
    _one_step(dt, batch)  # the second step too: state kept across steps


def test_the_guard_catches_a_read_back(draft_trunc, no_read_back, monkeypatch):
    """Control: a hook that reads its kept counts back is caught."""
    dt = draft_trunc(log_interval=1000)
    from kiln_engine.draft_trunc import _verify

    original = _verify.mask_from_live

    def reading(live, *args, **kwargs):
        live.tolist()
        return original(live, *args, **kwargs)

    # the same function, run as kiln_engine code (its globals are the module's)
    as_engine = types.FunctionType(reading.__code__, vars(_verify), "reading", None, reading.__closure__)
    monkeypatch.setattr(_verify, "mask_from_live", as_engine)
    batch = random_batch(np.random.default_rng(5), 16, 4)
    dt.prepare(batch.predictions.shape[0], "cpu", batch.is_padding.shape[0], num_spec=4)
    with pytest.raises(HostSync, match=r"kiln_engine\.draft_trunc\._verify called Tensor\.tolist"):
        _one_step(dt, batch)
