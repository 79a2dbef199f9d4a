"""Random verify batches shaped like vLLM 0.32.0's prepare_inputs builds them, and
draft_trunc's hook called on one as the patched runner calls it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:  # the kernel module imports triton, which must see TRITON_INTERPRET first
    from kiln_engine.draft_trunc._kernels.buffers import MarkInputs


@dataclass
class Batch:
    """A batch of requests as draft-trunc's hooks see it: token layout, sequence lengths and per-request tensors."""

    num_reqs: int
    num_tokens: int
    is_padding: torch.Tensor  # [num_tokens_after_padding] bool
    query_start_loc: torch.Tensor  # [num_reqs_padded + 1] int32
    cu_num_logits: torch.Tensor  # [num_reqs + 1] int32
    idx_mapping: torch.Tensor  # [num_reqs] int64
    seq_lens: torch.Tensor  # [num_reqs] int32
    prefill_len: torch.Tensor  # [max_num_reqs] int32
    predictions: torch.Tensor  # [max_num_reqs, K] fp32
    num_drafts: np.ndarray  # [num_reqs]

    def to(self, device: torch.device | str) -> Batch:
        """The batch with every tensor moved to `device`."""
        moved: dict[str, Any] = {k: v.to(device) for k, v in vars(self).items() if isinstance(v, torch.Tensor)}
        return dataclasses.replace(self, **moved)

    def mark_dead(self, dt: ModuleType, **kwargs: Any) -> bool:
        """``dt.mark_dead`` (``kiln_engine.draft_trunc``) on this batch, with the
        arguments patch 0002 passes; ``kwargs``: ``num_draft_tokens``, ``refits``."""
        return bool(
            dt.mark_dead(
                self.is_padding,
                self.query_start_loc,
                self.cu_num_logits,
                self.num_reqs,
                self.predictions.shape[1],
                self.predictions,
                self.idx_mapping,
                seq_lens=self.seq_lens,
                prefill_len=self.prefill_len,
                **kwargs,
            )
        )

    def mark_inputs(self) -> MarkInputs:
        """What ``_kernels.kernel.launch_mark_dead`` reads of this batch."""
        from kiln_engine.draft_trunc._kernels.buffers import MarkInputs

        return MarkInputs(
            self.is_padding,
            self.query_start_loc,
            self.cu_num_logits,
            self.idx_mapping,
            self.seq_lens,
            self.prefill_len,
            self.predictions,
        )

    @property
    def expanded(self) -> tuple[torch.Tensor, torch.Tensor]:
        """expanded_idx_mapping and expanded_local_pos, one entry per logits row."""
        counts = (self.cu_num_logits[1:] - self.cu_num_logits[:-1]).long()
        eidx = torch.repeat_interleave(self.idx_mapping, counts)
        starts = torch.repeat_interleave(self.cu_num_logits[:-1].long(), counts)
        lpos = torch.arange(eidx.shape[0], device=eidx.device) - starts
        return eidx, lpos.to(torch.int32)


def random_predictions(rng: np.random.Generator, rows: int, k: int) -> torch.Tensor:
    """Mostly uniform, with exact zeros, exact ones and NaN sprinkled in."""
    p = rng.uniform(0.0, 1.0, size=(rows, k)).astype(np.float32)
    special = rng.uniform(size=(rows, k))
    p[special < 0.08] = 0.0
    p[(special >= 0.08) & (special < 0.2)] = 1.0
    p[(special >= 0.2) & (special < 0.25)] = np.nan
    return torch.from_numpy(p)


def random_batch(
    rng: np.random.Generator,
    num_reqs: int,
    k: int,
    max_num_reqs: int | None = None,
    mixed: bool = True,
    pad_reqs: int = 0,
    pad_tokens: int = 0,
) -> Batch:
    """A batch of verifying requests (n in [0, K]); with ``mixed``, also prefill
    chunks, placeholder drafts of a request still in its prefill, and queries
    longer than their verify window."""
    max_num_reqs = max_num_reqs or num_reqs + 7
    slots = rng.permutation(max_num_reqs)[:num_reqs]
    prefill_len = rng.integers(1, 50, size=max_num_reqs).astype(np.int32)
    qlens, ns, seq_lens = [], [], []
    for r in range(num_reqs):
        plen = int(prefill_len[slots[r]])
        kind = rng.choice(["decode", "prefill", "placeholder", "long"], p=[0.7, 0.1, 0.1, 0.1])
        if not mixed:
            kind = "decode"
        n = int(rng.integers(0, k + 1))
        if kind == "decode":  # t0 at a position past the prefill
            qlen, seq_len = n + 1, plen + int(rng.integers(0, 30)) + n + 1
        elif kind == "prefill":  # a prompt chunk, no drafts
            n, qlen = 0, int(rng.integers(1, 12))
            seq_len = int(rng.integers(qlen, plen + qlen + 1))
        elif kind == "placeholder":  # drafts scheduled while t0 is still prefill
            n = max(n, 1)
            qlen = n + 1
            seq_len = int(rng.integers(qlen, plen + n + 1))
        else:  # more query tokens than the verify window
            qlen = n + 1 + int(rng.integers(1, 6))
            seq_len = plen + qlen + int(rng.integers(0, 10))
        qlens.append(qlen)
        ns.append(n)
        seq_lens.append(seq_len)
    num_tokens = int(sum(qlens))
    qsl = np.full(num_reqs + pad_reqs + 1, num_tokens, dtype=np.int32)
    qsl[0] = 0
    qsl[1 : num_reqs + 1] = np.cumsum(qlens)
    cu = np.zeros(num_reqs + 1, dtype=np.int32)
    cu[1:] = np.cumsum(np.array(ns) + 1)
    is_padding = torch.zeros(num_tokens + pad_tokens, dtype=torch.bool)
    is_padding[num_tokens:] = True
    return Batch(
        num_reqs=num_reqs,
        num_tokens=num_tokens,
        is_padding=is_padding,
        query_start_loc=torch.from_numpy(qsl),
        cu_num_logits=torch.from_numpy(cu),
        idx_mapping=torch.from_numpy(slots.astype(np.int64)),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        prefill_len=torch.from_numpy(prefill_len),
        predictions=random_predictions(rng, max_num_reqs, k),
        num_drafts=np.array(ns),
    )
