"""`kiln smoke NAME`: prove a built image serves, with the official OpenAI client.

Starts the container on a free loopback port, waits for /health, runs the checks the
recipe's smoke spec asks for, and writes a record keyed by image id that publishing
trusts. Any failure prints the container's last 100 log lines, removes the container
and exits with SmokeFailed's code.
"""

from __future__ import annotations

import argparse
import re
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kiln.basics import clock, log
from kiln.basics.errors import ContainerStartFailed, DockerDaemonError, SmokeFailed
from kiln.basics.paths import shown_home
from kiln.commands.images.build import build_recipe, check_platform
from kiln.commands.options import count, reports
from kiln.domain.images.specs import require_built
from kiln.domain.locks import enginelock
from kiln.domain.recipes.engine_features import engine_features
from kiln.domain.recipes.recipe import load_recipe, recipe_dir
from kiln.domain.recipes.topology import effective, split_over_nodes
from kiln.domain.serving.container import (
    ServingContainer,
    free_port,
    gpu_visible,
    preflight,
    run_spec,
)
from kiln.domain.serving.multinode import NodeGroup, node_specs
from kiln.infra import binfmt
from kiln.infra.docker import DockerDaemon, id_of
from kiln.infra.records import write_smoke_record

if TYPE_CHECKING:  # openai is a dev extra, imported late where a server is up
    from openai.types import CompletionUsage


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    seconds: float = 0.0


@dataclass
class SmokeRun:
    checks: list[Check] = field(default_factory=list)

    def check(self, name: str, fn) -> object:
        t0 = time.monotonic()
        try:
            value, detail = fn()
            ok = True
        except DockerDaemonError:  # the daemon failed, not the image: no verdict, no record
            raise
        except Exception as exc:  # a failed check is data, not a crash
            value, detail, ok = None, f"{type(exc).__name__}: {exc}", False
        c = Check(name, ok, str(detail)[:500], round(time.monotonic() - t0, 3))
        self.checks.append(c)
        mark = "[green]pass[/]" if ok else "[red]FAIL[/]"
        log.console.print(f"  {mark} {name}: ", end="", markup=True)
        log.console.print(c.detail, markup=False, highlight=False)
        return value

    @property
    def passed(self) -> bool:
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


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise AssertionError(message)


def _usage(usage: CompletionUsage | None) -> CompletionUsage:
    """A response's token usage, which the smoke test requires the server to report."""
    if usage is None:
        raise AssertionError("no usage in response")
    return usage


class _Checks:
    """The checks themselves; each returns (value, detail) or raises."""

    def __init__(self, box: ServingContainer, recipe):
        from openai import OpenAI  # late: a dev extra, needed only once a server is up to smoke

        self.box = box
        self.recipe = recipe
        self.spec = recipe.smoke
        self.name = self.spec.served_model_name or recipe.launch.served_model_name
        self.client = OpenAI(base_url=f"{box.url}/v1", api_key="kiln-smoke",
                             timeout=self.spec.request_timeout_s, max_retries=0)

    def models(self):
        ids = [m.id for m in self.client.models.list().data]
        _require(self.name in ids, f"served model {self.name!r} not in {ids}")
        return ids, f"{ids}"

    def _usage_ok(self, reported: CompletionUsage | None, max_tokens: int) -> CompletionUsage:
        usage = _usage(reported)
        _require(0 < usage.completion_tokens <= max_tokens, f"completion_tokens={usage.completion_tokens} not in 1..{max_tokens}")
        _require(usage.prompt_tokens > 0, f"prompt_tokens={usage.prompt_tokens}")
        _require(usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, f"total_tokens={usage.total_tokens} != prompt+completion")
        return usage

    def completion(self):
        mt = self.spec.max_tokens
        resp = self.client.completions.create(model=self.name, prompt=self.spec.prompts[0], max_tokens=mt, temperature=0)
        text = resp.choices[0].text
        _require(bool(text.strip()), "empty completion text")
        usage = self._usage_ok(resp.usage, mt)
        return text, f"{usage.completion_tokens} tokens: {text[:60]!r}"

    def chat(self):
        mt = self.spec.max_tokens
        resp = self.client.chat.completions.create(
            model=self.name, messages=[{"role": "user", "content": self.spec.prompts[-1]}],
            max_tokens=mt, temperature=0)
        text = resp.choices[0].message.content or ""
        _require(bool(text.strip()), "empty chat completion text")
        usage = self._usage_ok(resp.usage, mt)
        return text, f"{usage.completion_tokens} tokens: {text[:60]!r}"

    def greedy_determinism(self):
        outs = []
        for _ in range(2):
            r = self.client.completions.create(model=self.name, prompt=self.spec.prompts[-1],
                                               max_tokens=self.spec.max_tokens, temperature=0)
            outs.append(r.choices[0].text)
        _require(outs[0] == outs[1], f"two greedy runs differ: {outs[0]!r} vs {outs[1]!r}")
        return outs[0], "same text twice at temperature 0"

    def throughput(self):
        t0 = time.monotonic()
        r = self.client.completions.create(model=self.name, prompt=self.spec.prompts[0],
                                           max_tokens=128, temperature=0, extra_body={"ignore_eos": True})
        dt = time.monotonic() - t0
        tokens = _usage(r.usage).completion_tokens
        rate = tokens / dt
        if self.spec.min_tokens_per_s is not None:
            _require(rate >= self.spec.min_tokens_per_s, f"{rate:.1f} tok/s < min {self.spec.min_tokens_per_s}")
        return rate, f"{tokens} tokens in {dt:.2f} s = {rate:.1f} tok/s"

    def metrics(self):
        with urllib.request.urlopen(f"{self.box.url}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        ok_requests = metric_sum(text, "vllm:request_success_total")
        _require(ok_requests is not None and ok_requests >= 4, f"vllm:request_success_total={ok_requests}")
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
                _require(rate >= self.spec.min_acceptance_rate, f"acceptance {rate:.2f} < min {self.spec.min_acceptance_rate}")
        return values, detail

    def plugin_loaded(self):
        text = self.box.logs(tail=100000)
        lines = [ln for ln in text.splitlines() if "kiln-engine" in ln and "loaded" in ln]
        _require(bool(lines), "no 'kiln-engine ... loaded' line in the container log")
        return lines[0], lines[0].strip()[-140:]

    def patched_runner_imports(self):
        # as vLLM does: general plugins first (kiln's registers the modules patched code imports)
        code, out = self.box.exec(["python", "-c", "from vllm.plugins import load_general_plugins; "
                                   "load_general_plugins(); import vllm.v1.worker.gpu.model_runner as m; print(m.__file__)"])
        _require(code == 0, f"exit {code}: {out.strip().splitlines()[-1] if out.strip() else ''}")
        return out.strip(), out.strip().splitlines()[-1]

    def feature_load(self, feature):
        """The traffic the feature asks for before its checks (e.g. enough verify steps
        to pass an estimator's warm-up), as concurrent greedy completions."""

        in_flight, tokens = feature.smoke_load
        prompts = [f"{self.spec.prompts[i % len(self.spec.prompts)]} {i}" for i in range(in_flight)]

        def one(prompt):
            r = self.client.completions.create(model=self.name, prompt=prompt, max_tokens=tokens,
                                               temperature=0, extra_body={"ignore_eos": True})
            return _usage(r.usage).completion_tokens

        # rounds until the feature has reported (its summary line), at most four: how
        # many steps a round takes depends on how many drafts the model accepts
        t0, done, rounds = time.monotonic(), 0, 0
        while rounds < 4:
            with ThreadPoolExecutor(max_workers=in_flight) as pool:
                done += sum(pool.map(one, prompts))
            rounds += 1
            if feature.log_lines[-1] in self.box.logs(tail=100000):
                break
        return done, (f"{rounds} round(s) of {in_flight} requests x {tokens} tokens "
                      f"in {time.monotonic() - t0:.1f} s")

    def feature_logs(self, feature):
        """The feature announced itself once per server (not once per tensor-parallel
        rank) and logged its periodic summary (the smoke container runs with the
        feature's smoke env, e.g. a short interval, so a few prompts suffice)."""
        lines = self.box.logs(tail=100000).splitlines()
        starts = [ln for ln in lines if feature.start_line in ln]
        _require(len(starts) == 1, f"{len(starts)} {feature.start_line!r} lines in the log (want exactly 1)")
        for marker in feature.log_lines:
            _require(any(marker in ln for ln in lines), f"no {marker!r} line in the container log")
        last = [ln for ln in lines if feature.log_lines[-1] in ln][-1]
        return last, last.strip()[-160:]

    def feature_metrics(self, feature):
        """The feature's counters are on the server's /metrics (they are counted in
        the engine's worker processes), and its ratios lie within the spec's bounds."""
        text = feature_metrics_text(self.box.url)
        values = {name: metric_sum(text, name) for name in feature.metrics}
        missing = [name for name, v in values.items() if v is None]
        _require(not missing, f"not on /metrics: {', '.join(missing)}")
        ratios = {}
        for name, bounds in self.spec.features.get(feature.name, {}).items():
            value = feature_ratio(values, feature.ratio(name))
            ratios[name] = value
            _require(value is not None, f"{name}: denominator is 0 (nothing counted yet)")
            _require(bounds.min is None or value >= bounds.min, f"{name}={value:.3f} < min {bounds.min}")
            _require(bounds.max is None or value <= bounds.max, f"{name}={value:.3f} > max {bounds.max}")
        shown = ", ".join(f"{k}={v:.3f}" for k, v in ratios.items()) or "no bounds in the spec"
        return {**values, **ratios}, f"{len(values)} counters; {shown}"

    def engine_info(self):
        code, out = self.box.exec(["python", "-m", "kiln_engine", "info"])
        _require(code == 0, f"exit {code}: {out[-200:]}")
        return out, out.strip().splitlines()[0]


CHECKS = ("models", "completion", "chat", "greedy_determinism", "throughput",
          "metrics", "plugin_loaded", "patched_runner_imports", "engine_info")


def feature_metrics_text(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        return resp.read().decode()


def feature_ratio(values: dict, ratio) -> float | None:
    """sum(numerator) / sum(denominator) from counter sums; None when nothing counted."""
    num, den = values.get(ratio.numerator), values.get(ratio.denominator)
    if num is None or not den:
        return None
    return num / den


def _stopped_in_time(stop_s: float):
    _require(stop_s < 30, f"SIGTERM took {stop_s:.1f} s (limit 30 s)")
    return stop_s, f"stopped in {stop_s:.1f} s after SIGTERM"


def _serving(docker: DockerDaemon, loaded, image_id: str, topo):
    """The container (one node) or the node group (several) the checks run against, and
    the box whose URL, log and shell the checks use."""
    if topo.multi_node:

        group = NodeGroup(docker, node_specs(loaded, image_id, topo, host_port=free_port(), host_ip="127.0.0.1"))
        return group, group.leader, group.specs[0]
    spec = run_spec(loaded, image_id, host_port=free_port(), host_ip="127.0.0.1")
    box = ServingContainer(docker, spec)
    return box, box, spec


# an image of another architecture serves under qemu-user (binfmt_misc): every limit of
# time (startup, request) is this many times the recipe's, every rate limit this many
# times lower; measured for tiny-moe in docs/benchmarks.md
EMULATION_FACTOR = 20


def emulated_smoke(spec, factor: int = EMULATION_FACTOR):
    """The recipe's smoke spec with its limits scaled for emulation (stated in the record)."""
    return spec.model_copy(update={
        "startup_timeout_s": min(spec.startup_timeout_s * factor, 7200),
        "request_timeout_s": min(spec.request_timeout_s * factor, 3600),
        "min_tokens_per_s": None if spec.min_tokens_per_s is None else spec.min_tokens_per_s / factor,
    })


def smoke(name: str, *, docker: DockerDaemon | None = None, build: bool = False, topology=None,
          platform: str | None = None) -> dict:
    """`topology` overrides the recipe's (e.g. one tensor-parallel rank per container, to
    prove the multi-node wiring on one host); such a run writes no smoke record.
    `platform`: the image built for that platform (another architecture runs under
    qemu, its limits scaled by EMULATION_FACTOR)."""

    docker = docker or DockerDaemon()
    if platform is not None:
        check_platform(load_recipe(recipe_dir(name)), platform)
    if build:
        build_recipe(name, docker=docker, platform=platform)
    built = require_built(docker, name, platform)
    loaded, recipe_image, image = built.loaded, built.recipe_image, built.image
    recipe = loaded.recipe
    emulated = platform is not None and not binfmt.state(platform).native
    if emulated:
        recipe = recipe.model_copy(update={"smoke": emulated_smoke(recipe.smoke)})
        log.info(f"smoke {name}: {platform} under emulation: limits x{EMULATION_FACTOR} (startup "
                 f"{recipe.smoke.startup_timeout_s} s, request {recipe.smoke.request_timeout_s} s)")
    if recipe.smoke.gpu and not gpu_visible():
        log.warn(f"smoke {name}: SKIPPED: needs NVIDIA GPUs and none is visible on this host")
        return {"recipe": name, "skipped": True, "reason": "no GPU visible on this host", "passed": None}
    topo = topology or effective(recipe)
    if topo.multi_node and recipe.engine.flavour != "cpu":
        reason = f"spans {topo.nodes} nodes of GPUs; one host cannot serve it (smoke it on the cluster)"
        log.warn(f"smoke {name}: SKIPPED: {reason}")
        return {"recipe": name, "skipped": True, "reason": reason, "passed": None}
    built_id = id_of(image)
    served, box, spec = _serving(docker, loaded, built_id, topo)
    features = engine_features(recipe.features)
    for node_spec in getattr(served, "specs", [spec]):
        for feature in features:
            node_spec.env.update(feature.smoke_env)
    preflight(loaded, spec)
    started = clock.now().isoformat(timespec="seconds")
    nodes = f", {topo.nodes} nodes" if topo.multi_node else ""
    log.step(f"smoke {name}: {recipe_image.tag} ({built_id[:19]}) on {spec.host_ip}:{spec.host_port}{nodes}")
    t0 = time.monotonic()
    run = SmokeRun()
    startup = None
    with served:
        served.start()
        try:
            startup = served.wait_healthy(recipe.smoke.startup_timeout_s)
        except ContainerStartFailed as exc:
            run.checks.append(Check("startup", False, exc.message))
        if startup is not None:
            checks = _Checks(box, recipe)
            for check_name in CHECKS:
                _raise_if_node_lost(served)
                run.check(check_name, getattr(checks, check_name))
            for feature in features:
                _raise_if_node_lost(served)
                if feature.smoke_load[0] > 0:
                    run.check(f"{feature.name} load", lambda f=feature: checks.feature_load(f))
                run.check(f"{feature.name} logs", lambda f=feature: checks.feature_logs(f))
                run.check(f"{feature.name} metrics", lambda f=feature: checks.feature_metrics(f))
            _raise_if_node_lost(served)
            if not run.passed:
                box._dump_logs(100)
            stop_s = served.stop(timeout=30)
            run.check("clean_stop", lambda: _stopped_in_time(stop_s))
    record = {
        "recipe": name,
        "image_id": built_id,
        "tag": recipe_image.tag,
        "input_digest": recipe_image.digest,
        "platform": recipe_image.platform,
        "emulation_factor": EMULATION_FACTOR if emulated else None,
        "passed": run.passed,
        "started_at": started,
        "checks": [c.__dict__ for c in run.checks],
        "timings": {"startup_s": None if startup is None else round(startup, 2), "total_s": round(time.monotonic() - t0, 2)},
    }
    path = None
    if topology is None:
        path = write_smoke_record(record)
    record["record"] = None if path is None else str(path)
    log.summary(f"smoke {name}: {'PASSED' if run.passed else 'FAILED'}", {
        "image": f"{recipe_image.tag} ({built_id[:19]})",
        "checks": f"{sum(c.ok for c in run.checks)}/{len(run.checks)} passed",
        "startup": "never healthy" if startup is None else f"{startup:.1f} s",
        "took": log.human_secs(time.monotonic() - t0),
        "record": shown_home(path) if path else "none (topology overridden)",
    })
    if not run.passed:
        failed = ", ".join(c.name for c in run.checks if not c.ok)
        failure = SmokeFailed(f"smoke {name}: failed checks: {failed}")
        failure.record = record
        raise failure
    return record


def _raise_if_node_lost(served) -> None:
    """A node group whose member died fails the smoke as NodeLost, not as a list of
    checks that timed out one after another."""
    lost = getattr(served, "lost_node", lambda: None)()
    if lost is not None:
        raise served.node_lost(lost, "while serving")


def smoke_cli(args) -> int:
    topology = None
    if getattr(args, "nodes", None):

        topology = split_over_nodes(args.nodes)
    try:
        record = smoke(args.name, build=args.build, topology=topology, platform=args.platform)
    except SmokeFailed as exc:
        if args.json and exc.record:
            log.emit_json(exc.record)  # the failed checks are what a script wants to see
        raise
    if args.json:
        log.emit_json(record)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    s = reports(sub.add_parser("smoke", help="smoke-test a built image with the OpenAI client"))
    s.add_argument("name")
    s.add_argument("--build", action="store_true", help="build first if needed")
    s.add_argument("--platform", choices=sorted(enginelock.PLATFORMS), default=None,
                   help="smoke the image built for this platform (default the host's); another architecture "
                        f"serves under qemu, with time limits x{EMULATION_FACTOR}")
    s.add_argument("--nodes", type=count("node", 64), default=None, metavar="N",
                   help="serve across N containers on a private docker network, one tensor-parallel rank each "
                        "(proves the multi-node wiring on one host; writes no smoke record)")
    s.set_defaults(func=smoke_cli)
