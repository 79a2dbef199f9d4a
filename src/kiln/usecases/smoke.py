"""Proving a built image serves, with the official OpenAI client (`kiln smoke NAME`).

Starts the container on a free loopback port, waits for /health, runs the checks the
recipe's smoke spec asks for, and writes a record keyed by image id that publishing
trusts. Any failure prints the container's last 100 log lines, removes the container
and exits with SmokeFailed's code.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Literal

from pydantic import with_config
from typing_extensions import TypedDict

from kiln.basics import clock
from kiln.basics.errors import ContainerStartFailed, SmokeFailed
from kiln.basics.json_types import DESCRIBED
from kiln.basics.log import human_secs
from kiln.basics.paths import shown_home
from kiln.domain.imagecheck import in_image_smoke, launch_arg_check
from kiln.domain.images.build_plan import check_build_space, check_platform
from kiln.domain.images.definitions import RecipeImage, require_built
from kiln.domain.images.engine_image import engine_modules
from kiln.domain.locks import engine_lock
from kiln.domain.recipes.feature_registry import engine_features
from kiln.domain.recipes.recipe import LoadedRecipe
from kiln.domain.recipes.recipe_sections import Smoke
from kiln.domain.recipes.resolved import ResolvedRecipe
from kiln.domain.recipes.topology import Topology, effective
from kiln.domain.serving.launch_command import RunSpec
from kiln.domain.serving.multi_node import NodeGroup, node_specs
from kiln.domain.serving.serving_container import (
    ServingContainer,
    free_port,
    gpu_visible,
    preflight,
    run_spec,
)
from kiln.infra import binfmt
from kiln.infra.docker import DockerDaemon, id_of
from kiln.infra.records import CheckEntry, SmokeRecord, Timings, write_smoke_record
from kiln.usecases import progress
from kiln.usecases.build import build_recipe
from kiln.usecases.smoke_checks import CHECKS, Check, ServedChecks, SmokeRun, require


@with_config(DESCRIBED)
class SmokeDocument(SmokeRecord):
    """`kiln smoke --json` of a run (src/kiln/schemas/smoke.json): the smoke record and
    where it was written."""

    record: str | None
    """The record file; null when --nodes overrode the topology (nothing written)."""


class SmokeSkipped(TypedDict):
    """`kiln smoke --json` when this host cannot run the smoke test at all."""

    recipe: str
    skipped: Literal[True]
    reason: str
    passed: None


# `kiln smoke --json`: a run's document, or why there was none
SmokeJson = SmokeDocument | SmokeSkipped


def _stopped_in_time(stop_s: float) -> tuple[float, str]:
    require(stop_s < 30, f"SIGTERM took {stop_s:.1f} s (limit 30 s)")
    return stop_s, f"stopped in {stop_s:.1f} s after SIGTERM"


def _serving(
    docker: DockerDaemon, loaded: LoadedRecipe, image_id: str, topo: Topology
) -> tuple[NodeGroup | ServingContainer, ServingContainer, RunSpec]:
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


def _emulated_smoke(spec: Smoke, factor: int = EMULATION_FACTOR) -> Smoke:
    """The recipe's smoke spec with its limits scaled for emulation (stated in the record)."""
    return spec.model_copy(
        update={
            "startup_timeout_s": min(spec.startup_timeout_s * factor, 7200),
            "request_timeout_s": min(spec.request_timeout_s * factor, 3600),
            "min_tokens_per_s": None if spec.min_tokens_per_s is None else spec.min_tokens_per_s / factor,
        }
    )


def smoke(
    resolved: ResolvedRecipe,
    *,
    docker: DockerDaemon | None = None,
    build: bool = False,
    topology: Topology | None = None,
    platform: str | None = None,
    in_image: bool = False,
) -> SmokeJson:
    """The smoke record of the recipe's built image, served (or proved in the image), or
    why this host cannot smoke it; SmokeFailed (its record attached) when a check fails.
    `topology` overrides the recipe's (e.g. one tensor-parallel rank per container, to
    prove the multi-node wiring on one host); such a run writes no smoke record.
    `platform`: the image built for that platform (another architecture runs under
    qemu, its limits scaled by EMULATION_FACTOR). `in_image`: a GPU recipe on a host
    without a GPU runs the in-image proofs instead of serving (record level "in-image")."""
    docker = docker or DockerDaemon()
    name = resolved.name
    if platform is not None:
        check_platform(resolved.loaded, platform)
    if build:
        check_build_space(docker, resolved, [platform])
        build_recipe(resolved, docker=docker, platform=platform)
    built = require_built(docker, resolved, platform)
    loaded, recipe_image, image = built.loaded, built.recipe_image, built.image
    recipe = loaded.recipe
    emulated = platform is not None and not binfmt.state(platform).native
    if emulated:
        recipe = recipe.model_copy(update={"smoke": _emulated_smoke(recipe.smoke)})
        progress.info(
            f"smoke {name}: {platform} under emulation: limits x{EMULATION_FACTOR} (startup "
            f"{recipe.smoke.startup_timeout_s} s, request {recipe.smoke.request_timeout_s} s)"
        )
    if recipe.smoke.gpu and not gpu_visible():
        if in_image:
            return _in_image_smoke(docker, built.loaded, recipe_image, id_of(image), emulated)
        progress.warn(
            f"smoke {name}: SKIPPED: needs NVIDIA GPUs and none is visible on this host "
            "(--in-image: prove what can be proved without one)"
        )
        return SmokeSkipped(recipe=name, skipped=True, reason="no GPU visible on this host", passed=None)
    topo = topology or effective(recipe)
    if topo.multi_node and recipe.engine.flavour != "cpu":
        reason = f"spans {topo.nodes} nodes of GPUs; one host cannot serve it (smoke it on the cluster)"
        progress.warn(f"smoke {name}: SKIPPED: {reason}")
        return SmokeSkipped(recipe=name, skipped=True, reason=reason, passed=None)
    built_id = id_of(image)
    served, box, spec = _serving(docker, loaded, built_id, topo)
    features = engine_features(recipe.features)
    for node_spec in served.specs if isinstance(served, NodeGroup) else [spec]:
        for feature in features:
            node_spec.env.update(feature.smoke_env)
    preflight(loaded, spec)
    started = clock.now().isoformat(timespec="seconds")
    nodes = f", {topo.nodes} nodes" if topo.multi_node else ""
    progress.step(f"smoke {name}: {recipe_image.tag} ({built_id[:19]}) on {spec.host_ip}:{spec.host_port}{nodes}")
    t0 = time.monotonic()
    run = SmokeRun()
    startup: float | None = None
    with served:
        served.start()
        try:
            startup = served.wait_healthy(recipe.smoke.startup_timeout_s)
        except ContainerStartFailed as exc:
            run.checks.append(Check("startup", False, exc.message))
        if startup is not None:
            checks = ServedChecks(box, recipe)
            for check_name in CHECKS:
                _raise_if_node_lost(served)
                run.check(check_name, getattr(checks, check_name))
            for feature in features:
                _raise_if_node_lost(served)
                if feature.smoke_load[0] > 0:
                    run.check(f"{feature.name} load", partial(checks.feature_load, feature))
                run.check(f"{feature.name} logs", partial(checks.feature_logs, feature))
                run.check(f"{feature.name} metrics", partial(checks.feature_metrics, feature))
            _raise_if_node_lost(served)
            if not run.passed:
                box.dump_logs(100)
            stop_s = served.stop(timeout=30)
            run.check("clean_stop", lambda: _stopped_in_time(stop_s))
    evidence = SmokeRecord(
        recipe=name,
        image_id=built_id,
        tag=recipe_image.tag,
        input_digest=recipe_image.digest,
        platform=recipe_image.platform,
        emulation_factor=EMULATION_FACTOR if emulated else None,
        level="served",
        passed=run.passed,
        started_at=started,
        checks=[CheckEntry(name=c.name, ok=c.ok, detail=c.detail, seconds=c.seconds) for c in run.checks],
        timings=Timings(
            startup_s=None if startup is None else round(startup, 2), total_s=round(time.monotonic() - t0, 2)
        ),
    )
    # no record when --nodes overrode the topology: it proves another layout than the recipe's
    path = write_smoke_record(evidence) if topology is None else None
    record = SmokeDocument(**evidence, record=None if path is None else str(path))
    progress.summary(
        f"smoke {name}: {'PASSED' if run.passed else 'FAILED'}",
        {
            "image": f"{recipe_image.tag} ({built_id[:19]})",
            "checks": f"{sum(c.ok for c in run.checks)}/{len(run.checks)} passed",
            "startup": "never healthy" if startup is None else f"{startup:.1f} s",
            "took": human_secs(time.monotonic() - t0),
            "record": shown_home(path) if path else "none (topology overridden)",
        },
    )
    if not run.passed:
        failed = ", ".join(c.name for c in run.checks if not c.ok)
        failure = SmokeFailed(f"smoke {name}: failed checks: {failed}")
        failure.record = dict(record)
        raise failure
    return record


def _in_image_smoke(
    docker: DockerDaemon, loaded: LoadedRecipe, recipe_image: RecipeImage, image_id: str, emulated: bool
) -> SmokeDocument:
    """The in-image proofs as a smoke run: each proof one check, then vLLM's own parser
    on the launch command (launch_arg_check, the answer the build cached). Writes a record of
    level "in-image": publishing shows the level; it is not a served smoke."""
    recipe = loaded.recipe
    started = clock.now().isoformat(timespec="seconds")
    progress.step(
        f"smoke {loaded.name}: in-image proofs in {recipe_image.tag} ({image_id[:19]}), no GPU on this host"
        + (", under qemu" if emulated else "")
    )
    t0 = time.monotonic()
    want = in_image_smoke.Expected(
        machine=engine_lock.platform(recipe_image.platform).machine,
        cuda=recipe.engine.cuda,
        modules=engine_modules(recipe.engine.flavour),
        draft_trunc="draft-trunc" in recipe.features,
    )
    facts = in_image_smoke.gather(docker, image_id, want.modules)
    progress.info(f"  facts gathered in the image in {human_secs(time.monotonic() - t0)}")
    run = SmokeRun()
    for check_name, ok, detail in in_image_smoke.judge(facts, want):
        run.check(check_name, partial(_fact, ok, detail))
    run.check("launch_args", lambda: _launch_accepted(docker, recipe_image.resolved, image_id))
    evidence = SmokeRecord(
        recipe=loaded.name,
        image_id=image_id,
        tag=recipe_image.tag,
        input_digest=recipe_image.digest,
        platform=recipe_image.platform,
        emulation_factor=EMULATION_FACTOR if emulated else None,
        level="in-image",
        passed=run.passed,
        started_at=started,
        checks=[CheckEntry(name=c.name, ok=c.ok, detail=c.detail, seconds=c.seconds) for c in run.checks],
        timings=Timings(startup_s=None, total_s=round(time.monotonic() - t0, 2)),
    )
    path = write_smoke_record(evidence)
    record = SmokeDocument(**evidence, record=str(path))
    progress.summary(
        f"smoke {loaded.name}: in-image proofs {'PASSED' if run.passed else 'FAILED'} (not served: no GPU)",
        {
            "image": f"{recipe_image.tag} ({image_id[:19]})",
            "checks": f"{sum(c.ok for c in run.checks)}/{len(run.checks)} passed",
            "took": human_secs(time.monotonic() - t0),
            "record": shown_home(path),
        },
    )
    if not run.passed:
        failure = SmokeFailed(
            f"smoke {loaded.name}: failed in-image proofs: {', '.join(c.name for c in run.checks if not c.ok)}"
        )
        failure.record = dict(record)
        raise failure
    return record


def _fact(ok: bool, detail: str) -> tuple[None, str]:
    require(ok, detail)
    return None, detail


def _launch_accepted(docker: DockerDaemon, recipe: ResolvedRecipe, image_id: str) -> tuple[None, str]:
    problems = launch_arg_check.check_image(docker, recipe, docker.require_image(image_id))
    require(not problems, "; ".join(problems))
    return None, "the engine's own vLLM parser accepts the launch command"


def _raise_if_node_lost(served: NodeGroup | ServingContainer) -> None:
    """A node group whose member died fails the smoke as NodeLost, not as a list of
    checks that timed out one after another."""
    lost = served.lost_node() if isinstance(served, NodeGroup) else None
    if isinstance(served, NodeGroup) and lost is not None:
        raise served.node_lost(lost, "while serving")


# the use-case's surface: what a command, or a caller in Python, imports from here
__all__ = ["EMULATION_FACTOR", "SmokeDocument", "SmokeJson", "SmokeSkipped", "smoke"]
