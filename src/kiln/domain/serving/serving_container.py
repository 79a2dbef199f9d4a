"""ServingContainer: start a kiln image, wait for vLLM's /health, always clean up."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path
from typing import Literal, Self

from kiln.basics import log
from kiln.basics.errors import (
    ContainerStartFailed,
    HfSnapshotMissing,
    ModelPathMissing,
    NoGPU,
    PortInUse,
)
from kiln.basics.paths import host_hf_cache
from kiln.basics.progress import Activity
from kiln.domain.recipes.recipe import LoadedRecipe
from kiln.domain.serving.launch_command import (
    LABEL_RECIPE,
    LABEL_URL,
    RunSpec,
    hf_models,
    launch_document,
    model_mounts,
)
from kiln.infra.docker import Container, DockerDaemon, DockerError, ExecResult
from kiln.inimage.hf_cache import CONTAINER_CACHE, check_all


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now, picked by the system."""
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def health_ok(base_url: str) -> bool:
    """True when vLLM's /health under `base_url` answers 200."""
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=2) as resp:
            status: int = resp.status
            return status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def kiln_containers(docker: DockerDaemon, *, all_states: bool = False) -> list[Container]:
    """Containers that kiln started (by label), newest first."""
    return docker.containers(label=LABEL_RECIPE, all_states=all_states)


def _kiln_container_on_port(port: int, docker: DockerDaemon | None = None) -> Container | None:
    """The kiln container publishing host `port`, or None (also when no daemon answers)."""
    try:
        return next((box for box in kiln_containers(docker or DockerDaemon()) if box.publishes(port)), None)
    except Exception:  # best effort: it only improves an error message  # noqa: BLE001
        return None


def _port_in_use(host: str, port: int, docker: DockerDaemon | None = None) -> PortInUse:
    where = f"port {port} on {host or '0.0.0.0'}"
    box = _kiln_container_on_port(port, docker)
    if box is None:
        return PortInUse(f"{where} is already in use")
    recipe = box.labels.get(LABEL_RECIPE, "?")
    return PortInUse(
        f"{where} is already in use by kiln container {box.name} ({recipe})",
        hint=f"`kiln stop {box.name}`, or pick another port with --port",
    )


def _ensure_port_free(host: str, port: int) -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host or "0.0.0.0", port))
        except OSError:
            raise _port_in_use(host, port) from None


def gpu_visible() -> bool:
    """Whether this host has a GPU that containers can use (nvidia-smi lists one, or KILN_ASSUME_GPU=1)."""
    if os.environ.get("KILN_ASSUME_GPU") == "1":
        return True
    return (
        shutil.which("nvidia-smi") is not None
        # a fixed command line; the shell only redirects
        and os.system("nvidia-smi -L >/dev/null 2>&1") == 0  # noqa: S605
    )


def run_spec(
    loaded: LoadedRecipe,
    image: str,
    *,
    host_port: int,
    host_ip: str = "",
    extra_args: list[str] | None = None,
    detach: bool = False,
    env: dict[str, str] | None = None,
) -> RunSpec:
    """`env` (from `kiln run -e`) wins over the recipe's launch env."""
    recipe = loaded.recipe
    url = f"http://{host_ip or '127.0.0.1'}:{host_port}"
    return RunSpec(
        image=image,
        name=f"kiln-{recipe.name}-{secrets.token_hex(3)}",
        host_port=host_port,
        container_port=recipe.launch.port,
        host_ip=host_ip,
        flavour=recipe.engine.flavour,
        mounts=model_mounts(recipe, host_hf_cache()),
        env={**_explicit_env(loaded), **(env or {})},
        extra_args=list(extra_args or []),
        detach=detach,
        labels={LABEL_RECIPE: recipe.name, LABEL_URL: url},
    )


def _explicit_env(loaded: LoadedRecipe) -> dict[str, str]:
    """The launch env (also baked into the image), spelled out on the command line so a
    printed `docker run` says exactly what the server gets."""
    env = dict(launch_document(loaded)["env"])
    if not env.get("KILN_FEATURES"):
        env.pop("KILN_FEATURES", None)
    return env


def preflight(loaded: LoadedRecipe, spec: RunSpec) -> None:
    """Fail before docker does, with a clearer message."""
    # no GPU first: nothing else matters on a host that cannot run the recipe at all
    if spec.flavour == "cuda" and not gpu_visible():
        raise NoGPU(f"{loaded.recipe.name} is a CUDA recipe and no NVIDIA GPU is visible on this host")
    for host, inside in spec.mounts:
        if inside == CONTAINER_CACHE:
            continue  # a missing cache is reported below, naming what it should hold
        if not os.path.isdir(host):
            raise ModelPathMissing(f"{loaded.where('model')}: model host path {host} (for {inside}) does not exist")
    _hf_snapshots_ready(loaded, spec)
    if spec.host_port is not None:
        _ensure_port_free(spec.host_ip, spec.host_port)


def _hf_snapshots_ready(loaded: LoadedRecipe, spec: RunSpec) -> None:
    """Every pinned snapshot the recipe reads is complete in the cache the container gets
    (the server runs offline: a missing file would end in the hub client's stack trace)."""
    models = hf_models(loaded.recipe)
    cache = next((host for host, inside in spec.mounts if inside == CONTAINER_CACHE), None)
    if not models or cache is None:
        return
    problems = check_all(Path(cache), models)
    if problems:
        raise HfSnapshotMissing(
            [f"{loaded.where('model', p.model.role, 'revision')}: model.{p.model.role}: {p.line}" for p in problems]
        )


class ServingContainer:
    """One serving container. Started with AutoRemove (the printed `docker run --rm`), so
    its output is captured from the start: a container that dies is gone with its log."""

    def __init__(self, docker: DockerDaemon, spec: RunSpec) -> None:
        self.docker = docker
        self.spec = spec
        self.container: Container | None = None
        self.captured: deque[str] = deque(maxlen=5000)
        self.exit_code: int | None = None
        # seconds until it turned healthy, for reports: wait_healthy's own count, or what
        # the caller measured from an earlier start (several servers booting together)
        self.startup_s: float | None = None
        self._gone = threading.Event()

    def start(self) -> None:
        """Create and start the container; a port already taken is its own error."""
        try:
            self.container = self.docker.create_container(**self.spec.sdk_kwargs())
            self._watch_exit()
            self.container.start()
        except DockerError as exc:
            self.close(failing=True)  # a created container is removed; a fault doing it is a warning
            text = str(exc)
            busy = "port is already allocated" in text or "address already in use" in text
            if busy and self.spec.host_port is not None:
                raise _port_in_use(self.spec.host_ip, self.spec.host_port, self.docker) from None
            image = self.spec.image[:19] if self.spec.image.startswith("sha256:") else self.spec.image
            raise ContainerStartFailed(f"docker could not start {image}: {text[:300]}") from None
        threading.Thread(target=self._capture, daemon=True).start()

    def _watch_exit(self) -> None:
        """Record the exit code even when AutoRemove deletes the container right after."""
        condition: Literal["removed", "not-running"] = "removed" if self.spec.remove else "not-running"
        container = self.started

        def wait() -> None:
            self.exit_code = container.wait_gone(condition)
            self._gone.set()

        threading.Thread(target=wait, daemon=True).start()

    def wait_exited(self, timeout_s: float) -> int | None:
        """The exit code once the container is gone (None if unknown within `timeout_s`)."""
        self._gone.wait(timeout=timeout_s)
        return self.exit_code

    def _capture(self) -> None:
        try:
            pending = ""
            for chunk in self.started.follow_logs():
                pending += chunk.decode(errors="replace")
                *lines, pending = pending.split("\n")
                self.captured.extend(lines)
            if pending:
                self.captured.append(pending)
        except Exception:  # container gone mid-stream: keep what was read  # noqa: BLE001,S110
            pass

    @property
    def url(self) -> str:
        """The container's API address on the host."""
        return f"http://{self.spec.host_ip or '127.0.0.1'}:{self.spec.host_port}"

    def logs(self, tail: int = 100) -> str:
        """The last `tail` lines: from the daemon while the container exists (and the
        daemon gives them), else captured."""
        if self.container is None:
            return ""
        try:
            text = self.container.logs(tail=tail)
        except DockerError as exc:  # the captured lines still say what the server said
            log.debug(f"{exc.message}; showing the lines captured from its log stream")
            text = None
        if text is not None:
            return text.decode(errors="replace")
        lines = list(self.captured)[-tail:]
        return "\n".join(lines) + ("\n" if lines else "")

    @property
    def started(self) -> Container:
        """The container, which start() made (a call before it is kiln's own bug)."""
        if self.container is None:
            raise RuntimeError(f"{self.spec.name}: used before start()")
        return self.container

    def status(self) -> str:
        """The container's state as the daemon reports it now."""
        return self.started.refresh()

    def wait_healthy(self, timeout_s: float) -> float:
        """Seconds until /health answered 200; ContainerStartFailed if it exits or times out."""
        t0 = time.monotonic()
        last_line = ""
        with Activity(f"waiting for {self.url}/health") as activity:
            while True:
                elapsed = time.monotonic() - t0
                state = self.status()
                if state in ("exited", "dead", "removed"):
                    exit_code = self.wait_exited(5)  # and the log read to its end
                    time.sleep(0.2)
                    activity.stop()
                    self.dump_logs()
                    code = "?" if exit_code is None else exit_code
                    raise ContainerStartFailed(f"container {self.spec.name} exited during start (exit code {code})")
                if health_ok(self.url):
                    activity.stop()
                    log.ok(f"healthy after {elapsed:.1f} s: {self.url}")
                    self.startup_s = elapsed
                    return elapsed
                if elapsed > timeout_s:
                    activity.stop()
                    self.dump_logs()
                    raise ContainerStartFailed(f"{self.spec.name} not healthy after {timeout_s:.0f} s")
                lines = [ln for ln in list(self.captured)[-3:] if ln.strip()]
                if lines:
                    last_line = lines[-1][-110:]
                activity.update(f"(limit {timeout_s:.0f} s)  {last_line}")
                time.sleep(0.5)

    def dump_logs(self, tail: int = 100) -> None:
        """Print the last `tail` lines of the container's log."""
        text = self.logs(tail=tail)
        if text:
            log.console.print(f"--- last {tail} lines of {self.spec.name} ---", markup=False)
            log.console.print(text.rstrip(), markup=False, highlight=False)
            log.console.print("---", markup=False)

    def exec(self, cmd: list[str]) -> ExecResult:
        """Run a command in the container."""
        return self.started.exec(cmd)

    def stop(self, timeout: int = 30) -> float:
        """Stop (SIGTERM, then SIGKILL after `timeout`); returns the seconds it took.
        DockerError when the daemon fails the stop (the container is then removed with
        force, if the daemon lets it: `Container.stop`)."""
        if self.container is None:
            return 0.0
        t0 = time.monotonic()
        self.container.stop(timeout=timeout)
        return time.monotonic() - t0

    def remove(self) -> None:
        """Remove the container."""
        self.docker.remove_container(self.spec.name)

    def __enter__(self) -> Self:
        return self

    def close(self, *, failing: bool = False) -> None:
        """Stop and remove it. A daemon fault on the way is raised, unless another error
        is already on its way out (`failing`): then it is a warning, so that the error
        reported is the one that stopped the command, and the warning says what is left."""
        try:
            self.stop(timeout=30)
            self.remove()
        except DockerError as exc:
            if not failing:
                raise
            log.warn(f"{exc.message} ({exc.hint})")

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.close(failing=exc_type is not None)
