"""OpenAI-client request sets against a vLLM server, with no kiln import: the e2e tests
reach them through twinserve, and the GPU twin's runner (benchmarks/gpu_twin/runner.py)
imports this module on the lent device, where kiln's own dependencies are absent.
"""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from openai import OpenAI

_TOKEN_ID = re.compile(r"^token_id:(-?\d+)$")


@dataclass
class Completion:
    """One request's answer: its prompt index, token ids, top logprobs and time."""

    prompt: int  # index into the request set
    token_ids: list[int]
    # per position: the top-2 (token id, logprob) pairs, best first (greedy requests)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    seconds: float = 0.0


def _token_id(token: str) -> int:
    m = _TOKEN_ID.match(token)
    if m is None:
        raise AssertionError(f"token {token!r} is not 'token_id:N' (return_tokens_as_token_ids)")
    return int(m.group(1))


def _ids(tokens: list[str]) -> list[int]:
    return [_token_id(tok) for tok in tokens]


def complete(
    client: OpenAI,
    model: str,
    index: int,
    prompt: str,
    *,
    max_tokens: int,
    temperature: float,
    seed: int | None = None,
    logprobs: int | None = None,
) -> Completion:
    """Send one completion request (ignoring EOS, token ids returned) and collect its answer."""
    t0 = time.monotonic()
    resp = client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=temperature,
        seed=seed,
        logprobs=logprobs if logprobs is not None else 1,
        extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True},
    )
    lp = resp.choices[0].logprobs
    if lp is None or lp.tokens is None:
        raise AssertionError("the completion carries no logprobs (asked with logprobs >= 1)")
    top = []
    if logprobs and lp.top_logprobs:
        for entry in lp.top_logprobs:
            pairs = sorted(((_token_id(k), v) for k, v in entry.items()), key=lambda kv: -kv[1])
            top.append(pairs)
    return Completion(index, _ids(lp.tokens), top, time.monotonic() - t0)


def run_set(
    url: str,
    model: str,
    prompts: list[str],
    *,
    max_tokens: int,
    concurrency: int = 1,
    temperature: float = 0.0,
    seeds: list[int] | None = None,
    logprobs: int | None = None,
    timeout_s: float = 600,
) -> list[Completion]:
    """Every prompt once, `concurrency` requests in flight; results in prompt order."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="kiln-test", timeout=timeout_s, max_retries=0)

    def one(index: int) -> Completion:
        return complete(
            client,
            model,
            index,
            prompts[index],
            max_tokens=max_tokens,
            temperature=temperature,
            seed=None if seeds is None else seeds[index],
            logprobs=logprobs,
        )

    if concurrency <= 1:
        return [one(i) for i in range(len(prompts))]
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(one, range(len(prompts))))


def prompts(count: int, seed: int = 0) -> list[str]:
    """`n` distinct short prompts: code and prose fragments (the tokenizer is trained on
    Python sources), deterministic for a seed."""
    import random

    rng = random.Random(seed)  # reproducible prompts, not secrets  # noqa: S311
    heads = ["def ", "class ", "import ", "for ", "while ", "return ", "if ", "with ", "# ", "print("]
    words = [
        "fibonacci",
        "parse",
        "buffer",
        "socket",
        "path",
        "value",
        "result",
        "config",
        "token",
        "stream",
        "header",
        "count",
        "index",
        "items",
        "error",
        "module",
        "object",
        "string",
        "the quick brown fox",
        "lazy dog",
        "self",
        "args",
        "kwargs",
        "data",
        "name",
        "file",
    ]
    out: list[str] = []
    seen = set()
    while len(out) < count:
        text = rng.choice(heads) + " ".join(rng.choice(words) for _ in range(rng.randint(1, 4)))
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out
