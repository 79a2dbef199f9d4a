"""GPU checks at realistic sizes (skipped without CUDA): kernel vs reference,
exactness against each engine version's rejection sampler (vLLM 0.32.0 and 0.33.0,
0.33.0's FLy mode included), CUDA-graph capture/replay."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from dt_exactness import make_case, mismatches, with_policy_j
from dt_reference import mark_dead_ref
from kiln_engine.draft_trunc._cost import MoELayer
from kiln_testkit.dt_batches import random_batch

pytest.importorskip("triton")
pytestmark = pytest.mark.gpu
VOCAB = 151_552  # GLM-5's vocabulary: the sampler's per-row work is realistic


@pytest.mark.parametrize("num_reqs,k", [(1, 1), (64, 4), (512, 8), (1024, 4), (1024, 8)])
def test_kernel_matches_reference_large(draft_trunc, num_reqs, k):
    dt = draft_trunc(tau=0.3, min_keep=1, explore=0.05)
    rng = np.random.default_rng(num_reqs * 10 + k)
    batch = random_batch(rng, num_reqs, k, max_num_reqs=num_reqs + 64, pad_tokens=16)
    b = batch.to("cuda")
    dt.prepare(batch.predictions.shape[0], "cuda")
    step = int(dt.snapshot().buffers.step.item())
    assert b.mark_dead(dt)
    pad, live = batch.is_padding.clone(), torch.zeros(num_reqs + 64, dtype=torch.int32)
    mark_dead_ref(
        pad,
        batch.query_start_loc,
        batch.cu_num_logits,
        batch.idx_mapping,
        batch.seq_lens,
        batch.prefill_len,
        batch.predictions,
        live,
        torch.zeros(num_reqs + 64),
        step,
        num_reqs,
        0.3,
        1,
        0.05,
    )
    assert torch.equal(b.is_padding.cpu(), pad)
    assert torch.equal(dt.snapshot().buffers.live.cpu()[batch.idx_mapping], live[batch.idx_mapping])


@pytest.mark.parametrize(
    "mode,batches",
    [
        ("greedy", 10),
        ("sampled", 10),
        ("sampled_draft_probs", 10),
        ("block", 3),
        ("block_draft_probs", 3),
        ("fly", 3),  # vLLM >= 0.33.0
    ],
)
@pytest.mark.parametrize("dead_fill", ["garbage", "nan"])
@pytest.mark.parametrize("policy", ["random", "cost"])
def test_exact_with_vllm_sampler_on_gpu(vllm_kernels, vllm_version, draft_trunc, mode, batches, dead_fill, policy):
    """Kept counts drawn at random, or chosen by the cost-aware kernel (priced
    for a layer with so many experts that cutting pays even at 1024 requests)."""
    if mode == "fly" and "fly_window_size" not in vllm_kernels.rsu.rejection_sample.__code__.co_varnames:
        assert vllm_version == "0.32.0", f"vLLM {vllm_version} has no FLy mode"
        pytest.skip("vLLM 0.32.0 has no FLy rejection mode")
    gen = torch.Generator("cuda").manual_seed(1234)
    dt = draft_trunc(policy="cost", explore=0.0)
    checked = truncated = 0
    for _ in range(batches):
        case = make_case(gen, num_reqs=1024, k=4, vocab=VOCAB)
        if policy == "cost":
            case = with_policy_j(dt, case, 4, MoELayer(experts=1 << 20, top_k=8))
        assert mismatches(vllm_kernels.rsu, case, 4, mode, dead_fill) == 0
        checked += 1024
        truncated += int((case["j"] < case["n"]).sum())
    assert truncated > checked // 4
    if batches >= 10:
        assert checked >= 10_000


def test_marks_without_mask_do_change_outputs(vllm_kernels):
    gen = torch.Generator("cuda").manual_seed(99)
    case = make_case(gen, num_reqs=1024, k=4, vocab=VOCAB, accept_bias=1.0)
    assert mismatches(vllm_kernels.rsu, case, 4, "greedy", "garbage", apply_mask=False) > 100


def test_cuda_graph_capture_and_replay(draft_trunc):
    """Capture one mark_dead, then replay it over changing batches of the same
    shape: each replay must match the reference at its own (device) step."""
    dt = draft_trunc(tau=0.35, min_keep=0, explore=0.3)
    num_reqs, k, max_reqs = 256, 6, 300
    rng = np.random.default_rng(0)

    def batch_with_tokens(seed):
        # Same request count and token count every time, different contents.
        while True:
            b = random_batch(np.random.default_rng(seed), num_reqs, k, max_num_reqs=max_reqs)
            if b.num_tokens <= 4096:
                return b
            seed += 1000

    static = random_batch(rng, num_reqs, k, max_num_reqs=max_reqs).to("cuda")
    static.is_padding = torch.ones(4096, dtype=torch.bool, device="cuda")
    dt.prepare(max_reqs, "cuda")
    static.mark_dead(dt)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static.mark_dead(dt)
    step0 = int(dt.snapshot().buffers.step.item())
    for i in range(6):
        host = batch_with_tokens(100 + i)
        for name in (
            "query_start_loc",
            "cu_num_logits",
            "idx_mapping",
            "seq_lens",
            "prefill_len",
            "predictions",
        ):
            getattr(static, name).copy_(getattr(host, name))
        static.is_padding[: host.num_tokens] = False
        static.is_padding[host.num_tokens :] = True
        graph.replay()
        pad = torch.ones(4096, dtype=torch.bool)
        pad[: host.num_tokens] = False
        live = torch.zeros(max_reqs, dtype=torch.int32)
        mark_dead_ref(
            pad,
            host.query_start_loc,
            host.cu_num_logits,
            host.idx_mapping,
            host.seq_lens,
            host.prefill_len,
            host.predictions,
            live,
            torch.zeros(max_reqs),
            step0 + i,
            num_reqs,
            0.35,
            0,
            0.3,
        )
        assert torch.equal(static.is_padding.cpu(), pad), f"replay {i}"
        assert torch.equal(dt.snapshot().buffers.live.cpu()[host.idx_mapping], live[host.idx_mapping])
    assert int(dt.snapshot().buffers.step.item()) == step0 + 6


def _cost_reference(dt, batch, step, tau):
    """Reference ratios per candidate tau, and the marks at the kernel's tau."""
    from dt_reference import cost_aware_ratios

    c = dt.snapshot().cost
    ratios = cost_aware_ratios(
        batch.query_start_loc,
        batch.cu_num_logits,
        batch.idx_mapping,
        batch.seq_lens,
        batch.prefill_len,
        batch.predictions,
        step,
        batch.num_reqs,
        dt.KNOBS.min_keep,
        dt.KNOBS.explore,
        c.table.cpu(),
        c.t_fixed,
        c.t_token,
        c.other_ratio,
        dt.snapshot().calibration,
    )
    max_reqs = batch.predictions.shape[0]
    pad, live = batch.is_padding.clone(), torch.zeros(max_reqs, dtype=torch.int32)
    mark_dead_ref(
        pad,
        batch.query_start_loc,
        batch.cu_num_logits,
        batch.idx_mapping,
        batch.seq_lens,
        batch.prefill_len,
        batch.predictions,
        live,
        torch.zeros(max_reqs),
        step,
        batch.num_reqs,
        tau,
        dt.KNOBS.min_keep,
        dt.KNOBS.explore,
    )
    return ratios, pad, live


@pytest.mark.parametrize(
    "num_reqs,k,experts",
    [(1, 4, 256), (8, 4, 256), (64, 4, 4096), (512, 8, 1 << 16), (1024, 4, 1 << 20)],
)
def test_cost_kernel_matches_reference_large(draft_trunc, num_reqs, k, experts):
    """The cost-aware kernel at size: its tau is the reference's best (within
    fp32 rounding) and its marks are the fixed rule's at that tau."""
    from dt_reference import TAU_GRID

    dt = draft_trunc(policy="cost", min_keep=1, explore=0.05)
    rng = np.random.default_rng(num_reqs * 10 + k)
    batch = random_batch(rng, num_reqs, k, max_num_reqs=num_reqs + 64, pad_tokens=16)
    b = batch.to("cuda")
    dt.set_moe_layer(MoELayer(experts=experts, top_k=8))
    dt.prepare(batch.predictions.shape[0], "cuda", b.is_padding.shape[0])
    step = int(dt.snapshot().buffers.step.item())
    assert b.mark_dead(dt)
    tau = float(dt.snapshot().buffers.tau.item())
    ratios, pad, live = _cost_reference(dt, batch, step, tau)
    assert ratios[round(tau * TAU_GRID)] >= max(ratios) * (1 - 1e-5)
    assert torch.equal(b.is_padding.cpu(), pad)
    assert torch.equal(dt.snapshot().buffers.live.cpu()[batch.idx_mapping], live[batch.idx_mapping])


def test_cost_policy_cuda_graph_replay(draft_trunc):
    """Captured once, the cost-aware mark_dead re-chooses tau on every replay
    from the batch in the static buffers (no host sync, no recapture)."""
    from dt_reference import TAU_GRID

    dt = draft_trunc(policy="cost", min_keep=0, explore=0.1)
    num_reqs, k, max_reqs = 96, 4, 128
    dt.set_moe_layer(MoELayer(experts=4096, top_k=8))
    static = random_batch(np.random.default_rng(0), num_reqs, k, max_num_reqs=max_reqs).to("cuda")
    static.is_padding = torch.ones(2048, dtype=torch.bool, device="cuda")
    dt.prepare(max_reqs, "cuda", 2048)
    static.mark_dead(dt)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static.mark_dead(dt)
    step0 = int(dt.snapshot().buffers.step.item())
    taus = set()
    for i in range(6):
        host = random_batch(np.random.default_rng(50 + i), num_reqs, k, max_num_reqs=max_reqs)
        host.predictions *= 0.3 + 0.15 * i  # from unlikely to likely drafts
        for name in (
            "query_start_loc",
            "cu_num_logits",
            "idx_mapping",
            "seq_lens",
            "prefill_len",
            "predictions",
        ):
            getattr(static, name).copy_(getattr(host, name))
        static.is_padding[: host.num_tokens] = False
        static.is_padding[host.num_tokens :] = True
        graph.replay()
        tau = float(dt.snapshot().buffers.tau.item())
        taus.add(tau)
        host.is_padding = torch.ones(2048, dtype=torch.bool)
        host.is_padding[: host.num_tokens] = False
        ratios, pad, live = _cost_reference(dt, host, step0 + i, tau)
        assert ratios[round(tau * TAU_GRID)] >= max(ratios) * (1 - 1e-5), f"replay {i}"
        assert torch.equal(static.is_padding.cpu(), pad), f"replay {i}"
        assert torch.equal(dt.snapshot().buffers.live.cpu()[host.idx_mapping], live[host.idx_mapping])
    assert len(taus) > 1, "tau should follow the batch"
    # Grades land in the calibration between replays (graded runs eagerly, in
    # place): the captured kernel reads them. Every draft said to survive: keep all.
    cal = dt.snapshot().calibration
    cal.counts[:-1] = 1000.0
    cal.hits[:-1] = 1000.0
    static.is_padding[: host.num_tokens] = False
    graph.replay()
    assert float(dt.snapshot().buffers.tau.item()) == 0.0
    assert not static.is_padding[: host.num_tokens].any()
