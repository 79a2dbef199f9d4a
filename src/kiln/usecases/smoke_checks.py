"""The checks `kiln smoke` runs against a served image, with the official OpenAI client:
each returns (value, detail) or raises, and SmokeRun records one verdict per check.
Kept apart from usecases/smoke.py, which starts the server and writes the record."""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kiln.basics.errors import DockerDaemonError
from kiln.domain.recipes.recipe import Recipe
from kiln.domain.serving.serving_container import ServingContainer
from kiln.usecases import progress

if TYPE_CHECKING:  # openai is a dev extra, imported late where a server is up
    from kiln_engine.features import Feature, Ratio
    from openai.types import CompletionUsage


@dataclass
class Check:
    """One check of a smoke run: its name, verdict, what it found and how long it took."""

    name: str
    ok: bool
    detail: str
    seconds: float = 0.0


@dataclass
class SmokeRun:
    """The checks of one smoke run, in order, each printed as it ends."""

    checks: list[Check] = field(default_factory=list)

    def check(self, name: str, fn: Callable[[], tuple[object, object]]) -> object:
        """Run one check and record its verdict (an exception is a failed check, the
        daemon's own failure excepted); the check's value."""
        t0 = time.monotonic()
        try:
            value, detail = fn()
            ok = True
        except DockerDaemonError:  # the daemon failed, not the image: no verdict, no record
            raise
        except Exception as exc:  # a failed check is data, not a crash  # noqa: BLE001
            value, detail, ok = None, f"{type(exc).__name__}: {exc}", False
        c = Check(name, ok, str(detail)[:500], round(time.monotonic() - t0, 3))
        self.checks.append(c)
        progress.verdict(ok, name, c.detail)
        return value

    @property
    def passed(self) -> bool:
        """Every check passed (and there was at least one)."""
        return bool(self.checks) and all(c.ok for c in self.checks)


def metric_sum(text: str, name: str) -> float | None:
    """Sum of every sample of `name` (all label sets) in Prometheus text format."""
    total, seen = 0.0, False
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})?\s+([0-9.eE+-]+|NaN)\s*$")
    for line in text.splitlines():
        m = pattern.match(line)
        if m and m.group(1) != "NaN":
            total += float(m.group(1))
            seen = True
    return total if seen else None


def require(cond: bool, message: str) -> None:
    """Fail the check with `message` unless `cond` holds."""
    if not cond:
        raise AssertionError(message)


def _usage(usage: CompletionUsage | None) -> CompletionUsage:
    """A response's token usage, which the smoke test requires the server to report."""
    if usage is None:
        raise AssertionError("no usage in response")
    return usage


class ServedChecks:
    """The checks themselves; each returns (value, detail) or raises."""

    def __init__(self, box: ServingContainer, recipe: Recipe) -> None:
        """The checks against `box`, served from `recipe`, through the OpenAI client."""
        from openai import OpenAI  # late: a dev extra, needed only once a server is up to smoke

        self.box = box
        self.recipe = recipe
        self.spec = recipe.smoke
        self.name = self.spec.served_model_name or recipe.launch.served_model_name
        self.client = OpenAI(
            base_url=f"{box.url}/v1", api_key="kiln-smoke", timeout=self.spec.request_timeout_s, max_retries=0
        )

    def models(self) -> tuple[list[str], str]:
        """The served model is listed under its name."""
        ids = [m.id for m in self.client.models.list().data]
        require(self.name in ids, f"served model {self.name!r} not in {ids}")
        return ids, f"{ids}"

    def _usage_ok(self, reported: CompletionUsage | None, max_tokens: int) -> CompletionUsage:
        usage = _usage(reported)
        require(
            0 < usage.completion_tokens <= max_tokens,
            f"completion_tokens={usage.completion_tokens} not in 1..{max_tokens}",
        )
        require(usage.prompt_tokens > 0, f"prompt_tokens={usage.prompt_tokens}")
        require(
            usage.total_tokens == usage.prompt_tokens + usage.completion_tokens,
            f"total_tokens={usage.total_tokens} != prompt+completion",
        )
        return usage

    def completion(self) -> tuple[str, str]:
        """A completion comes back, with usage that adds up."""
        mt = self.spec.max_tokens
        resp = self.client.completions.create(
            model=self.name, prompt=self.spec.prompts[0], max_tokens=mt, temperature=0
        )
        text = resp.choices[0].text
        require(bool(text.strip()), "empty completion text")
        usage = self._usage_ok(resp.usage, mt)
        return text, f"{usage.completion_tokens} tokens: {text[:60]!r}"

    def chat(self) -> tuple[str, str]:
        """A chat completion comes back, with usage that adds up."""
        mt = self.spec.max_tokens
        resp = self.client.chat.completions.create(
            model=self.name, messages=[{"role": "user", "content": self.spec.prompts[-1]}], max_tokens=mt, temperature=0
        )
        text = resp.choices[0].message.content or ""
        require(bool(text.strip()), "empty chat completion text")
        usage = self._usage_ok(resp.usage, mt)
        return text, f"{usage.completion_tokens} tokens: {text[:60]!r}"

    def greedy_determinism(self) -> tuple[str, str]:
        """Two greedy completions of one prompt are the same text."""
        outs = []
        for _ in range(2):
            resp = self.client.completions.create(
                model=self.name, prompt=self.spec.prompts[-1], max_tokens=self.spec.max_tokens, temperature=0
            )
            outs.append(resp.choices[0].text)
        require(outs[0] == outs[1], f"two greedy runs differ: {outs[0]!r} vs {outs[1]!r}")
        return outs[0], "same text twice at temperature 0"

    def throughput(self) -> tuple[float, str]:
        """Tokens per second of one completion, at least the recipe's minimum when it sets one."""
        t0 = time.monotonic()
        resp = self.client.completions.create(
            model=self.name, prompt=self.spec.prompts[0], max_tokens=128, temperature=0, extra_body={"ignore_eos": True}
        )
        dt = time.monotonic() - t0
        tokens = _usage(resp.usage).completion_tokens
        rate = tokens / dt
        if self.spec.min_tokens_per_s is not None:
            require(rate >= self.spec.min_tokens_per_s, f"{rate:.1f} tok/s < min {self.spec.min_tokens_per_s}")
        return rate, f"{tokens} tokens in {dt:.2f} s = {rate:.1f} tok/s"

    def metrics(self) -> tuple[dict[str, float | None], str]:
        """vLLM's Prometheus metrics count the requests the checks made."""
        with urllib.request.urlopen(f"{self.box.url}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        ok_requests = metric_sum(text, "vllm:request_success_total")
        require(ok_requests is not None and ok_requests >= 4, f"vllm:request_success_total={ok_requests}")
        detail = f"request_success_total={ok_requests:.0f}"
        values = {"request_success_total": ok_requests}
        if self.spec.expect_spec_decode:
            drafts = metric_sum(text, "vllm:spec_decode_num_draft_tokens_total")
            accepted = metric_sum(text, "vllm:spec_decode_num_accepted_tokens_total")
            if drafts is None or drafts <= 0:
                raise AssertionError(f"vllm:spec_decode_num_draft_tokens_total={drafts}")
            rate = (accepted or 0.0) / drafts
            values.update(draft_tokens=drafts, accepted_tokens=accepted, acceptance_rate=rate)
            detail += f", spec_decode draft tokens={drafts:.0f} accepted={accepted or 0:.0f} ({rate:.0%})"
            if self.spec.min_acceptance_rate is not None:
                require(
                    rate >= self.spec.min_acceptance_rate,
                    f"acceptance {rate:.2f} < min {self.spec.min_acceptance_rate}",
                )
        return values, detail

    def plugin_loaded(self) -> tuple[str, str]:
        """The container's log says kiln-engine loaded."""
        text = self.box.logs(tail=100000)
        lines = [ln for ln in text.splitlines() if "kiln-engine" in ln and "loaded" in ln]
        require(bool(lines), "no 'kiln-engine ... loaded' line in the container log")
        return lines[0], lines[0].strip()[-140:]

    def patched_runner_imports(self) -> tuple[str, str]:
        # as vLLM does: general plugins first (kiln's registers the modules patched code imports)
        """The patched model runner imports inside the container."""
        code, out = self.box.exec(
            [
                "python",
                "-c",
                (
                    "from vllm.plugins import load_general_plugins; "
                    "load_general_plugins(); import vllm.v1.worker.gpu.model_runner as m; print(m.__file__)"
                ),
            ]
        )
        require(code == 0, f"exit {code}: {out.strip().splitlines()[-1] if out.strip() else ''}")
        return out.strip(), out.strip().splitlines()[-1]

    def feature_load(self, feature: Feature) -> tuple[int, str]:
        """The traffic the feature asks for before its checks (e.g. enough verify steps
        to pass an estimator's warm-up), as concurrent greedy completions."""
        in_flight, tokens = feature.smoke_load
        prompts = [f"{self.spec.prompts[i % len(self.spec.prompts)]} {i}" for i in range(in_flight)]

        def one(prompt: str) -> int:
            resp = self.client.completions.create(
                model=self.name, prompt=prompt, max_tokens=tokens, temperature=0, extra_body={"ignore_eos": True}
            )
            return _usage(resp.usage).completion_tokens

        # rounds until the feature has reported (its summary line), at most four: how
        # many steps a round takes depends on how many drafts the model accepts
        t0, done, rounds = time.monotonic(), 0, 0
        while rounds < 4:
            with ThreadPoolExecutor(max_workers=in_flight) as pool:
                done += sum(pool.map(one, prompts))
            rounds += 1
            if feature.log_lines[-1] in self.box.logs(tail=100000):
                break
        return done, (f"{rounds} round(s) of {in_flight} requests x {tokens} tokens in {time.monotonic() - t0:.1f} s")

    def feature_logs(self, feature: Feature) -> tuple[str, str]:
        """The feature announced itself once per server (not once per tensor-parallel
        rank) and logged its periodic summary (the smoke container runs with the
        feature's smoke env, e.g. a short interval, so a few prompts suffice)."""
        lines = self.box.logs(tail=100000).splitlines()
        starts = [ln for ln in lines if feature.start_line in ln]
        require(len(starts) == 1, f"{len(starts)} {feature.start_line!r} lines in the log (want exactly 1)")
        for marker in feature.log_lines:
            require(any(marker in ln for ln in lines), f"no {marker!r} line in the container log")
        last = [ln for ln in lines if feature.log_lines[-1] in ln][-1]
        return last, last.strip()[-160:]

    def feature_metrics(self, feature: Feature) -> tuple[dict[str, float | None], str]:
        """The feature's counters are on the server's /metrics (they are counted in
        the engine's worker processes), and its ratios lie within the spec's bounds."""
        text = feature_metrics_text(self.box.url)
        values = {name: metric_sum(text, name) for name in feature.metrics}
        missing = [name for name, v in values.items() if v is None]
        require(not missing, f"not on /metrics: {', '.join(missing)}")
        ratios: dict[str, float | None] = {}
        for name, bounds in self.spec.features.get(feature.name, {}).items():
            value = feature_ratio(values, feature.ratio(name))
            ratios[name] = value
            if value is None:
                raise AssertionError(f"{name}: denominator is 0 (nothing counted yet)")
            require(bounds.min is None or value >= bounds.min, f"{name}={value:.3f} < min {bounds.min}")
            require(bounds.max is None or value <= bounds.max, f"{name}={value:.3f} > max {bounds.max}")
        ratios_said = ", ".join(f"{k}={v:.3f}" for k, v in ratios.items()) or "no bounds in the spec"
        return {**values, **ratios}, f"{len(values)} counters; {ratios_said}"

    def engine_info(self) -> tuple[str, str]:
        """`python -m kiln_engine info` runs inside the container."""
        code, out = self.box.exec(["python", "-m", "kiln_engine", "info"])
        require(code == 0, f"exit {code}: {out[-200:]}")
        return out, out.strip().splitlines()[0]


CHECKS = (
    "models",
    "completion",
    "chat",
    "greedy_determinism",
    "throughput",
    "metrics",
    "plugin_loaded",
    "patched_runner_imports",
    "engine_info",
)


def feature_metrics_text(url: str) -> str:
    """The server's /metrics page, as Prometheus text."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text: str = resp.read().decode()
    return text


def feature_ratio(values: Mapping[str, float | None], ratio: Ratio) -> float | None:
    """sum(numerator) / sum(denominator) from counter sums; None when nothing counted."""
    num, den = values.get(ratio.numerator), values.get(ratio.denominator)
    if num is None or not den:
        return None
    return num / den
