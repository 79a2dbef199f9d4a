"""build_cuda's anchor: the plain `pip install vllm` image of the same locked wheels, built
from the engine's wheels stage, for the size comparison."""

from __future__ import annotations

import os
import tempfile

from kiln_testkit.scripts import load_script
from kiln_testkit.tree import REPO

from kiln.basics import log
from kiln.domain.images import wheelhouse
from kiln.domain.images.build_context import BuildContext
from kiln.domain.images.ca_bundle import add_to_context
from kiln.domain.images.engine_image import LOCK_ARC
from kiln.domain.images.image_naming import platform_suffix
from kiln.domain.locks import engine_lock
from kiln.infra.docker import DockerDaemon

checks = load_script("benchmarks/build_cuda_checks.py")

PLAIN_REPOSITORY = "kiln/vllm-plain"
PLAIN_LABEL = "ai.kiln.plain.wheels"  # the wheels stage the anchor was installed from


def gb(n: float) -> float:
    return n / 1e9


def _plain_context(engine_image) -> BuildContext:
    """plain.Dockerfile in a context holding exactly the files its shared `wheels` stage
    COPYs, byte for byte as engine-cuda's context holds them (so the cache matches): the
    in-image lock tools, the lock's derived files and every locked wheel, the plain
    anchor's extra ones included."""
    ctx = BuildContext()
    ctx.add_bytes("Dockerfile", (engine_image.dir / "plain.Dockerfile").read_bytes())
    for tool in ("with-ca", "kiln-apt-install", "kiln-lock-tool"):
        ctx.add_file(f"_kiln/common/{tool}", REPO / "docker-images" / "common" / tool)
    lock = engine_image.lock
    # the target's own lock files: a cross-placed engine's context also carries the
    # host's pins and uv for its builder stages; the anchor runs every step on the target
    for name, data in engine_lock.context_files(lock, engine_image.platform).items():
        ctx.add_bytes(f"_kiln/lock/{name}", data)
    ctx.add_file(LOCK_ARC, engine_image.lock_file)
    wheels = wheelhouse.fetch_locked(
        lock, engine_image.platform, lock_file=engine_image.lock_file, cafile=engine_image.ca.get().path, plain=True
    )
    for whl in wheels:
        ctx.add_file(f"_kiln/wheels/{whl.name}", whl, in_digest=False)
    add_to_context(ctx, engine_image.ca.get())
    return ctx


def _build_wheels_stage(
    docker: DockerDaemon, ctx: BuildContext, buildargs: dict, nocache: bool, platform: str | None = None
) -> str:
    """The id of the shared `wheels` stage (a layer-cache hit after the engine build)."""
    image_id = None
    with tempfile.TemporaryFile() as tar:
        ctx.write_tar(tar)
        tar.seek(0)
        for chunk in docker.client.api.build(
            fileobj=tar,
            custom_context=True,
            buildargs=buildargs,
            target="wheels",
            rm=True,
            forcerm=True,
            decode=True,
            nocache=nocache,
            pull=False,
            platform=platform,
        ):
            if "error" in chunk:
                raise SystemExit(f"build_cuda: the wheels stage failed: {chunk['error'].strip()}")
            text = chunk.get("stream", "")
            if text.startswith("Step ") or "wheels:" in text:
                log.info(f"  wheels {text.strip()[:150]}")
            image_id = chunk.get("aux", {}).get("ID", image_id)
    if not image_id:
        raise SystemExit("build_cuda: the daemon reported no id for the wheels stage")
    return image_id


def build_plain(docker: DockerDaemon, engine_image, nocache: bool, force: bool):
    """The anchor image, installed by pip from the shared wheels, served over HTTP from a
    container on the default bridge (where the legacy builder's RUN steps run)."""
    ctx = _plain_context(engine_image)
    # the anchor builds every step for its platform (under qemu for another architecture)
    buildargs = {"BASE_IMAGE": engine_image.buildargs()["BASE_IMAGE"], "ENGINE_VERSION": engine_image.engine.version}
    plat = engine_image.platform
    wheels_id = _build_wheels_stage(docker, ctx, buildargs, nocache, platform=plat)
    tag = f"{PLAIN_REPOSITORY}:{engine_image.engine.version}{platform_suffix(plat)}"
    old = docker.image(tag)
    if old is not None and not force and (old.labels or {}).get(PLAIN_LABEL) == wheels_id:
        log.ok(f"{tag} is up to date (built from wheels {wheels_id[:19]})")
        return old.id, tag, 0.0, "skipped (up to date)"
    server = docker.client.containers.run(
        wheels_id,
        entrypoint=["python3", "-m", "http.server", "8765", "--directory", "/wheels"],
        detach=True,
        name=f"kiln-cuda-wheels-{os.getpid()}",
    )
    try:
        url = f"http://{checks.ip_when_serving(server)}:8765/"
        log.step(
            f"building the plain anchor: pip install vllm=={engine_image.engine.version} on "
            f"{engine_image.engine.base_image.pinned} (wheels from {url})"
        )
        result = docker.build(
            ctx,
            label="vllm-plain",
            buildargs={**buildargs, "WHEELS_URL": url},
            labels={PLAIN_LABEL: wheels_id},
            nocache=nocache,
            platform=plat,
        )
    finally:
        server.remove(force=True)
    docker.tag(result.image_id, tag)
    return result.image_id, tag, result.seconds, f"{result.cached_steps}/{result.steps}"
