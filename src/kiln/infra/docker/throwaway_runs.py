"""Throwaway containers: a script or command run in a container of an image, its answer
read, and the container removed in every case."""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any, TypeVar

import docker
import docker.errors
from docker.models.containers import Container as _SDKContainer

from kiln.basics import log
from kiln.basics.documents import Shape
from kiln.basics.errors import BuildFailed
from kiln.infra.docker.containers import ExecResult
from kiln.infra.docker.faults import _FAULTS, DockerError, _daemon, fault_text, timed_out

_T = TypeVar("_T")


def run_script(
    client: docker.DockerClient,
    image_id: str,
    script: str,
    *,
    marker: str,
    answer: Shape[_T],
    what: str,
    timeout_s: float,
    env: dict[str, str] | None = None,
    cause: str = "",
    user: str | None = None,
    mounts: dict[str, tuple[str, bool]] | None = None,
) -> _T:
    """Run `python -c script` in a throwaway, network-less container of `image_id` and
    return the JSON the script printed after `marker ` on one line of its output, checked
    against `answer`, the type the script writes (as `user` when given, else the image's
    own USER). `mounts`: host folder -> (its path in the container, writable). BuildFailed
    (`what` names the job) when it does not finish, fails, prints no such line or one
    that is not that type (naming the field): what a built image reports about itself
    must be read, never guessed."""
    as_user: dict[str, Any] = {"user": user} if user is not None else {}
    if mounts:
        as_user["volumes"] = {host: {"bind": at, "mode": "rw" if rw else "ro"} for host, (at, rw) in mounts.items()}
    status, output = _throwaway(
        client,
        what,
        timeout_s,
        image=image_id,
        entrypoint=["python", "-c", script],
        network_disabled=True,
        detach=True,
        environment=env or {},
        **as_user,
    )
    prefix = f"{marker} "
    line = next((ln for ln in output.splitlines() if ln.startswith(prefix)), None)
    if status != 0 or line is None:
        tail = " | ".join(output.strip().splitlines()[-3:]) or "no output"
        raise BuildFailed(f"{what} failed{cause}: {tail}")
    return answer.parse(line.removeprefix(prefix), source=f"{what}: its answer", error=BuildFailed)


def run_command(
    client: docker.DockerClient,
    image: str,
    argv: list[str],
    *,
    timeout_s: float,
    name_prefix: str = "kiln-",
) -> ExecResult:
    """Run `argv` in a throwaway container of `image` (with network: e.g. apt's
    package lists) and return its exit status and output; the container is removed."""
    status, output = _throwaway(
        client,
        f"{' '.join(argv[:3])} in {image}",
        timeout_s,
        image=image,
        entrypoint=argv[:1],
        command=argv[1:],
        detach=True,
        name=f"{name_prefix}{os.getpid()}-{int(time.time() * 1000) % 10**8}",
    )
    return ExecResult(status, output)


def _throwaway(client: docker.DockerClient, what: str, timeout_s: float, **create: Any) -> tuple[int, str]:
    """Create, start and wait for a container (`create`: the SDK's keywords); its exit
    status and output. BuildFailed naming `what` when the daemon fails any of that
    (the answer cannot be trusted) or it runs past `timeout_s`. The container is
    removed in every case; when even that fails, a warning names it."""
    with _daemon(f"{what}: creating its container", error=BuildFailed):
        container = client.containers.create(**create)
    try:
        container.start()
        status = container.wait(timeout=timeout_s)
        output = container.logs().decode(errors="replace")
    except _FAULTS as exc:
        if timed_out(exc):
            raise BuildFailed(
                f"{what} did not finish within {timeout_s:.0f} s",
                hint="the host may be loaded (other builds); rerun when it is quieter",
            ) from None
        raise BuildFailed(f"{what} did not finish: {fault_text(exc)}") from exc
    finally:
        _discard(container)
    return int(status.get("StatusCode", 1)), output


def _discard(container: _SDKContainer) -> None:
    """Remove a throwaway container, best effort: its result is already read, so a
    daemon fault here is a warning naming what is left, not the command's failure."""
    name = container.name or container.short_id
    try:
        with _daemon(f"removing container {name}"), contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)
    except DockerError as exc:
        log.warn(f"{exc.message}; it is left behind: `docker rm -f {name}`")
