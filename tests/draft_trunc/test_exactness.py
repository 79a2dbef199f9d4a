"""The verify mask makes draft_trunc exact, checked with each engine version's own
rejection-sampling kernels (vLLM 0.32.0 and 0.33.0, the latter with rewritten kernels;
under the Triton interpreter on CPU)."""

from __future__ import annotations

import pytest
import torch
from dt_exactness import make_case, mismatches, with_policy_j
from kiln_engine.draft_trunc._cost import MoELayer

# vLLM's sources from kiln's wheel cache: a fresh machine downloads the wheels (conftest vllm_src)
pytestmark = [pytest.mark.network, pytest.mark.kernels]

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


def test_fly_rejection_is_exact_under_truncation(vllm_kernels, vllm_version):
    """0.33.0's lossy FLy mode defers a rejection while the next fly_window_size drafts
    are accepted, gated on the proposed draft count, which includes the drafts
    draft-trunc cut. Those are masked invalid (-1) and FLy rejects invalid drafts
    natively, so a deferral into them is never confirmed: outputs equal the truncated
    batch's, for greedy and sampled requests alike."""
    if "fly_window_size" not in vllm_kernels.rsu.rejection_sample.__code__.co_varnames:
        assert vllm_version == "0.32.0", f"vLLM {vllm_version} has no FLy mode"
        pytest.skip("vLLM 0.32.0 has no FLy rejection mode")
    gen = torch.Generator(DEVICE).manual_seed(11)
    deferred = 0
    for dead_fill in ("garbage", "nan"):
        case = make_case(gen, num_reqs=64, k=5, vocab=384, accept_bias=0.7)
        assert mismatches(vllm_kernels.rsu, case, 5, "fly", dead_fill) == 0
        # control: FLy really deferred (its outputs differ from standard rejection)
        deferred += _differs(vllm_kernels.rsu, case, 5, "fly", "sampled")
    assert deferred > 0, "FLy never deferred a rejection: the check above proved nothing"


def _differs(rsu, case, k, mode_a, mode_b) -> int:
    from dt_exactness import truncated, verify

    trunc = truncated(case)
    n_a = verify(rsu, trunc, case, k, mode_a)[1]
    n_b = verify(rsu, trunc, case, k, mode_b)[1]
    return int((n_a != n_b).sum())
