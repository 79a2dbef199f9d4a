"""`kiln run NAME`: serve a built recipe image the way its flavour needs."""

from __future__ import annotations

from . import log
from .build import existing, resolve
from .container import ServingContainer, preflight, run_spec
from .dockerengine import DockerEngine
from .errors import ImageNotBuilt


def _image_ref(docker: DockerEngine | None, recipe_image) -> tuple[str, bool]:
    """The image by content id when built here, else its digest tag."""
    if docker is not None:
        img = existing(docker, recipe_image.tag, recipe_image.digest)
        if img is not None:
            return img.id, True
    return recipe_image.tag, False


def run(args) -> int:
    loaded, _, recipe_image = resolve(args.name)
    extra = [a for a in (args.vllm_args or []) if a != "--"]
    port = args.port or loaded.recipe.launch.port
    if args.print:
        try:
            docker = DockerEngine()
            docker.ping()
        except Exception:
            docker = None
        ref, built = _image_ref(docker, recipe_image)
        spec = run_spec(loaded, ref, host_port=port, extra_args=extra)
        print(spec.shell())
        if not built:
            log.warn(f"{recipe_image.tag} is not built on this host (`kiln build {args.name}`)")
        return 0
    # host-side problems (model paths, GPU, port) first: they need no daemon to explain
    preflight(loaded, run_spec(loaded, recipe_image.tag, host_port=port))
    docker = DockerEngine()
    ref, built = _image_ref(docker, recipe_image)
    if not built:
        raise ImageNotBuilt(f"{recipe_image.tag} (from the current inputs of {args.name}) is not built")
    spec = run_spec(loaded, ref, host_port=port, extra_args=extra, detach=args.detach)
    log.step(f"starting {recipe_image.tag}: {spec.shell()}")
    box = ServingContainer(docker, spec)
    box.start()
    try:
        box.wait_healthy(loaded.recipe.smoke.startup_timeout_s)
        log.ok(f"serving {loaded.recipe.launch.served_model_name} at {box.url}/v1 (container {spec.name})")
        if args.detach:
            log.info(f"stop it with: docker stop {spec.name}")
            box = None
            return 0
        log.info("streaming logs; Ctrl-C stops the container")
        for chunk in box.container.logs(stream=True, follow=True, since=0):
            log.console.out(chunk.decode(errors="replace"), end="", highlight=False)
        return 0
    except KeyboardInterrupt:
        log.info(f"stopping {spec.name}")
        return 130
    finally:
        if box is not None:
            box.stop()
            box.remove()
