"""ServingContainer: start a kiln image, wait for vLLM's /health, always clean up."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import time
import urllib.error
import urllib.request

import docker.errors

from . import log
from .dockerengine import DockerEngine
from .errors import ContainerStartFailed, ModelPathMissing, NoGPU, PortInUse
from .launch import RunSpec, model_mounts
from .recipe import LoadedRecipe


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def health_ok(base_url: str) -> bool:
    """True when vLLM's /health under `base_url` answers 200."""
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_for_health(base_url: str, timeout_s: float) -> float:
    """Seconds until /health answered 200 (plain polling, for callers that started the
    container themselves); TimeoutError after `timeout_s`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if health_ok(base_url):
            return time.monotonic() - t0
        time.sleep(0.25)
    raise TimeoutError(f"no 200 from {base_url}/health after {timeout_s:.0f} s")


def ensure_port_free(host: str, port: int) -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host or "0.0.0.0", port))
        except OSError:
            raise PortInUse(f"port {port} on {host or '0.0.0.0'} is already in use") from None


def gpu_visible() -> bool:
    if os.environ.get("KILN_ASSUME_GPU") == "1":
        return True
    return shutil.which("nvidia-smi") is not None and os.system("nvidia-smi -L >/dev/null 2>&1") == 0


def run_spec(loaded: LoadedRecipe, image: str, *, host_port: int, host_ip: str = "",
             extra_args: list[str] | None = None, detach: bool = False) -> RunSpec:
    recipe = loaded.recipe
    return RunSpec(
        image=image,
        name=f"kiln-{recipe.name}-{secrets.token_hex(3)}",
        host_port=host_port,
        container_port=recipe.launch.port,
        host_ip=host_ip,
        flavour=recipe.engine.flavour,
        mounts=model_mounts(recipe),
        env=_explicit_env(loaded),
        extra_args=list(extra_args or []),
        detach=detach,
    )


def _explicit_env(loaded: LoadedRecipe) -> dict[str, str]:
    """The launch env (also baked into the image), spelled out on the command line so a
    printed `docker run` says exactly what the server gets."""
    from .launch import launch_document

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
        if not os.path.isdir(host):
            raise ModelPathMissing(f"{loaded.where('model')}: model host path {host} (for {inside}) does not exist")
    ensure_port_free(spec.host_ip, spec.host_port)


class ServingContainer:
    def __init__(self, docker: DockerEngine, spec: RunSpec):
        self.docker = docker
        self.spec = spec
        self.container = None

    def start(self) -> None:
        try:
            self.container = self.docker.client.containers.run(**self.spec.sdk_kwargs())
        except docker.errors.APIError as exc:
            self.remove()
            text = getattr(exc, "explanation", None) or str(exc)
            if "port is already allocated" in str(text) or "address already in use" in str(text):
                raise PortInUse(f"port {self.spec.host_port} is already in use") from None
            raise ContainerStartFailed(f"docker could not start {self.spec.image}: {' '.join(str(text).split())[:300]}") from None

    @property
    def url(self) -> str:
        return f"http://{self.spec.host_ip or '127.0.0.1'}:{self.spec.host_port}"

    def logs(self, tail: int = 100) -> str:
        if self.container is None:
            return ""
        try:
            return self.container.logs(tail=tail).decode(errors="replace")
        except docker.errors.APIError:
            return ""

    def status(self) -> str:
        try:
            self.container.reload()
            return self.container.status
        except docker.errors.NotFound:
            return "removed"

    def wait_healthy(self, timeout_s: float) -> float:
        """Seconds until /health answered 200; ContainerStartFailed if it exits or times out."""
        t0 = time.monotonic()
        last_line = ""
        with log.console.status(f"waiting for {self.url}/health") as status:
            while True:
                elapsed = time.monotonic() - t0
                state = self.status()
                if state in ("exited", "dead", "removed"):
                    self._dump_logs()
                    code = self.container.attrs.get("State", {}).get("ExitCode") if state != "removed" else "?"
                    raise ContainerStartFailed(f"container {self.spec.name} exited during start (exit code {code})")
                if health_ok(self.url):
                    log.ok(f"healthy after {elapsed:.1f} s: {self.url}")
                    return elapsed
                if elapsed > timeout_s:
                    self._dump_logs()
                    raise ContainerStartFailed(f"{self.spec.name} not healthy after {timeout_s:.0f} s")
                lines = [ln for ln in self.logs(tail=3).splitlines() if ln.strip()]
                if lines:
                    last_line = lines[-1][-110:]
                status.update(f"waiting for {self.url}/health  {elapsed:5.0f}s / {timeout_s:.0f}s  {last_line}")
                time.sleep(0.5)

    def _dump_logs(self, tail: int = 100) -> None:
        text = self.logs(tail=tail)
        if text:
            log.console.print(f"--- last {tail} lines of {self.spec.name} ---", markup=False)
            log.console.print(text.rstrip(), markup=False, highlight=False)
            log.console.print("---", markup=False)

    def exec(self, cmd: list[str]) -> tuple[int, str]:
        res = self.container.exec_run(cmd, demux=False)
        return res.exit_code, (res.output or b"").decode(errors="replace")

    def stop(self, timeout: int = 30) -> float:
        """Stop (SIGTERM, then SIGKILL after `timeout`); returns the seconds it took."""
        if self.container is None:
            return 0.0
        t0 = time.monotonic()
        try:
            self.container.stop(timeout=timeout)
        except docker.errors.NotFound:
            pass
        return time.monotonic() - t0

    def remove(self) -> None:
        name = self.spec.name
        try:
            self.docker.client.containers.get(name).remove(force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if "removal of container" not in str(exc):  # already being removed (--rm)
                raise

    def __enter__(self) -> ServingContainer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop(timeout=30)
        self.remove()
