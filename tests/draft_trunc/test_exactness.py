"""The verify mask makes draft_trunc exact, checked with vLLM 0.32.0's own
rejection-sampling kernels (under the Triton interpreter on CPU)."""

from __future__ import annotations

import pytest
import torch
from dt_exactness import make_case, mismatches, with_policy_j
from kiln_engine.draft_trunc._cost import MoELayer

pytest.importorskip("triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
MODES = ["greedy", "sampled", "sampled_draft_probs", "block", "block_draft_probs"]


# Many experts: at 48 requests the cost-aware policy must still find drafts
# worth cutting, or the check would only see untruncated batches.
POLICY_LAYER = MoELayer(experts=4096, top_k=8)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dead_fill", ["garbage", "nan"])
@pytest.mark.parametrize("policy", ["random", "cost"])
def test_masked_equals_truncated(vllm_kernels, draft_trunc, mode, dead_fill, policy):
    """Kept counts drawn at random (every j), or chosen by the cost-aware kernel."""
    gen = torch.Generator(DEVICE).manual_seed(MODES.index(mode) * 2 + (dead_fill == "nan"))
    dt = draft_trunc(policy="cost", explore=0.0)
    total = 0
    for _ in range(2 if policy == "random" else 1):
        case = make_case(gen, num_reqs=48, k=5, vocab=384)
        if policy == "cost":
            case = with_policy_j(dt, case, 5, POLICY_LAYER)
        assert mismatches(vllm_kernels.rsu, case, 5, mode, dead_fill) == 0
        total += int((case["j"] < case["n"]).sum())
    assert total > 10, "the cases must actually truncate"


def test_marking_without_mask_is_wrong(vllm_kernels):
    """Control: if the dead rows' garbage is read, outputs change; the check
    above can therefore fail."""
    gen = torch.Generator(DEVICE).manual_seed(5)
    case = make_case(gen, num_reqs=64, k=5, vocab=384, accept_bias=1.0)
    assert mismatches(vllm_kernels.rsu, case, 5, "greedy", "garbage", apply_mask=False) > 0
