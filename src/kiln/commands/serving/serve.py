"""`kiln run NAME`: serve a built recipe image the way its flavour needs; `kiln ps`,
`kiln logs` and `kiln stop` for the containers it started (found by label)."""

from __future__ import annotations

import argparse
import re
import signal
import sys
from types import FrameType
from typing import NamedTuple, NoReturn

from kiln.basics import log
from kiln.basics.errors import (
    ContainerNotFound,
    DockerDaemonError,
    ImageNotBuilt,
    ServerExited,
    UsageError,
)
from kiln.commands.options import Subparsers
from kiln.domain.images.definitions import RecipeImage, local_image_for, resolve
from kiln.domain.recipes.recipe import LoadedRecipe
from kiln.domain.recipes.topology import Topology, effective
from kiln.domain.serving.launch_command import LABEL_RECIPE, LABEL_URL
from kiln.domain.serving.multi_node import node_specs, print_commands
from kiln.domain.serving.serving_container import (
    ServingContainer,
    kiln_containers,
    preflight,
    run_spec,
)
from kiln.infra.docker import Container, DockerDaemon, LogTail, id_of

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _ServedRef(NamedTuple):
    """What `docker run` is given for a recipe image."""

    ref: str  # the image id when built here, else its digest tag
    built: bool  # built on this host from the current inputs


def _image_ref(docker: DockerDaemon, recipe_image: RecipeImage) -> _ServedRef:
    img = local_image_for(docker, recipe_image.tag, recipe_image.digest)
    return _ServedRef(id_of(img), True) if img is not None else _ServedRef(recipe_image.tag, False)


def _image_ref_for_print(recipe_image: RecipeImage) -> _ServedRef:
    """`_image_ref` when a daemon answers; `--print` needs none, so any failure to reach
    one means only that the image cannot be looked up here."""
    try:
        docker = DockerDaemon()
        docker.ping()
    except Exception:  # any failure: no daemon to ask  # noqa: BLE001
        return _ServedRef(recipe_image.tag, False)
    return _image_ref(docker, recipe_image)


def _parse_env(pairs: list[str] | None) -> dict[str, str]:
    """`-e VAR=VALUE` options; a bare `VAR` is refused (docker would copy the host's)."""
    env: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not _ENV_NAME.match(key):
            raise UsageError(
                f"kiln run: -e {pair!r}: expected VAR=VALUE", hint="e.g. `kiln run NAME -e VLLM_LOGGING_LEVEL=DEBUG`"
            )
        env[key] = value
    return env


def _vllm_extra(args: argparse.Namespace) -> list[str]:
    extra = [a for a in (args.vllm_args or []) if a != "--"]
    for token in extra:
        if token in ("-e", "--env") or token.startswith("--env="):
            raise UsageError(
                f"kiln run: {token} after `--` would go to vLLM, not to the container",
                hint="put -e VAR=VALUE before the `--`",
            )
    return extra


def _sigterm_as_interrupt() -> None:
    """`kill PID` of a foreground `kiln run` cleans up like Ctrl-C does."""

    def handler(signum: int, frame: FrameType | None) -> NoReturn:  # signal.signal's handler signature  # noqa: ARG001
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def run(args: argparse.Namespace) -> int:
    """Serve the recipe's built image in a container kiln labels (or with --print only print the command)."""
    resolved = resolve(args.name)
    loaded, recipe_image = resolved.loaded, resolved.recipe_image
    extra = _vllm_extra(args)
    env = _parse_env(getattr(args, "env", None))
    port = args.port or loaded.recipe.launch.port

    topo = effective(loaded.recipe)
    if topo.multi_node:
        return _multi_node(args, loaded, recipe_image, topo, port=port, extra=extra, env=env)
    if args.print:
        ref, built = _image_ref_for_print(recipe_image)
        spec = run_spec(loaded, ref, host_port=port, extra_args=extra, env=env, detach=args.detach)
        print(spec.shell())
        if not built:
            log.warn(f"{recipe_image.tag} is not built on this host (`kiln build {args.name}`)")
        return 0
    # host-side problems (model paths, GPU, port) first: they need no daemon to explain
    preflight(loaded, run_spec(loaded, recipe_image.tag, host_port=port))
    docker = DockerDaemon()
    ref, built = _image_ref(docker, recipe_image)
    if not built:
        raise ImageNotBuilt(f"{recipe_image.tag} (from the current inputs of {args.name}) is not built")
    spec = run_spec(loaded, ref, host_port=port, extra_args=extra, env=env, detach=args.detach)
    log.step(f"starting {recipe_image.tag}: {spec.shell()}")
    if not args.detach:
        _sigterm_as_interrupt()
    box = ServingContainer(docker, spec)
    detached = False
    try:
        box.start()
        box.wait_healthy(loaded.recipe.smoke.startup_timeout_s)
        log.ok(f"serving {loaded.recipe.launch.served_model_name} at {box.url}/v1 (container {spec.name})")
        if args.detach:
            log.info(
                f"`kiln logs {spec.name}` shows its log; `kiln stop {spec.name}` (or docker stop) stops and removes it"
            )
            detached = True
            return 0
        log.info("streaming logs; Ctrl-C stops and removes the container")
        assert box.container is not None, "start() sets it"  # noqa: S101
        _stream(box.container)
        exit_code = box.wait_exited(10)
        if exit_code in (0, 143):  # stopped from outside (`kiln stop`, `docker stop`)
            log.info(f"{spec.name} was stopped (exit code {exit_code})")
            return 0
        box.dump_logs()
        code = "?" if exit_code is None else exit_code
        raise ServerExited(f"container {spec.name} exited while serving (exit code {code})")
    except KeyboardInterrupt:
        log.info(f"stopping {spec.name}")
        return 130
    finally:
        if not detached:  # Ctrl-C included: a daemon fault in the stop is the error then
            box.close(failing=sys.exc_info()[0] is not None)


def _multi_node(
    args: argparse.Namespace,
    loaded: LoadedRecipe,
    recipe_image: RecipeImage,
    topo: Topology,
    *,
    port: int,
    extra: list[str],
    env: dict[str, str],
) -> int:
    """A recipe spanning several nodes: `--print` shows each node's command (one host, a
    user-defined network; on real hosts use each host's network and the leader's address)."""
    if not args.print:
        raise UsageError(
            f"{args.name} spans {topo.nodes} nodes: `kiln run` serves one-node recipes",
            hint=f"`kiln run {args.name} --print` prints each node's command; `kiln render k8s "
            f"{args.name}` writes Kubernetes manifests; `kiln smoke {args.name}` (CPU) serves it "
            "across local containers",
        )
    ref, built = _image_ref_for_print(recipe_image)
    specs = node_specs(loaded, ref, topo, host_port=port, extra_args=extra, env=env)
    for spec in specs:
        spec.detach = args.detach
    print_commands(specs, topo)
    if not built:
        log.warn(f"{recipe_image.tag} is not built on this host (`kiln build {args.name}`)")
    return 0


def _print_log(chunk: bytes) -> None:
    """A server's log is the command's output (stdout, shown under --quiet too), as with `docker logs`."""
    sys.stdout.write(chunk.decode(errors="replace"))
    sys.stdout.flush()


def _stream(container: Container, tail: LogTail = "all") -> None:
    """Follow a container's log to stdout until it stops (or is removed)."""
    for chunk in container.follow_logs(tail=tail):
        _print_log(chunk)


# -- kiln ps / logs / stop ------------------------------------------------------------
def _ours(docker: DockerDaemon, name: str) -> Container:
    """The kiln container called `name` (or with that id prefix)."""
    box = docker.container(name)
    if box is None or LABEL_RECIPE not in box.labels:
        running = ", ".join(c.name for c in kiln_containers(docker)) or "none"
        raise ContainerNotFound(f"no kiln container {name!r} (running kiln containers: {running})")
    return box


def _of_recipe(docker: DockerDaemon, name: str) -> list[Container]:
    """Running containers kiln started for recipe `name` (so docs and scripts need not
    know the random container suffix)."""
    return [c for c in kiln_containers(docker) if c.labels.get(LABEL_RECIPE) == name]


def _one(docker: DockerDaemon, name: str) -> Container:
    """`name` as a container name, else as a recipe with exactly one running container."""
    boxes = _of_recipe(docker, name)
    if len(boxes) > 1 and name not in {b.name for b in boxes}:
        raise ContainerNotFound(
            f"recipe {name!r} has {len(boxes)} running kiln containers: {', '.join(b.name for b in boxes)}",
            hint="name one of them",
        )
    return boxes[0] if len(boxes) == 1 else _ours(docker, name)


def ps(args: argparse.Namespace) -> int:
    """List the containers kiln started (running ones, or all with --all)."""
    boxes = kiln_containers(DockerDaemon(), all_states=args.all)
    if not boxes:
        log.info("no kiln containers" + ("" if args.all else " running"))
        return 0
    rows = [(c.name, c.labels.get(LABEL_RECIPE, "?"), c.status, c.health, c.labels.get(LABEL_URL, "")) for c in boxes]
    widths = [max(len(r[i]) for r in [("NAME", "RECIPE", "STATUS", "HEALTH", "URL"), *rows]) for i in range(5)]
    for row in [("NAME", "RECIPE", "STATUS", "HEALTH", "URL"), *rows]:
        log.out.print(
            "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip(), markup=False, highlight=False
        )
    return 0


def logs(args: argparse.Namespace) -> int:
    """Print (or follow) one kiln container's log."""
    box = _one(DockerDaemon(), args.name)
    tail: LogTail = "all" if args.tail is None else args.tail
    try:
        if args.follow:
            _stream(box, tail)
        else:
            _print_log(box.logs(tail=tail) or b"")  # None: stopped (and auto-removed) while we read
    except KeyboardInterrupt:
        return 130
    return 0


def stop(args: argparse.Namespace) -> int:
    """Stop and remove the kiln containers named, or all of them."""
    docker = DockerDaemon()
    if args.all == bool(args.names):
        raise UsageError("kiln stop: name containers or pass --all, not both or neither", hint="`kiln ps` lists them")
    boxes = (
        kiln_containers(docker, all_states=True)
        if args.all
        else [b for n in args.names for b in (_of_recipe(docker, n) or [_ours(docker, n)])]
    )
    if not boxes:
        log.info("no kiln containers to stop")
    faults: list[DockerDaemonError] = []
    for box in boxes:
        try:
            box.stop(timeout=args.timeout)  # removes it with force when the daemon fails the stop
            docker.remove_container(box.name)
        except DockerDaemonError as exc:  # the others are still stopped; the last fault is the error
            if faults:
                log.warn(f"{faults[-1].message} ({faults[-1].hint})")
            faults.append(exc)
            continue
        log.ok(f"stopped and removed {box.name}")
    if faults:
        raise faults[-1]
    return 0


def register(sub: Subparsers) -> None:
    """`kiln run`, `ps`, `logs` and `stop`: one family, sharing how they find kiln's containers."""
    s = sub.add_parser(
        "run",
        help="serve a recipe's image (extra vLLM args after --)",
        usage="kiln run NAME [--print] [--port P] [--detach] [-e VAR=VALUE ...] [-- VLLM ARGS ...]",
    )
    s.add_argument("name")
    s.add_argument(
        "-e", "--env", action="append", metavar="VAR=VALUE", help="set a container env var (wins over the recipe's)"
    )
    s.add_argument("--print", action="store_true", help="only print the docker run command")
    s.add_argument("--port", type=int, default=None, help="host port (default: the recipe's port)")
    s.add_argument("--detach", action="store_true", help="return once healthy, leave it running")
    s.set_defaults(func=run)
    s = sub.add_parser("ps", help="containers kiln started")
    s.add_argument("-a", "--all", action="store_true", help="stopped ones too")
    s.set_defaults(func=ps)
    s = sub.add_parser("logs", help="a kiln container's log")
    s.add_argument("name", help="a container name from `kiln ps`, or a recipe with one running container")
    s.add_argument("-f", "--follow", action="store_true")
    s.add_argument("--tail", type=int, default=None, metavar="N", help="only the last N lines")
    s.set_defaults(func=logs)
    s = sub.add_parser("stop", help="stop and remove kiln containers")
    s.add_argument("names", nargs="*", metavar="NAME", help="container names, or recipes (all their containers)")
    s.add_argument("--all", action="store_true", help="every container kiln started")
    s.add_argument("--timeout", type=int, default=30, help="seconds before SIGKILL")
    s.set_defaults(func=stop)
