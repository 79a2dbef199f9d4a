"""The on/off comparisons of the tiny-kindling e2e test, on synthetic data."""

from __future__ import annotations

import numpy as np
from kiln_testkit.requestsets import Completion
from kiln_testkit.twinstats import greedy_divergences, permutation_test


def _requests(rng, n, length, probs, sticky=0.0):
    out = []
    for _ in range(n):
        seq = [int(rng.choice(len(probs), p=probs))]
        for _ in range(length - 1):
            seq.append(seq[-1] if rng.random() < sticky else int(rng.choice(len(probs), p=probs)))
        out.append(seq)
    return out


def test_equal_distributions_are_not_rejected_even_when_tokens_within_a_request_repeat():
    # sticky: each request mostly repeats its first token, so its 32 tokens carry about
    # one token's worth of information; a token-level test would reject far too often
    probs = np.full(16, 1 / 16)
    pvals = []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        on, off = _requests(rng, 64, 32, probs, 0.9), _requests(rng, 64, 32, probs, 0.9)
        pvals.append(permutation_test(on, off, 16, permutations=400, seed=seed)[1])
    assert sum(p < 0.05 for p in pvals) <= 3, pvals  # ~5% false rejections expected


def test_a_different_distribution_is_rejected():
    rng = np.random.default_rng(1)
    p = np.full(16, 1 / 16)
    q = p.copy()
    q[:4] *= 1.6
    q /= q.sum()
    on, off = _requests(rng, 64, 32, p), _requests(rng, 64, 32, q)
    tvd, pval = permutation_test(on, off, 16, permutations=1000)
    assert pval < 0.01, (tvd, pval)


def test_greedy_divergence_is_reported_with_its_top2_margin():
    top_tie = [[(5, -0.70000), (6, -0.70004)]]
    top_clear = [[(5, -0.1), (6, -3.0)]]
    same = Completion(0, [1, 2, 3], [[(1, -0.1), (9, -2.0)]] * 3)
    on = [same, Completion(1, [4, 5, 7], [[(4, -0.1), (8, -2.0)]] * 2 + top_tie), Completion(2, [4, 6], [])]
    off = [
        same,
        Completion(1, [4, 5, 6], [[(4, -0.1), (8, -2.0)]] * 2 + top_tie),
        Completion(2, [4, 5], [[(4, -0.1), (8, -2.0)], *top_clear]),
    ]
    found = greedy_divergences(on, off)
    assert [(d.prompt, d.position) for d in found] == [(1, 2), (2, 1)]
    assert found[0].margin < 1e-4 and abs(found[1].margin - 2.9) < 1e-9
