"""Comparisons of feature-on and feature-off outputs (tests/e2e/test_tiny_kindling.py).

Greedy: token ids must be equal, or diverge only at a numeric tie. Sampled: on and off
are equal in distribution, not per seed, so they are compared with a permutation test
that keeps each request's tokens together (tokens within a request depend on each
other; requests are independent), stratified by prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kiln_testkit.requestsets import Completion


@dataclass
class Divergence:
    """Where two runs' greedy answers first differ: the prompt, position and the reference's top-2 margin."""

    prompt: int
    position: int
    margin: float  # top-2 logprob margin at the divergence, in the reference run


def greedy_divergences(on: list[Completion], off: list[Completion]) -> list[Divergence]:
    """First position where each pair of greedy completions differs, with the top-2
    logprob margin there (from the off run, the reference; inf if it is missing)."""
    out = []
    for a, b in zip(on, off, strict=True):
        assert a.prompt == b.prompt
        pos = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids, strict=False)) if x != y), None)
        if pos is None:
            if len(a.token_ids) != len(b.token_ids):
                out.append(Divergence(a.prompt, min(len(a.token_ids), len(b.token_ids)), float("inf")))
            continue
        margins = []
        for run in (b, a):
            if pos < len(run.top) and len(run.top[pos]) >= 2:
                margins.append(run.top[pos][0][1] - run.top[pos][1][1])
        out.append(Divergence(a.prompt, pos, margins[0] if margins else float("inf")))
    return out


def token_histograms(groups: list[list[int]], vocab: int) -> np.ndarray:
    """[requests, vocab] counts of each request's tokens."""
    hist = np.zeros((len(groups), vocab), dtype=np.int64)
    for r, tokens in enumerate(groups):
        np.add.at(hist[r], np.asarray(tokens, dtype=np.int64), 1)
    return hist


def _tvd(a: np.ndarray, b: np.ndarray) -> float:
    return 0.5 * float(np.abs(a / max(a.sum(), 1) - b / max(b.sum(), 1)).sum())


def permutation_test(
    on: list[list[int]], off: list[list[int]], vocab: int, permutations: int = 4000, seed: int = 0
) -> tuple[float, float]:
    """(total-variation distance of the pooled token distributions, p-value).

    `on[i]` and `off[i]` answer the same prompt (with independent seeds), so under the
    null hypothesis of equal distributions the two labels of each pair are
    exchangeable: each permutation swaps the labels of a random subset of pairs, moving
    whole requests, which keeps the test valid however strongly tokens within a
    request depend on each other."""
    h_on, h_off = token_histograms(on, vocab), token_histograms(off, vocab)
    observed = _tvd(h_on.sum(0), h_off.sum(0))
    rng = np.random.default_rng(seed)
    diff = h_on - h_off
    total = (h_on + h_off).sum(0)
    hits = 0
    for _ in range(permutations):
        swap = rng.integers(0, 2, size=len(on)).astype(bool)
        # swapping pair i moves diff_i from the on side to the off side
        on_counts = (total + np.where(swap[:, None], -diff, diff).sum(0)) // 2
        hits += _tvd(on_counts, total - on_counts) >= observed - 1e-12
    return observed, (hits + 1) / (permutations + 1)
