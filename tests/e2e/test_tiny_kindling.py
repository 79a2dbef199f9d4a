"""draft-trunc inside a real server: the tiny-kindling image (the CPU twin of
glm53-kindling: vLLM's Model Runner V2 through Triton's interpreter, the same override
and knobs) served with the feature on and off, answering the same request sets through
the OpenAI client.

One server per mode, reused for every request set (the interpreter is slow); the three
boot and answer concurrently. Two sizes, the same checks: `default` (16 prompts per
set, `nox -s e2e`) and `full` (64 prompts, `nox -s e2e_full`, marker `full`). "on" is
the recipe as shipped: the cost-aware policy, pricing glm53-kindling's H200 layer;
"tau" adds `-e KILN_DRAFT_TRUNC_TAU=0.25`, the fixed rule, which cuts far more on this
twin (the cost policy learns from its grades that the twin's greedy drafts are mostly
accepted and then keeps them: docs/draft-trunc-policy.md); "off" turns the feature off.
- greedy, sequential and at concurrency 8: token ids identical on (and tau) and off; a
  divergence is allowed only at a numeric tie (top-2 logprob margin < 1e-4 there);
- seeded sampling (temperature 0.8, a seed per request) at concurrency 8: on (and tau)
  and off are equal in distribution (a permutation test over requests must not reject
  at p = 0.01); two feature-on runs with the same seeds give the same tokens (the rerun
  covers the first `rerun` prompts of the size, to keep CI time down);
- the feature really cut: under the fixed rule its own counters on /metrics give a
  dead fraction in [0.2, 0.9] (full size; [0.06, 0.9] at the default size), with accepted
  and rejected drafts both > 0; the cost
  policy cut too (dead > 0), and kept a larger share of the drafts than the fixed rule;
  its start line appears exactly once in the server log and names the policy;
- the twin's draft agrees with its target enough for speculation to pay: with the feature off,
  vLLM's own counters over the greedy sets give an acceptance (accepted / proposed
  draft tokens) in [0.4, 0.9];
- combined with vLLM's own adaptive speculation: a fourth server, "dyn",
  runs vLLM's batch-size schedule (`num_speculative_tokens_per_batch_size`, DYNAMIC)
  with draft-trunc on, its drafting priced and its depth decision on
  (KILN_DRAFT_TRUNC_DRAFT_COST, KILN_DRAFT_TRUNC_DEPTH): on the greedy sets only (the
  sampled ones would add a third of the e2e time), its token ids equal the feature-off
  server's, vLLM's counters show the schedule (4 drafts a window alone, fewer at
  concurrency 8) and draft-trunc's show drafts cut;
- one tenant cannot steer the calibration: after its greedy sets the
  "dyn" server gets one tenant's requests, each with a sampling setting that acts on the
  target only (penalties, greedy and sampled, bad words, allowed tokens), alone and then beside
  normal greedy requests. Its statistics flush every step, so its counters are exact at
  each read: the tenant alone adds drafts kept out of the calibration and grades none;
  beside it, the normal requests' drafts are still graded.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
from kiln_testkit.twinserve import counters, prompts, run_set, serving_all, spec_decode_stats
from kiln_testkit.twinstats import greedy_divergences, permutation_test
from kilntest import machine_share

# only tiny-kindling's own servers (free ports): beside the daemon group under `nox -s e2e` (tests/kilntest.py)
pytestmark = [pytest.mark.e2e, pytest.mark.docker, pytest.mark.xdist_group("tiny-kindling")]
# `runs` takes the machine alone instead of a share for each test (tests/e2e/conftest.py)
MACHINE_ALONE = True

MAX_TOKENS = 32
CONCURRENCY = 8
TIE = 1e-4
VOCAB = 1024
ACCEPTANCE = (0.4, 0.9)  # vLLM's accepted / proposed draft tokens, feature off


@dataclass(frozen=True)
class TwinSize:
    """How many prompts each request set sends, how many seeded prompts the feature-on
    server answers twice, and the dead fraction the fixed rule must reach (fewer steps
    per set cut less: 0.124 measured at 16 prompts, 2026-12-01, against 0.37-0.54 at 64)."""

    prompts: int
    rerun: int
    tau_dead: tuple[float, float]


# `default` runs in `nox -s e2e`; `full` (marker `full`) in `nox -s e2e_full`. The same
# checks, thresholds and three servers at both sizes; docs/benchmarks.md gives the power
# each keeps (the permutation test's false-alarm rate is 0.01 at either size).
SIZES = {
    "default": TwinSize(prompts=16, rerun=8, tau_dead=(0.06, 0.9)),
    "full": TwinSize(prompts=64, rerun=16, tau_dead=(0.2, 0.9)),
}
MODES = {"on": "cost", "tau": "tau"}  # feature-on servers and the policy each runs
# vLLM's dynamic speculation for the "dyn" server: (first batch size, last, K)
DYNAMIC = [[1, 1, 4], [2, 4, 3], [5, 8, 2]]
# drafting priced as sim_adaptive prices a kindling-class drafter (docs/draft-trunc-policy.md);
# statistics flushed every step, so that the tenant check reads exact counters between sets
DYN_ENV = {
    "KILN_DRAFT_TRUNC_DEPTH": "1",
    "KILN_DRAFT_TRUNC_DRAFT_COST": "1:0.08,8:0.05",
    "KILN_DRAFT_TRUNC_LOG_INTERVAL": "1",
}
# one tenant's requests: each sets one sampling setting the drafter ignores. Not
# sent: logit_bias and min_p, which vLLM refuses beside speculative decoding
# (SamplingParams._validate_spec_decode), and top_k/top_p, whose Triton kernel
# (_topk_topp_kernel) fails under Triton's interpreter, so the twin cannot serve them (seen
# 2026-12-07: "'int' object has no attribute 'to'", the engine dies); the engine's rule for
# them is unit-tested (tests/draft_trunc/test_tenant.py)
TENANT = (
    {"extra_body": {"repetition_penalty": 1.3}},
    {"frequency_penalty": 0.8},
    {"presence_penalty": 0.8},
    {"extra_body": {"bad_words": ["the"]}},
    {"extra_body": {"allowed_token_ids": list(range(16, 272))}},
    {"temperature": 0.8, "seed": 1, "presence_penalty": 0.5},
)
TENANT_TOKENS = 24
CALIBRATION = ("kiln_draft_trunc_graded_total", "kiln_draft_trunc_excluded_total")


def _sets(url: str, model: str, size: TwinSize, *, on: bool, rerun: bool = False) -> dict:
    t0 = time.monotonic()
    common = dict(max_tokens=MAX_TOKENS)
    batch = prompts(size.prompts, seed=7)
    seeds = [(10_000 if on else 90_000) + i for i in range(size.prompts)]  # off: independent draws
    out = {
        "greedy_seq": run_set(url, model, batch, concurrency=1, logprobs=2, **common),
        "greedy_c8": run_set(url, model, batch, concurrency=CONCURRENCY, logprobs=2, **common),
        # before any sampled request: the acceptance goal is greedy (sampled
        # requests verify the draft's greedy proposals against a sampled target: ~0.02)
        "greedy_spec": spec_decode_stats(url),
        "sampled": run_set(url, model, batch, concurrency=CONCURRENCY, temperature=0.8, seeds=seeds, **common),
    }
    if rerun:
        out["sampled_again"] = run_set(
            url,
            model,
            batch[: size.rerun],
            concurrency=CONCURRENCY,
            temperature=0.8,
            seeds=seeds[: size.rerun],
            **common,
        )
    out["seconds"] = time.monotonic() - t0
    return out


def _dynamic_sets(url: str, model: str, size: TwinSize) -> dict:
    """The greedy sets on the "dyn" server, with vLLM's counters after each: alone (K = 4
    from DYNAMIC) and at concurrency 8 (K = 2 once 5 or more are in flight)."""
    t0 = time.monotonic()
    batch = prompts(size.prompts, seed=7)
    out = {"greedy_seq": run_set(url, model, batch, concurrency=1, logprobs=2, max_tokens=MAX_TOKENS)}
    out["spec_seq"] = spec_decode_stats(url)
    out["greedy_c8"] = run_set(url, model, batch, concurrency=CONCURRENCY, logprobs=2, max_tokens=MAX_TOKENS)
    out["spec_c8"] = spec_decode_stats(url)
    out.update(_tenant_sets(url, model))
    out["seconds"] = time.monotonic() - t0
    return out


def _tenant_set(url: str, model: str, batch: list[str], concurrency: int) -> None:
    """`batch` sent as one tenant would: request i with TENANT's setting i (cycled)."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="kiln-test", timeout=600, max_retries=0)

    def one(i: int) -> None:
        setting = dict(TENANT[i % len(TENANT)])
        extra = {"ignore_eos": True, **setting.pop("extra_body", {})}
        client.completions.create(
            model=model,
            prompt=batch[i],
            max_tokens=TENANT_TOKENS,
            temperature=setting.pop("temperature", 0.0),
            extra_body=extra,
            **setting,
        )

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(one, range(len(batch))))


def _tenant_sets(url: str, model: str) -> dict:
    """The calibration's counters before the tenant, after it alone (8 requests), and
    after it beside 4 normal greedy requests (4 of its own). The CPU platform runs
    without async scheduling, so a request's last step is counted before it answers."""
    out = {"tenant_before": counters(url, CALIBRATION)}
    _tenant_set(url, model, prompts(8, seed=11), concurrency=CONCURRENCY)
    out["tenant_alone"] = counters(url, CALIBRATION)
    with ThreadPoolExecutor(max_workers=2) as pool:
        tenant = pool.submit(_tenant_set, url, model, prompts(4, seed=12), concurrency=4)
        normal = pool.submit(run_set, url, model, prompts(4, seed=13), concurrency=4, max_tokens=TENANT_TOKENS)
        for done in (tenant, normal):
            done.result()
    out["tenant_beside"] = counters(url, CALIBRATION)
    return out


@pytest.fixture(scope="module", params=[pytest.param("default"), pytest.param("full", marks=pytest.mark.full)])
def runs(request, tiny_kindling, docker_daemon, tmp_path_factory):
    """The three servers' answers, counters and logs (each server is gone afterwards).
    The servers boot together and answer their request sets concurrently (one client
    thread per server): on 2 cores that takes a little over the slowest server's time
    alone, instead of the sum of all three."""
    from kiln.domain.recipes.feature_registry import engine_features
    from kiln.domain.serving.launch_command import speculative_config

    size = SIZES[request.param]
    loaded, img = tiny_kindling.loaded, tiny_kindling.image
    (feature,) = engine_features(loaded.recipe.features)
    model = loaded.recipe.launch.served_model_name
    result = {"feature": feature, "size": size, "timing": {}}
    envs = {
        "on": dict(feature.smoke_env),  # the recipe's own knobs: the cost-aware policy
        "tau": {**feature.smoke_env, f"{feature.env}_TAU": "0.25"},
        "off": {feature.env: "0"},
        "dyn": {**feature.smoke_env, **DYN_ENV},
    }
    spec = {**(speculative_config(loaded.recipe) or {}), "num_speculative_tokens_per_batch_size": DYNAMIC}
    args = {"dyn": ["--speculative-config", json.dumps(spec, separators=(",", ":"))]}
    # alone among the e2e servers: the four keep both cores busy (tests/e2e/conftest.py)
    with machine_share(tmp_path_factory.getbasetemp().parent, alone=True):
        t0 = time.monotonic()
        with serving_all(docker_daemon, loaded, img.id, envs, args=args) as boxes:
            with ThreadPoolExecutor(max_workers=len(boxes)) as pool:
                futures = {
                    mode: (
                        pool.submit(_dynamic_sets, box.url, model, size)
                        if mode == "dyn"
                        else pool.submit(_sets, box.url, model, size, on=mode != "off", rerun=mode == "on")
                    )
                    for mode, box in boxes.items()
                }
                answers = {mode: f.result() for mode, f in futures.items()}
            for mode, box in boxes.items():
                result[mode] = answers[mode]
                result[f"{mode}_counters"] = counters(box.url, feature.metrics)
                result[f"{mode}_logs"] = box.logs(tail=100000)
                result["timing"][mode] = {
                    "startup_s": round(box.startup_s, 1),
                    "requests_s": round(answers[mode]["seconds"], 1),
                }
        result["timing"]["total_s"] = round(time.monotonic() - t0, 1)
    print(f"\ntiny-kindling on/tau/off ({request.param}: {size}) timing: {result['timing']}")
    return result


@pytest.mark.parametrize("mode", MODES)
def test_greedy_outputs_equal_on_and_off_except_at_numeric_ties(runs, mode):
    for name in ("greedy_seq", "greedy_c8"):
        on, off = runs[mode][name], runs["off"][name]
        assert sum(len(c.token_ids) for c in on) == runs["size"].prompts * MAX_TOKENS
        divergences = greedy_divergences(on, off)
        print(
            f"{name}: {len(divergences)} divergence(s) of {len(on)} requests: "
            f"{[(d.prompt, d.position, f'{d.margin:.2e}') for d in divergences]}"
        )
        not_ties = [d for d in divergences if not d.margin < TIE]
        assert not not_ties, f"{name}: outputs differ away from a numeric tie: {not_ties}"


@pytest.mark.parametrize("mode", MODES)
def test_sampled_outputs_equal_in_distribution(runs, mode):
    on = [c.token_ids for c in runs[mode]["sampled"]]
    off = [c.token_ids for c in runs["off"]["sampled"]]
    want = runs["size"].prompts * MAX_TOKENS  # ignore_eos: every request gives MAX_TOKENS
    assert sum(map(len, on)) == want and sum(map(len, off)) == want
    tvd, p = permutation_test(on, off, VOCAB)
    print(f"sampled {mode} vs off: total variation {tvd:.3f}, permutation p = {p:.3f}")
    assert p >= 0.01, f"token distributions differ (TVD {tvd:.3f}, p = {p:.4f})"


def test_same_seed_same_tokens_in_two_feature_on_runs(runs):
    first, again = runs["on"]["sampled"], runs["on"]["sampled_again"]
    differ = [a.prompt for a, b in zip(first[: runs["size"].rerun], again, strict=True) if a.token_ids != b.token_ids]
    print(f"seeded feature-on reruns: {len(differ)} of {len(again)} requests differ: {differ}")
    assert not differ


def _ratio(runs, mode, name):
    ratio = runs["feature"].ratio(name)
    values = runs[f"{mode}_counters"]
    return values[ratio.numerator] / values[ratio.denominator]


def test_the_feature_really_cut_and_counted_it(runs):
    for mode in MODES:
        values = runs[f"{mode}_counters"]
        missing = [k for k, v in values.items() if v is None]
        assert not missing, f"{mode}: not on /metrics: {missing}"
        print(
            f"feature {mode}: dead fraction {_ratio(runs, mode, 'dead_fraction'):.3f}, "
            f"accepted {values['kiln_draft_trunc_accepted_total']:.0f}, "
            f"rejected {values['kiln_draft_trunc_wasted_total']:.0f}, kept "
            f"{values['kiln_draft_trunc_kept_total']:.0f} of {values['kiln_draft_trunc_proposed_total']:.0f}"
        )
        # kept, verified, then accepted or rejected: both happen under either policy
        assert values["kiln_draft_trunc_accepted_total"] > 0 and values["kiln_draft_trunc_wasted_total"] > 0
    low, high = runs["size"].tau_dead
    assert low <= _ratio(runs, "tau", "dead_fraction") <= high
    # the cost policy cuts where its prices say so (it did at the start, before its
    # grades showed the twin's greedy drafts survive) and keeps more than tau 0.25 does
    assert runs["on_counters"]["kiln_draft_trunc_dead_total"] > 0
    assert _ratio(runs, "on", "kept_fraction") > _ratio(runs, "tau", "kept_fraction")
    # feature off: the counters are never published
    assert all(v is None for v in runs["off_counters"].values()), runs["off_counters"]


@pytest.mark.parametrize("mode", MODES)
def test_the_feature_announces_itself_once_per_server(runs, mode):
    feature = runs["feature"]
    on_lines = runs[f"{mode}_logs"].splitlines()
    starts = [ln for ln in on_lines if feature.start_line in ln]
    assert len(starts) == 1, starts
    assert f"policy='{MODES[mode]}'" in starts[0], starts[0]
    assert any(feature.log_lines[-1] in ln for ln in on_lines), "no periodic summary in the log"
    assert "Using V2 Model Runner" in runs[f"{mode}_logs"]
    off_lines = runs["off_logs"].splitlines()
    assert not any(feature.start_line in ln for ln in off_lines)
    assert any("draft-trunc=off" in ln for ln in off_lines)


def test_the_draft_agrees_with_the_target_as_often_as_asked(runs):
    """Every draft is verified with the feature off, so vLLM's counters over the greedy
    sets give the twin's true greedy acceptance; with 4 drafts chained, it is the mean of
    the per-position rates."""
    spec = runs["off"]["greedy_spec"]
    assert spec is not None, "no vllm:spec_decode_* counters on /metrics with the feature off"
    print(f"greedy sets, feature off, vLLM {spec.summary()}")
    for mode in MODES:
        print(f"greedy sets, feature {mode}, vLLM {runs[mode]['greedy_spec'].summary()}")
    assert len(spec.accepted_per_pos) == 4
    assert ACCEPTANCE[0] <= spec.acceptance <= ACCEPTANCE[1], spec.summary()


def test_vllm_dynamic_speculation_with_draft_trunc_is_lossless(runs):
    """vLLM's batch-size schedule, draft-trunc's truncation and its drafting depth
    together: greedy token ids equal the feature-off server's (ties aside)."""
    for name in ("greedy_seq", "greedy_c8"):
        dyn, off = runs["dyn"][name], runs["off"][name]
        assert sum(len(c.token_ids) for c in dyn) == runs["size"].prompts * MAX_TOKENS
        divergences = greedy_divergences(dyn, off)
        print(f"dyn {name}: {len(divergences)} divergence(s) of {len(dyn)} requests")
        not_ties = [d for d in divergences if not d.margin < TIE]
        assert not not_ties, f"{name}: outputs differ away from a numeric tie: {not_ties}"


def test_vllm_dynamic_speculation_schedules_and_draft_trunc_cuts(runs):
    seq, c8 = runs["dyn"]["spec_seq"], runs["dyn"]["spec_c8"] - runs["dyn"]["spec_seq"]
    per_seq, per_c8 = seq.draft_tokens / seq.drafts, c8.draft_tokens / c8.drafts
    values = runs["dyn_counters"]
    print(
        f"dyn: drafts per verify window {per_seq:.2f} alone, {per_c8:.2f} at concurrency "
        f"{CONCURRENCY}; draft-trunc kept {values['kiln_draft_trunc_kept_total']:.0f} of "
        f"{values['kiln_draft_trunc_proposed_total']:.0f}, dead {values['kiln_draft_trunc_dead_total']:.0f}"
    )
    # alone, windows are scheduled K = 4 (draft-trunc keeps shapes: drafts it cut or never
    # drafted still count; vLLM schedules fewer only at a request's very end)
    assert per_seq > 3.6
    # at concurrency 8, most windows run at K = 2 or 3 (the ramp up and down runs fewer in flight)
    assert per_c8 < per_seq - 0.5
    assert values["kiln_draft_trunc_dead_total"] > 0
    assert values["kiln_draft_trunc_kept_total"] < values["kiln_draft_trunc_proposed_total"]
    assert values["kiln_draft_trunc_accepted_total"] > 0


def test_one_tenant_cannot_steer_the_calibration(runs):
    """The "dyn" server's calibration counters around one tenant's requests (each with a
    target-only sampling setting): drafts graded into the cells, and drafts kept out."""
    graded, excluded = CALIBRATION
    before, alone, beside = (runs["dyn"][f"tenant_{k}"] for k in ("before", "alone", "beside"))
    print(
        f"calibration (graded, excluded): before the tenant {before}, after it alone {alone}, "
        f"after it beside normal requests {beside}"
    )
    # the greedy sets (normal requests) were graded, and none of their drafts kept out
    assert before[graded] > 0 and before[excluded] == 0
    # the tenant alone: its drafts were verified and filed for grading, and graded by no cell
    assert alone[graded] == before[graded]
    assert alone[excluded] > before[excluded]
    # beside normal requests: theirs are graded, the tenant's kept out
    assert beside[graded] > alone[graded] and beside[excluded] > alone[excluded]
