"""Bounds on speculative decoding's draft count that vLLM's config classes leave open.

Where vLLM can judge a speculative number, it does: `kiln check` and `kiln build` run
every `launch.speculative_config` key through vLLM's `SpeculativeConfig` in the engine
image (launch_arg_probe: field validators, its model-free whole-config checks, its
dynamic-speculation schedule check; exit 17). But vLLM declares `num_speculative_tokens`
only as `int, gt=0` (vllm/config/speculative.py of the 0.32.0 wheel, and of upstream vLLM
at commit 002e77c1 when this was written); every other limit on it is checked against the
model's config.json (MTP's n_predict, DSpark's block size) or not at all, so
`num_speculative_tokens: 100000` passes every config check and fails only in a serving
server. The bounds below are kiln's, each with its reason, checked when the recipe is
loaded (exit 2, no image needed). Values of the wrong type are left to vLLM's refusal.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

# vLLM's rejection sampler verifies at most this many drafts per request and step:
# vllm/v1/sample/rejection_sampler.py (0.32.0) has `MAX_SPEC_LEN = 128` and asserts
# `max_spec_len <= MAX_SPEC_LEN` on every verification, so a larger count starts and then
# kills the engine at its first speculative step. It is far past any useful count too:
# a draft is kept only when all drafts before it were, so with acceptance rate a the
# k-th adds a**k tokens per step (0.9**128 < 1e-5), while every draft costs the
# verification its compute.
_MAX_DRAFT_TOKENS = 128
_SAMPLER = (
    f"vLLM's rejection sampler takes at most {_MAX_DRAFT_TOKENS} (MAX_SPEC_LEN in "
    "vllm/v1/sample/rejection_sampler.py, asserted at every verification step)"
)

_K = "num_speculative_tokens"
_SCHEDULE = "num_speculative_tokens_per_batch_size"


def _count(value: Any) -> int | None:
    """An int draft count (bool is not one; other types are vLLM's to refuse)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _limit_problem(draft_tokens: int, max_len: int | None) -> str | None:
    if draft_tokens > _MAX_DRAFT_TOKENS:
        return f"{draft_tokens} draft tokens per step: {_SAMPLER}"
    if max_len is not None and draft_tokens >= max_len >= 1:
        # the scheduler never schedules a position past max_model_len
        # (vllm/v1/core/sched/scheduler.py clamps num_new_tokens to it), and a request
        # holds at least one prompt token: at most max_len - 1 drafts can ever be verified
        return (
            f"{draft_tokens} draft tokens per step, but launch.args.max-model-len is {max_len}: vLLM schedules no "
            f"position past max-model-len, so at most {max_len - 1} drafts of a request can be verified"
        )
    return None


def problems(spec: Mapping[str, Any], args: Mapping[str, Any], where: Callable[..., str]) -> list[str]:
    """One `file:line: field: message` per draft count past kiln's bounds: `spec` is
    launch.speculative_config, `args` launch.args, `where(*loc)` the `file:line` of a
    field of recipe.yaml."""
    max_len = _count(args.get("max-model-len"))
    k = _count(spec.get(_K))
    out = []
    base = ("launch", "speculative_config")
    why = _limit_problem(k, max_len) if k is not None else None
    if why:
        out.append(f"{where(*base, _K)}: launch.speculative_config.{_K}: {why}")
        k = None  # past its own bound: the entries are held to the bounds, not to it
    schedule = spec.get(_SCHEDULE)
    # vLLM's form: [[first batch size, last batch size, drafts], ...]; other shapes are
    # left to vLLM's own schedule check (launch_arg_probe), which names what is wrong
    for i, entry in enumerate(schedule if isinstance(schedule, list) else []):
        drafts = _count(entry[2]) if isinstance(entry, list) and len(entry) == 3 else None
        if drafts is None:
            continue
        at = f"{where(*base, _SCHEDULE, i)}: launch.speculative_config.{_SCHEDULE}[{i}]"
        if k is not None and drafts > k:
            # build_dynamic_sd_schedule_lookup (vllm/v1/spec_decode/dynamic/utils.py) takes
            # min(num_speculative_tokens, entry): the entry would silently draft fewer
            out.append(
                f"{at}: asks for {drafts} drafts, more than {_K} ({k}): vLLM lowers each entry "
                f"to {_K}, so raise {_K} or lower the entry"
            )
        elif k is None and (why := _limit_problem(drafts, max_len)):
            out.append(f"{at}: {why}")
    return out
