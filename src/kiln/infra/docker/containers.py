"""Containers, in kiln terms: one the daemon holds (`Container`) and what a command run
in one ended with (`ExecResult`)."""

from __future__ import annotations

import contextlib
import shlex
import time
from collections.abc import Iterator
from typing import Literal, NamedTuple

import docker.errors
from docker.models.containers import Container as _SDKContainer

from kiln.basics.errors import KilnError, ServerExited
from kiln.infra.docker.faults import DockerError, _daemon, required

# how long a cut-short exec waits for its container's state to say it stopped
_EXEC_GRACE_S = 5.0

# `docker logs --tail`: a line count or "all"
LogTail = int | Literal["all"]


# `sh -c SCRIPT sh CMD...`: runs CMD as given ("$@"), then one line with its exit status;
# the marker's leading newline is the shell's, so the command's own output stays as it was
_END = b"\nKILN-EXEC-END "
_END_MARKED = ["/bin/sh", "-c", '"$@"; status=$?; printf "\\nKILN-EXEC-END %s\\n" "$status"; exit "$status"', "sh"]


class ExecResult(NamedTuple):
    """What a command run in a container (`docker exec`) ended with."""

    exit_code: int
    output: str  # stdout and stderr together, decoded


class Container:
    """One container, in kiln terms. A container that is already gone (AutoRemove may
    delete it at any moment) reads as gone instead of raising the SDK's NotFound."""

    def __init__(self, sdk: _SDKContainer) -> None:
        self._sdk = sdk

    @property
    def id(self) -> str:
        """The container's id."""
        return required(self._sdk.id, "container id")

    @property
    def name(self) -> str:
        """The container's name."""
        return required(self._sdk.name, "container name")

    @property
    def labels(self) -> dict[str, str]:
        """The container's labels."""
        return self._sdk.labels or {}

    @property
    def status(self) -> str:
        """The state as last read (`refresh` reads it again)."""
        return self._sdk.status

    @property
    def health(self) -> str:
        """The HEALTHCHECK status, "-" for an image without one."""
        return str(((self._sdk.attrs.get("State") or {}).get("Health") or {}).get("Status", "-"))

    def publishes(self, host_port: int) -> bool:
        """True when this container publishes `host_port` on the host."""
        bindings = (self._sdk.attrs.get("HostConfig") or {}).get("PortBindings") or {}
        return any(str(b.get("HostPort")) == str(host_port) for binds in bindings.values() for b in binds or [])

    def refresh(self) -> str:
        """The current state, "removed" once the container no longer exists."""
        with _daemon(f"reading the state of container {self.name}"):
            try:
                self._sdk.reload()
            except docker.errors.NotFound:
                return "removed"
        return self._sdk.status

    def start(self) -> None:
        """Start the container."""
        with _daemon(f"starting container {self.name}"):
            self._sdk.start()

    def logs(self, tail: LogTail = "all") -> bytes | None:
        """The last `tail` lines of its log; None once it is gone (removed, or being
        removed: the daemon's 409); DockerError when the daemon fails otherwise."""
        with _daemon(f"reading the log of container {self.name}"):
            try:
                return self._sdk.logs(tail=tail)
            except docker.errors.APIError as exc:
                if exc.status_code in (404, 409):
                    return None
                raise

    def follow_logs(self, tail: LogTail = "all") -> Iterator[bytes]:
        """Its log as it is written, until the container stops or is removed. DockerError
        when the stream breaks, or ends while the container still runs (a daemon that
        dropped the stream; the container's own end also ends it)."""
        doing = f"following the log of container {self.name}"
        with _daemon(doing):
            try:
                yield from self._sdk.logs(stream=True, follow=True, tail=tail)
            except docker.errors.NotFound:  # removed before (or while) the stream attached
                return
        if self._still_running(grace_s=5):
            raise DockerError(f"{doing}: the Docker daemon ended the log stream while the container still runs")

    def _still_running(self, grace_s: float) -> bool:
        """Still running after `grace_s` (the stream of a stopping container can end a
        moment before its state says so)."""
        deadline = time.monotonic() + grace_s
        while self.refresh() == "running":
            if time.monotonic() > deadline:
                return True
            time.sleep(0.2)
        return False

    def wait_gone(self, condition: Literal["removed", "not-running"]) -> int | None:
        """Block until the container is `condition`; its exit code, None when it was gone
        before the wait was registered."""
        try:
            return required(self._sdk.client, "client").api.wait(self.id, condition=condition).get("StatusCode")
        except Exception:  # gone before the wait was registered: nothing to report  # noqa: BLE001
            return None

    def exec(self, cmd: list[str]) -> ExecResult:
        """`cmd` run in the container (through its /bin/sh, which prints an end marker
        after it): its exit code and whole output. A stream the daemon ended early is
        DockerError, never a shorter output: when the command had already exited, the
        exit code alone cannot tell, the missing marker does. When the container itself
        stopped meanwhile (its exit ends every exec in it), ServerExited says so: that is
        the container's fault, not the daemon's."""
        doing = f"running `{shlex.join(cmd)[:80]}` in container {self.name}"
        try:
            with _daemon(doing):
                res = self._sdk.exec_run([*_END_MARKED, *cmd], demux=False, stream=False)
        except DockerError as failed:
            raise self._exited_instead(doing, failed) from failed
        if res.exit_code is None:  # still running: its output stream ended early
            raise self._exited_instead(
                doing,
                DockerError(f"{doing}: the Docker daemon ended its output before it exited (no exit code)"),
            )
        output = res.output if isinstance(res.output, bytes) else b""  # not streamed: bytes or None
        body, marker, status = output.rpartition(_END)
        if not marker or status.strip() != str(res.exit_code).encode():
            raise self._exited_instead(
                doing, DockerError(f"{doing}: the Docker daemon ended its output before the command's end")
            )
        return ExecResult(res.exit_code, body.decode(errors="replace"))

    def _exited_instead(self, doing: str, failed: DockerError) -> KilnError:
        """`failed`, unless the container is no longer running: then ServerExited (an
        exec into a container that stops is cut short or refused by a healthy daemon)."""
        try:
            if self._still_running(grace_s=_EXEC_GRACE_S):
                return failed
            state = self.refresh()
        except DockerError:  # the daemon fails this too: its fault stands
            return failed
        return ServerExited(f"{doing}: the container stopped before the command's end (now {state})")

    def stop(self, timeout: int) -> None:
        """SIGTERM, SIGKILL after `timeout`. Every caller removes the container next; so
        when the daemon fails the stop, the container is removed with force here, and the
        DockerError raised says whether that worked and what is left to do."""
        try:
            with _daemon(f"stopping container {self.name}"), contextlib.suppress(docker.errors.NotFound):
                self._sdk.stop(timeout=timeout)
        except DockerError as failed:
            raise self._removed_instead(failed) from failed

    def _removed_instead(self, failed: DockerError) -> DockerError:
        """`failed` (a stop), after a best-effort forced removal, saying how that went."""
        try:
            with _daemon("removing it with force"):
                try:
                    self._sdk.remove(force=True)
                except docker.errors.NotFound:
                    pass
                except docker.errors.APIError as exc:
                    if exc.status_code != 409:  # 409: AutoRemove is removing it already
                        raise
        except DockerError as also:
            return DockerError(
                f"{failed.message}; {also.message}",
                hint=f"`docker rm -f {self.name}` once `docker info` answers normally",
            )
        return DockerError(
            f"{failed.message}; kiln removed the container with force instead",
            hint="nothing of it is left; the daemon's log (`journalctl -u docker`) says why the stop failed",
        )
