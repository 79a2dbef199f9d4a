"""Serve a built recipe image the way `kiln run` does (hardened, loopback port) with
extra env, and send it request sets through the OpenAI client.

Shared by the e2e tests (tests/e2e/), benchmarks/bench_cpu.py,
benchmarks/spec_acceptance.py and benchmarks/draft_trunc/record_traces.py, so all of
them measure the same thing.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kiln.domain.serving.launch_command import Mount
from kiln.domain.serving.serving_container import ServingContainer, free_port, run_spec
from kiln.usecases.smoke_checks import feature_metrics_text, metric_sum

# the client half lives apart so that the GPU twin's runner can use it without kiln
from kiln_testkit.requestsets import prompts as prompts  # an explicit re-export (mypy --strict)  # noqa: PLC0414
from kiln_testkit.requestsets import run_set as run_set  # an explicit re-export (mypy --strict)  # noqa: PLC0414

if TYPE_CHECKING:
    from kiln.domain.recipes.recipe import LoadedRecipe
    from kiln.infra.docker import DockerDaemon

OMP_BIND = "VLLM_CPU_OMP_THREADS_BIND"  # vLLM's CPU worker: cores to pin to, "auto" or "nobind"
# "0": the model runs in the engine-core process (vLLM's uniproc executor), not in a worker
# process of its own; serving_all's docstring says why
MULTIPROC = "VLLM_ENABLE_V1_MULTIPROCESSING"


@contextmanager
def serving(
    docker_daemon: DockerDaemon,
    loaded: LoadedRecipe,
    image_id: str,
    env: dict[str, str] | None = None,
    startup_timeout_s: float = 600,
    mounts: list[tuple[str, str]] | None = None,
    args: list[str] | None = None,
) -> Iterator[ServingContainer]:
    """A healthy server of `image_id`; `env` wins over the recipe's launch env (as with
    `docker run -e`), `args` over its baked vLLM flags of the same name (as with `kiln
    run NAME -- ARGS`). Yields the ServingContainer; stops and removes it afterwards."""
    spec = run_spec(loaded, image_id, host_port=free_port(), host_ip="127.0.0.1", env=env, extra_args=args)
    spec.mounts += [Mount(host, inside) for host, inside in mounts or []]
    box = ServingContainer(docker_daemon, spec)
    with box:
        box.start()
        box.wait_healthy(startup_timeout_s)  # sets box.startup_s, for the callers' reports
        yield box


@contextmanager
def serving_all(
    docker_daemon: DockerDaemon,
    loaded: LoadedRecipe,
    image_id: str,
    envs: dict[str, dict[str, str]],
    startup_timeout_s: float = 600,
    args: dict[str, list[str]] | None = None,
) -> Iterator[dict[str, ServingContainer]]:
    """One healthy server of `image_id` per entry of `envs` (name -> extra env), started
    together so that they boot in parallel (a tiny-kindling start is mostly one busy
    Python process; on 2 cores two boot in about the time of one). `args` (name -> vLLM
    flags) win over a server's baked flags of the same name. Yields {name:
    ServingContainer}; each box's `startup_s` counts from the common start.

    vLLM's CPU worker pins itself by default (VLLM_CPU_OMP_THREADS_BIND=auto) to the
    host's cores but one, which it leaves to the front end: on 2 cores, core 0. Every
    server here would pin its worker, where all the model's work runs, to that one core
    and leave the other to the front ends (seen 2026-12-02: three tiny-kindling workers
    on core 0, ~33 % each, core 1 mostly idle). So unless `envs` says otherwise each
    server runs unpinned (`nobind`) and the kernel spreads the workers over the cores.

    vLLM 0.32.0's CPU platform also moves the model into a worker process of its own
    (the multiprocessing executor) whenever VLLM_ENABLE_V1_MULTIPROCESSING is 1, and the
    engine core and that worker hand each step over a shared-memory ring whose reader
    spins (sched_yield) for 1 s after every read (shm_broadcast.SpinCondition,
    busy_loop_s=1). One server has the cores to spare; three on 2 cores do not: each
    one's spinning takes time slices from the others' model work. So unless `envs` says
    otherwise the servers here run with VLLM_ENABLE_V1_MULTIPROCESSING=0: the platform
    keeps vLLM's uniproc executor, the model runs in the engine-core process (still
    apart from the API server), and nothing spins. The model runner, its draft-trunc
    hooks and every request's path are the ones the recipe serves with; only the process
    that runs them differs (docs/benchmarks.md has the timings)."""
    with ExitStack() as stack:
        boxes: dict[str, ServingContainer] = {}
        t0 = time.monotonic()
        for name, extra in envs.items():
            env = {OMP_BIND: "nobind", MULTIPROC: "0", **extra}
            spec = run_spec(
                loaded, image_id, host_port=free_port(), host_ip="127.0.0.1", env=env, extra_args=(args or {}).get(name)
            )
            box = stack.enter_context(ServingContainer(docker_daemon, spec))
            box.start()
            boxes[name] = box
        for box in boxes.values():
            box.wait_healthy(max(1.0, startup_timeout_s - (time.monotonic() - t0)))
            box.startup_s = time.monotonic() - t0
        try:
            yield boxes
        except Exception as exc:
            # a client error ("Server disconnected") says nothing of why; the servers'
            # own state and log tails do, and they are gone once the stack unwinds
            for name, box in boxes.items():
                exc.add_note(server_report(name, box))
            raise


def server_report(name: str, box: ServingContainer, tail: int = 60) -> str:
    """One server's state (or exit code, if it is gone) and the end of its log."""
    try:
        state = box.status()
    except Exception as err:  # gone (AutoRemove) or the daemon did not answer  # noqa: BLE001
        state = f"gone ({type(err).__name__})"
    if box.exit_code is not None:
        state += f", exit code {box.exit_code}"
    lines = box.logs(tail=tail).rstrip()
    return f"--- server {name!r} ({box.spec.name}): {state}; last {tail} log lines ---\n{lines}"


def counters(url: str, names: Iterable[str]) -> dict[str, float | None]:
    """The sum of each named counter on the server's /metrics; None for one it does not expose."""
    text = feature_metrics_text(url)
    return {name: metric_sum(text, name) for name in names}


_PER_POS = re.compile(
    r'^vllm:spec_decode_num_accepted_tokens_per_pos(?:_total)?\{[^}]*position="(\d+)"[^}]*\}\s+([0-9.eE+-]+)\s*$'
)


@dataclass
class SpecDecodeStats:
    """vLLM's own speculative-decoding counters, summed over label sets: verify windows
    (`drafts`), draft tokens proposed, accepted, and accepted at each draft position."""

    drafts: float
    draft_tokens: float
    accepted: float
    accepted_per_pos: list[float]

    @property
    def acceptance(self) -> float:
        """accepted / proposed draft tokens: what vLLM's log calls the acceptance rate."""
        return self.accepted / self.draft_tokens

    @property
    def per_position(self) -> list[float]:
        """Of the windows that proposed a draft at position i, the share accepting it
        (chain acceptance: position i counts only when positions < i were accepted)."""
        return [a / self.drafts for a in self.accepted_per_pos]

    @property
    def conditional(self) -> list[float]:
        """P(draft i accepted | drafts < i accepted), the per-token agreement."""
        out, prev = [], self.drafts
        for a in self.accepted_per_pos:
            out.append(a / prev if prev else float("nan"))
            prev = a
        return out

    def __sub__(self, earlier: SpecDecodeStats) -> SpecDecodeStats:
        """What was counted since `earlier` (a snapshot of the same server)."""
        pos = [a - b for a, b in zip(self.accepted_per_pos, earlier.accepted_per_pos, strict=True)]
        return SpecDecodeStats(
            self.drafts - earlier.drafts,
            self.draft_tokens - earlier.draft_tokens,
            self.accepted - earlier.accepted,
            pos,
        )

    def summary(self) -> str:
        """The statistics as one line: acceptance, counts, per-position and conditional rates."""
        return (
            f"acceptance {self.acceptance:.3f} ({self.accepted:.0f}/{self.draft_tokens:.0f} draft tokens, "
            f"{self.drafts:.0f} windows); per position "
            f"{' '.join(f'{x:.3f}' for x in self.per_position)}; conditional "
            f"{' '.join(f'{x:.3f}' for x in self.conditional)}"
        )


def spec_decode_stats(url: str) -> SpecDecodeStats | None:
    """The server's speculative-decoding counters from /metrics; None without any."""
    return parse_spec_decode(feature_metrics_text(url))


def parse_spec_decode(text: str) -> SpecDecodeStats | None:
    """The speculative decoding statistics in a /metrics text; None when it has no drafts."""
    drafts = metric_sum(text, "vllm:spec_decode_num_drafts_total")
    tokens = metric_sum(text, "vllm:spec_decode_num_draft_tokens_total")
    accepted = metric_sum(text, "vllm:spec_decode_num_accepted_tokens_total")
    if not drafts or not tokens or accepted is None:
        return None
    per_pos: dict[int, float] = {}
    for line in text.splitlines():
        m = _PER_POS.match(line)
        if m:
            per_pos[int(m.group(1))] = per_pos.get(int(m.group(1)), 0.0) + float(m.group(2))
    return SpecDecodeStats(drafts, tokens, accepted, [per_pos[i] for i in sorted(per_pos)])
