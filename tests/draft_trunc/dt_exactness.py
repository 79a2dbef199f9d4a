"""Verify a batch with dead rows masked vs the same batch truly truncated.

Both go through vLLM's own ``rejection_sample`` (each engine version's); the masked batch keeps
every draft row, fills the dead rows' logits with garbage or NaN, and marks the
dead drafts invalid exactly as draft_trunc's verify mask does.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import torch
from kiln_engine.draft_trunc import mask_from_live


@dataclass
class Window:
    logits: torch.Tensor  # [num_logits, V]
    drafts: torch.Tensor  # [num_logits] token per row (row 0: t0)
    pos: torch.Tensor  # [num_logits]
    cu: torch.Tensor  # [num_reqs + 1] int32
    eidx: torch.Tensor  # [num_logits]
    lpos: torch.Tensor  # [num_logits] int32


def _window(logits, drafts, pos, counts, slots) -> Window:
    dev = logits.device
    counts_t = torch.tensor(counts, dtype=torch.int64, device=dev)
    cu = torch.zeros(len(counts) + 1, dtype=torch.int32, device=dev)
    cu[1:] = torch.cumsum(counts_t, 0)
    eidx = torch.repeat_interleave(slots, counts_t)
    starts = torch.repeat_interleave(cu[:-1].long(), counts_t)
    lpos = (torch.arange(eidx.shape[0], device=dev) - starts).to(torch.int32)
    return Window(logits, drafts, pos, cu, eidx, lpos)


def make_case(gen: torch.Generator, num_reqs, k, vocab, device=None, accept_bias=0.8):
    """Random requests: n drafts each, kept count j <= n, drafts that mostly
    follow the target's argmax so that windows run deep. Everything is drawn
    on ``gen``'s device (large vocabularies stay on the GPU)."""
    dev = gen.device
    n = torch.randint(0, k + 1, (num_reqs,), generator=gen, device=dev).cpu()
    j = (torch.rand(num_reqs, generator=gen, device=dev).cpu() * (n + 1).float()).floor().long()
    max_slots = num_reqs + 5
    slots = torch.randperm(max_slots, generator=gen, device=dev)[:num_reqs]
    counts = (n + 1).tolist()
    total = sum(counts)
    # Peaky logits so both greedy and sampled requests accept often.
    logits = torch.randn(total, vocab, generator=gen, device=dev) * 4.0
    follow = torch.rand(total, generator=gen, device=dev) < accept_bias
    rand_tok = torch.randint(0, vocab, (total,), generator=gen, device=dev)
    drafts = torch.where(follow, torch.roll(logits.argmax(-1), 1), rand_tok)
    base = torch.randint(10, 10_000, (num_reqs,), generator=gen, device=dev)
    counts_t = torch.tensor(counts, device=dev)
    starts = torch.repeat_interleave(torch.cumsum(counts_t, 0) - counts_t, counts_t)
    pos = torch.repeat_interleave(base, counts_t) + torch.arange(total, device=dev) - starts
    greedy = torch.rand(max_slots, generator=gen, device=dev) < 0.4
    temperature = torch.where(greedy, 0.0, 0.5 + torch.rand(max_slots, generator=gen, device=dev))
    seeds = torch.randint(0, 2**62, (max_slots,), generator=gen, device=dev)
    draft_logits = torch.randn(max_slots, k, vocab, generator=gen, device=dev) * 4.0
    return dict(
        n=n,
        j=j,
        slots=slots,
        counts=counts,
        logits=logits,
        drafts=drafts,
        pos=pos,
        temperature=temperature.float(),
        seeds=seeds,
        draft_logits=draft_logits,
    )


def with_policy_j(dt, case, k, layer):
    """The case with its kept counts ``j`` chosen by ``mark_dead`` itself (the
    module's current policy, e.g. cost-aware), on a decode batch of the same
    requests with random predictions, instead of drawn at random."""
    dev = case["logits"].device
    n = case["n"]
    slots = case["slots"]
    max_slots = int(case["temperature"].shape[0])
    gen = torch.Generator().manual_seed(int(n.sum()) * 7919 + len(n))
    predictions = (0.3 + 0.7 * torch.rand(max_slots, k, generator=gen)).to(dev)
    counts = (n + 1).to(torch.int32)
    cu = torch.zeros(len(n) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(counts, 0)
    num_tokens = int(cu[-1])
    is_padding = torch.zeros(num_tokens, dtype=torch.bool, device=dev)
    dt.set_moe_layer(layer)
    dt.prepare(max_slots, dev, num_tokens)
    dt.mark_dead(
        is_padding,
        cu.to(dev),
        cu.to(dev),
        len(n),
        k,
        predictions,
        slots.to(dev),
        seq_lens=(counts + 100).to(dev),
        prefill_len=torch.ones(max_slots, dtype=torch.int32, device=dev),
    )
    j = dt.snapshot().buffers.live.index_select(0, slots.to(dev)).long().cpu()
    return dict(case, j=j)


def full_masked(case, dead_fill: str) -> tuple[Window, torch.Tensor]:
    w = _window(case["logits"].clone(), case["drafts"], case["pos"], case["counts"], case["slots"])
    live = torch.zeros(int(case["slots"].max()) + 1, dtype=torch.int32, device=w.logits.device)
    live[case["slots"]] = case["j"].to(torch.int32).to(w.logits.device)
    kept = live.index_select(0, w.eidx)
    dead_rows = w.lpos > kept
    if dead_fill == "nan":
        w.logits[dead_rows] = float("nan")
    elif dead_fill == "garbage":
        # Garbage that would accept every dead draft if it were ever read.
        w.logits[dead_rows] = -1e4
        rows = dead_rows.nonzero().flatten()
        nxt = torch.clamp(rows + 1, max=w.drafts.shape[0] - 1)
        w.logits[rows, w.drafts[nxt]] = 1e4
    mask = mask_from_live(live, w.eidx, w.lpos)
    return w, mask


def truncated(case) -> Window:
    keep_rows = []
    start = 0
    for c, jj in zip(case["counts"], case["j"].tolist(), strict=True):
        keep_rows += list(range(start, start + jj + 1))
        start += c
    idx = torch.tensor(keep_rows, dtype=torch.long, device=case["logits"].device)
    counts = (case["j"] + 1).tolist()
    return _window(
        case["logits"][idx].contiguous(),
        case["drafts"][idx],
        case["pos"][idx],
        counts,
        case["slots"],
    )


def verify(rsu, w: Window, case, k, mode, invalid=None):
    drafts = w.drafts if invalid is None else w.drafts.masked_fill(invalid, -1)
    draft_logits = case["draft_logits"] if mode.endswith("draft_probs") else None
    if draft_logits is not None and "draft_logits_cache" in rsu.rejection_sample.__code__.co_varnames:
        # vLLM 0.34.0 takes its DraftLogitsCache: the values, one row per request state
        draft_logits = types.SimpleNamespace(values=draft_logits, row_mapping=None)
    return rsu.rejection_sample(
        w.logits,
        draft_logits,
        drafts,
        w.cu,
        w.pos,
        case["slots"],
        w.eidx,
        w.lpos,
        case["temperature"],
        case["seeds"],
        k,
        use_block_verification=mode.startswith("block"),
        # FLy (vLLM >= 0.33.0): threshold 0 defers every rejection it may, so the
        # window gate on the proposed draft count is exercised on every request
        **({"fly_window_size": 2, "fly_entropy_threshold": 0.0} if mode == "fly" else {}),
    )


def mismatches(rsu, case, k, mode, dead_fill, apply_mask=True) -> int:
    """Requests whose output differs between masked-full and truncated."""
    if mode.startswith("greedy"):
        case = dict(case, temperature=torch.zeros_like(case["temperature"]))
    full, mask = full_masked(case, dead_fill)
    s_full, n_full = verify(rsu, full, case, k, mode, mask if apply_mask else None)
    trunc = truncated(case)
    s_tr, n_tr = verify(rsu, trunc, case, k, mode)
    bad = n_full != n_tr
    cols = torch.arange(s_full.shape[1], device=s_full.device)
    valid = cols[None, :] < n_tr[:, None]
    bad |= ((s_full != s_tr) & valid).any(dim=1)
    return int(bad.sum())
