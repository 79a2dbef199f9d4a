"""The one place kiln talks to the Docker daemon (through the docker SDK).

Everything above this module speaks in kiln terms (build this context, does this tag
exist, run this container); the SDK's quirks and the legacy builder's stream format
stay here.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shlex
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal, NamedTuple, NoReturn, Protocol, TypeVar

import docker
import docker.auth
import docker.errors
import docker.utils.socket
import requests
import urllib3
from docker.models.containers import Container as _SDKContainer
from docker.models.images import Image as Image  # re-exported: command modules annotate with it

from kiln.basics import imageref, log
from kiln.basics.errors import (
    BaseImageMissing,
    BuildFailed,
    DockerDaemonError,
    DockerUnavailable,
    KilnError,
    PushFailed,
)
from kiln.basics.progress import Activity

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
_BUILT = re.compile(r"Successfully built ([0-9a-f]{12,64})")
# the legacy builder's own bookkeeping between a step's header and its output
_BOOKKEEPING = re.compile(r"^ ---> |^Removing intermediate container ")
# daemons that leave errorDetail.code out still end the message with the status
_RUN_STATUS = re.compile(r"returned a non-zero code: (\d+)")


class TarContext(Protocol):
    """A build context, as the daemon needs it: a tar stream (kiln's `context.BuildContext`)."""

    def write_tar(self, fileobj: IO[bytes]) -> None: ...


class BuildStep(NamedTuple):
    """One Dockerfile instruction of a build and what it cost."""

    instruction: str
    seconds: float
    cached: bool


@dataclass
class BuildResult:
    image_id: str
    steps: int = 0
    cached_steps: int = 0
    seconds: float = 0.0
    step_times: list[BuildStep] = field(default_factory=list)


class _BuildProgress:
    """Turns the legacy builder's JSON stream into readable step lines with timings; a
    long step's own output shows as live progress (`progress.Activity`), not a flood."""

    def __init__(self, label: str, activity: Activity, quiet: bool = False):
        self.label = label
        self.activity = activity
        self.quiet = quiet
        self.tail: deque[str] = deque(maxlen=40)
        self.step_tail: deque[str] = deque(maxlen=40)  # output of the current step only
        self.current: str | None = None
        self.current_cached = False
        self.t_step = time.monotonic()
        self.result = BuildResult(image_id="")

    def _close_step(self) -> None:
        if self.current is None:
            return
        dt = time.monotonic() - self.t_step
        self.result.step_times.append(BuildStep(self.current, dt, self.current_cached))
        if not self.quiet:
            tag = "cached" if self.current_cached else log.human_secs(dt)
            log.info(f"  [{tag}]")

    def feed(self, chunk: dict) -> None:
        if "error" in chunk or "errorDetail" in chunk:
            detail = chunk.get("errorDetail") or {}
            message = str(detail.get("message") or chunk.get("error", "")).strip()
            raise _StreamError(message, _run_status(detail.get("code"), message))
        if "aux" in chunk and isinstance(chunk["aux"], dict) and "ID" in chunk["aux"]:
            self.result.image_id = chunk["aux"]["ID"]
        if "status" in chunk:  # base image pull during FROM
            if not self.quiet:
                self.activity.update(f"pull: {chunk['status']} {chunk.get('progress', '')}".rstrip())
            return
        text = chunk.get("stream")
        if not text:
            return
        for line in _ANSI.sub("", text).splitlines():
            line = line.rstrip()
            if not line:
                continue
            m = _STEP.match(line)
            if m:
                self._close_step()
                self.current = line
                self.current_cached = False
                self.step_tail.clear()
                self.t_step = time.monotonic()
                self.result.steps = int(m.group(2))
                self.activity.restart(f"{self.label} step {m.group(1)}/{m.group(2)}")
                if not self.quiet:
                    log.console.print(f"[bold]{self.label}[/] {line[:160]}", markup=True, highlight=False)
                continue
            if "Using cache" in line:
                self.current_cached = True
                self.result.cached_steps += 1
                continue
            m = _BUILT.search(line)
            if m and not self.result.image_id:
                self.result.image_id = m.group(1)
            self.tail.append(line)
            bookkeeping = bool(_BOOKKEEPING.match(line))
            if not bookkeeping:
                self.step_tail.append(line)
            if self.quiet or line.startswith(" ---> "):
                continue
            if log.DEBUG:
                log.info(f"    {line[:200]}")
            elif not bookkeeping and not line.startswith("Successfully "):
                # long RUN steps (pip installs) stay visibly alive without flooding the log
                self.activity.update(line)


class _StreamError(Exception):
    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status  # exit status of a failed RUN step


class _DaemonGone(Exception):
    """The connection to the daemon broke while it streamed the build."""


def _run_status(code: object, message: str) -> int | None:
    """A failed RUN's exit status: errorDetail.code, else the number the message ends with."""
    if isinstance(code, int) and code > 0:
        return code
    m = _RUN_STATUS.search(message)
    return int(m.group(1)) if m else None


@dataclass
class PushResult:
    """What the daemon reported for one pushed tag."""

    digest: str = ""  # manifest digest the registry accepted
    size: int = 0
    layers_pushed: int = 0
    layers_existing: int = 0
    seconds: float = 0.0


class _PushProgress:
    """Turns the daemon's push stream into one line per finished layer plus progress
    with the bytes sent, so a multi-GB push is visibly alive without a line per chunk."""

    def __init__(self, activity: Activity, quiet: bool = False):
        self.activity = activity
        self.quiet = quiet
        self.sent: dict[str, tuple[int, int]] = {}  # layer id -> (current, total)
        self.result = PushResult()

    def feed(self, chunk: dict) -> None:
        if "error" in chunk or "errorDetail" in chunk:
            detail = (chunk.get("errorDetail") or {}).get("message") or chunk.get("error", "")
            raise _StreamError(str(detail).strip())
        aux = chunk.get("aux")
        if isinstance(aux, dict) and "Digest" in aux:
            self.result.digest, self.result.size = aux["Digest"], int(aux.get("Size") or 0)
            return
        status, layer = chunk.get("status", ""), chunk.get("id", "")
        if not layer:
            return
        if status == "Pushing":
            detail = chunk.get("progressDetail") or {}
            self.sent[layer] = (int(detail.get("current") or 0), int(detail.get("total") or 0))
            self._heartbeat()
        elif status == "Pushed":
            self.result.layers_pushed += 1
            self._say(f"  {layer} pushed")
        elif status.startswith(("Layer already exists", "Mounted from")):
            self.result.layers_existing += 1
            self._say(f"  {layer} {status[0].lower()}{status[1:]}")
        elif status.startswith("Retrying in"):
            # the daemon retries a failed layer upload itself (5 attempts, growing delay)
            self._say(f"  {layer} upload failed; {status[0].lower()}{status[1:]}", warn=True)

    def _heartbeat(self) -> None:
        if self.quiet:
            return
        done = sum(c for c, _ in self.sent.values())
        total = sum(t for _, t in self.sent.values())
        self.activity.update(f"{len(self.sent)} layers", done=done, total=total)

    def _say(self, line: str, warn: bool = False) -> None:
        if not self.quiet:
            (log.warn if warn else log.info)(line.strip() if warn else line)


class ExecResult(NamedTuple):
    """What a command run in a container (`docker exec`) ended with."""

    exit_code: int
    output: str  # stdout and stderr together, decoded


class DockerError(DockerDaemonError):
    """The daemon (or the SDK reading the docker config) refused a request; the message
    names what kiln was doing and quotes the daemon, on one line. Callers that know
    better turn it into their typed error (ContainerStartFailed, PortInUse); uncaught, it
    is the CLI's `kiln: error:` line with DockerDaemonError's exit code."""


# -- daemon faults ------------------------------------------------------------------------
# What the SDK and the HTTP layers under it raise when the daemon answers an error status,
# breaks the connection, or cuts a stream short: APIError (and the SDK's other
# exceptions); requests' ConnectionError/ChunkedEncodingError/ReadTimeout and its JSON
# error for a truncated answer; urllib3's and http.client's own when docker-py reads the
# raw response; docker-py's stream readers' StreamParseError (a JSON stream ending
# inside an object) and SocketError (a hijacked exec/attach socket closing mid-frame).
_FAULTS: tuple[type[BaseException], ...] = (
    docker.errors.DockerException, docker.errors.StreamParseError, docker.utils.socket.SocketError,
    requests.exceptions.RequestException, urllib3.exceptions.HTTPError, http.client.HTTPException,
    ConnectionError, json.JSONDecodeError,
)


def fault_text(exc: BaseException) -> str:
    """The daemon's own words for a fault (its JSON `message`), or what happened to the
    connection, on one line and without the request URL (it can hold a registry path)."""
    if isinstance(exc, docker.errors.APIError):
        said = exc.explanation or (exc.response.reason if exc.response is not None else "") or str(exc)
        status = exc.status_code if exc.status_code is not None else "an error"
        return f"the Docker daemon answered {status}: {_one_line(str(said))}"
    if _timed_out(exc):
        return "the Docker daemon did not answer in time"
    if isinstance(exc, (docker.errors.StreamParseError, json.JSONDecodeError, requests.exceptions.JSONDecodeError)):
        return f"the Docker daemon's answer was cut short ({_short(exc)})"
    if isinstance(exc, docker.errors.DockerException):
        return _short(exc)
    return f"the connection to the Docker daemon broke ({_innermost(exc)})"


def _innermost(exc: BaseException) -> str:
    """What the innermost of requests' and urllib3's wrapped exceptions says (they wrap
    each other in args: `(('Connection broken: IncompleteRead(...)', IncompleteRead(...)),)`)."""
    for _ in range(5):
        args = getattr(exc, "args", ())
        if args and isinstance(args[0], BaseException):
            exc = args[0]
        elif args and isinstance(args[0], str) and str(args[0]).strip():
            return _one_line(args[0])
        else:
            break
    return _short(exc) or type(exc).__name__


@contextmanager
def _daemon(doing: str, *, hint: str | None = None, error: type[KilnError] = DockerError) -> Iterator[None]:
    """Daemon calls inside raise `error` (DockerError unless the caller's own type, e.g.
    PushFailed) as one line, `doing: what the daemon said`, instead of an SDK exception.
    `doing` names the container, image or network; `hint` says what to do next."""
    try:
        yield
    except _FAULTS as exc:
        raise error(f"{doing}: {fault_text(exc)}", hint=hint) from exc


def daemon_fault(exc: BaseException) -> DockerError | None:
    """An SDK exception that escaped every `_daemon` scope, as the DockerError the CLI
    reports (naming the request), else None: the daemon's answers (APIError), docker-py's
    stream errors, and requests' errors for a request to the daemon. Anything else stays
    a bug report: the registry client also uses requests, and the SDK's other exceptions
    (an invalid argument) are kiln's own mistakes."""
    # requests' errors carry the request; the SDK's APIError only its response's
    request = getattr(exc, "request", None) or getattr(getattr(exc, "response", None), "request", None)
    url = str(getattr(request, "url", "") or "")
    to_daemon = isinstance(exc, requests.exceptions.RequestException) and url.startswith("http+docker://")
    streams = (docker.errors.StreamParseError, docker.utils.socket.SocketError)
    if not (isinstance(exc, docker.errors.APIError) or to_daemon or isinstance(exc, streams)):
        return None
    path = url.split("://", 1)[-1].partition("/")[2].partition("?")[0]
    doing = f"a Docker daemon request ({request.method} /{path})" if request is not None and path else "a Docker daemon request"
    return DockerError(f"{doing}: {fault_text(exc)}")


_T = TypeVar("_T")
# `docker logs --tail`: a line count or "all"
LogTail = int | Literal["all"]


class Container:
    """One container, in kiln terms. A container that is already gone (AutoRemove may
    delete it at any moment) reads as gone instead of raising the SDK's NotFound."""

    def __init__(self, sdk: _SDKContainer):
        self._sdk = sdk

    @property
    def id(self) -> str:
        return _required(self._sdk.id, "container id")

    @property
    def name(self) -> str:
        return _required(self._sdk.name, "container name")

    @property
    def labels(self) -> dict[str, str]:
        return self._sdk.labels or {}

    @property
    def status(self) -> str:
        """The state as last read (`refresh` reads it again)."""
        return self._sdk.status

    @property
    def health(self) -> str:
        """The HEALTHCHECK status, "-" for an image without one."""
        return ((self._sdk.attrs.get("State") or {}).get("Health") or {}).get("Status", "-")

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
            return _required(self._sdk.client, "client").api.wait(self.id, condition=condition).get("StatusCode")
        except Exception:  # gone before the wait was registered: nothing to report
            return None

    def exec(self, cmd: list[str]) -> ExecResult:
        doing = f"running `{shlex.join(cmd)[:80]}` in container {self.name}"
        with _daemon(doing):
            res = self._sdk.exec_run(cmd, demux=False, stream=False)
        if res.exit_code is None:  # still running: its output stream ended early
            raise DockerError(f"{doing}: the Docker daemon ended its output before it exited (no exit code)")
        output = res.output if isinstance(res.output, bytes) else b""  # not streamed: bytes or None
        return ExecResult(res.exit_code, output.decode(errors="replace"))

    def stop(self, timeout: int) -> None:
        """SIGTERM, SIGKILL after `timeout`. Every caller removes the container next; so
        when the daemon fails the stop, the container is removed with force here, and the
        DockerError raised says whether that worked and what is left to do."""
        try:
            with _daemon(f"stopping container {self.name}"):
                try:
                    self._sdk.stop(timeout=timeout)
                except docker.errors.NotFound:
                    pass
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
            return DockerError(f"{failed.message}; {also.message}",
                               hint=f"`docker rm -f {self.name}` once `docker info` answers normally")
        return DockerError(f"{failed.message}; kiln removed the container with force instead",
                           hint="nothing of it is left; the daemon's log (`journalctl -u docker`) says why the stop failed")


class DockerDaemon:
    """A small facade over the local Docker daemon."""

    def __init__(self, client: docker.DockerClient | None = None):
        self._client = client

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            try:
                self._client = docker.from_env(timeout=600)
                self._client.ping()
            except Exception as exc:  # the SDK raises several unrelated types here
                raise DockerUnavailable(f"cannot reach the Docker daemon: {_short(exc)}") from None
        return self._client

    def ping(self) -> str:
        client = self.client
        with _daemon("asking the Docker daemon its version"):
            return client.version().get("Version", "?")

    # -- images -------------------------------------------------------------
    def image(self, ref: str) -> Image | None:
        """The local image `ref` names, None when there is none (the daemon's 404)."""
        client = self.client
        with _daemon(f"looking up image {ref[:100]}"):
            try:
                return client.images.get(ref)
            except docker.errors.NotFound:  # ImageNotFound, or a 404 the SDK did not classify
                return None

    def ensure_base(self, ref: str, *, pull: bool,
                    auth: Callable[[str], dict | None] | None = None) -> Image:
        """The local image `ref`, pulled first when allowed; `auth(registry host)` gives the
        credentials for that pull (asked only when a pull happens)."""
        img = self.image(ref)
        if img is not None:
            return img
        if not pull:
            raise BaseImageMissing(f"base image {ref} is not present locally")
        log.step(f"pulling {ref}")
        parts = imageref.parse(ref)
        # by digest: the whole reference is the name, and no tag may be passed beside it
        repo, tag = (ref, None) if parts.digest else (parts.name, parts.tag)
        auth_config = auth(registry_of(parts.name)) if auth else None
        t0 = time.monotonic()
        layers: dict[str, tuple[int, int]] = {}  # layer id -> (bytes done, bytes total)
        # the registry's refusal (an APIError, or an error in the stream) means the base is
        # missing; a broken connection or a daemon fault is the daemon's (DockerError)
        with _daemon(f"pulling {ref}"):
            try:
                with Activity(f"pulling {ref}", unit_bytes=True) as activity:
                    for chunk in self.client.api.pull(repo, tag=tag, stream=True, decode=True,
                                                     auth_config=auth_config):
                        if "error" in chunk or "errorDetail" in chunk:
                            said = (chunk.get("errorDetail") or {}).get("message") or chunk.get("error", "")
                            raise BaseImageMissing(f"base image {ref} is not local and could not be pulled: "
                                                   f"{_one_line(str(said))}")
                        if "status" not in chunk:
                            continue
                        detail = chunk.get("progressDetail") or {}
                        if chunk.get("id") and detail.get("total"):
                            layers[chunk["id"]] = (int(detail.get("current") or 0), int(detail["total"]))
                        if log.DEBUG:
                            log.info(f"  pull {chunk.get('id', '')} {chunk['status']} {chunk.get('progress', '')}")
                        activity.update(f"{chunk.get('id', '')} {chunk['status']}",
                                        done=sum(c for c, _ in layers.values()),
                                        total=sum(t for _, t in layers.values()))
                img = self.client.images.get(ref)
            except docker.errors.APIError as exc:
                raise BaseImageMissing(f"base image {ref} is not local and could not be pulled: "
                                       f"{fault_text(exc)}") from None
        log.ok(f"pulled {ref} in {log.human_secs(time.monotonic() - t0)}")
        return img

    def tag(self, image_id: str, ref: str) -> None:
        repo, tag = _name_and_tag(ref)
        with _daemon(f"tagging {image_id[:19]} as {ref}"):
            tagged = self.client.api.tag(image_id, repo, tag, force=True)
        if not tagged:
            raise BuildFailed(f"could not tag {image_id[:19]} as {ref}")

    def require_image(self, ref: str) -> Image:
        """The image `ref` names, which the caller just built or tagged."""
        img = self.image(ref)
        if img is None:
            raise BuildFailed(f"image {ref[:71]} vanished from the daemon right after it was made")
        return img

    def images(self, *, label: str | None = None, name: str | None = None) -> list[Image]:
        """Local images carrying `label` (a key, or key=value) and/or in repository `name`."""
        with _daemon(f"listing images{f' labelled {label}' if label else ''}{f' of {name}' if name else ''}"):
            return self.client.images.list(name=name, filters={"label": label} if label else None)

    def remove_image(self, ref: str) -> bool:
        """False when the daemon refuses because other repositories still reference the
        image (409: pushed or pulled by digest elsewhere); those names are not kiln's."""
        with _daemon(f"removing image {ref}", hint=f"`docker rmi {ref}` once `docker info` answers normally"):
            try:
                self.client.images.remove(ref, noprune=False)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                if exc.status_code == 409 and "multiple repositories" in str(exc):
                    return False
                raise
        return True

    def import_rootfs(self, tarball: Path, ref: str | None, changes: list[str]) -> Image | None:
        """`docker import` of a root filesystem tarball as `ref` (None: untagged), with
        Dockerfile `changes`."""
        repo, tag = _name_and_tag(ref) if ref is not None else (None, None)
        with tarball.open("rb") as fh, _daemon(f"importing {tarball.name} as {ref or 'an untagged image'}"):
            resp = self.client.api.import_image(src=fh, repository=repo, tag=tag, changes=changes)
        log.debug(f"docker import: {str(resp)[:200]}")
        if ref is None:
            found = re.search(r"sha256:[0-9a-f]{64}", str(resp))
            return self.image(found.group(0)) if found else None
        return self.image(ref)

    def save(self, image_id: str) -> Iterator[bytes]:
        """`docker save` of one image, as a stream of chunks; BuildFailed when the daemon
        fails it or the stream breaks (callers retry that)."""
        with _daemon(f"docker save of {image_id[:19]} failed", error=BuildFailed):
            yield from self.client.api.get_image(image_id, chunk_size=1 << 20)

    def load(self, archive: Iterable[bytes]) -> str:
        """`docker load` of a tar (streamed: chunked upload) holding one untagged image;
        its id as the daemon reports it."""
        with _daemon("docker load failed", error=BuildFailed):
            out = list(self.client.api.load_image(archive))
        for chunk in out:
            text = str(chunk.get("stream", "")) if isinstance(chunk, dict) else ""
            if "error" in (chunk if isinstance(chunk, dict) else {}):
                raise BuildFailed(f"docker load failed: {_one_line(str(chunk['error']))}")
            if text.startswith("Loaded image ID: "):
                return text.removeprefix("Loaded image ID: ").strip()
        raise BuildFailed(f"docker load reported no image id: {_one_line(str(out)[:200])}")

    def run_script(self, image_id: str, script: str, *, marker: str, what: str, timeout_s: float,
                   env: dict[str, str] | None = None, cause: str = "", user: str | None = None) -> dict:
        """Run `python -c script` in a throwaway, network-less container of `image_id` and
        return the JSON the script printed after `marker ` on one line of its output
        (as `user` when given, else the image's own USER).
        BuildFailed (`what` names the job) when it does not finish, fails or prints no
        such line: what a built image reports about itself must be read, never guessed."""
        as_user: dict[str, Any] = {"user": user} if user is not None else {}
        status, output = self._throwaway(what, timeout_s, image=image_id, entrypoint=["python", "-c", script],
                                         network_disabled=True, detach=True, environment=env or {}, **as_user)
        prefix = f"{marker} "
        line = next((ln for ln in output.splitlines() if ln.startswith(prefix)), None)
        if status != 0 or line is None:
            tail = " | ".join(output.strip().splitlines()[-3:]) or "no output"
            raise BuildFailed(f"{what} failed{cause}: {tail}")
        return json.loads(line.removeprefix(prefix))

    def run_command(self, image: str, argv: list[str], *, timeout_s: float, name_prefix: str = "kiln-") -> ExecResult:
        """Run `argv` in a throwaway container of `image` (with network: e.g. apt's
        package lists) and return its exit status and output; the container is removed."""
        status, output = self._throwaway(
            f"{' '.join(argv[:3])} in {image}", timeout_s, image=image, entrypoint=argv[:1], command=argv[1:],
            detach=True, name=f"{name_prefix}{os.getpid()}-{int(time.time() * 1000) % 10**8}")
        return ExecResult(status, output)

    def _throwaway(self, what: str, timeout_s: float, **create: Any) -> tuple[int, str]:
        """Create, start and wait for a container (`create`: the SDK's keywords); its exit
        status and output. BuildFailed naming `what` when the daemon fails any of that
        (the answer cannot be trusted) or it runs past `timeout_s`. The container is
        removed in every case; when even that fails, a warning names it."""
        with _daemon(f"{what}: creating its container", error=BuildFailed):
            container = self.client.containers.create(**create)
        try:
            container.start()
            status = container.wait(timeout=timeout_s)
            output = container.logs().decode(errors="replace")
        except _FAULTS as exc:
            if _timed_out(exc):
                raise BuildFailed(f"{what} did not finish within {timeout_s:.0f} s",
                                  hint="the host may be loaded (other builds); rerun when it is quieter") from None
            raise BuildFailed(f"{what} did not finish: {fault_text(exc)}") from exc
        finally:
            self._discard(container)
        return int(status.get("StatusCode", 1)), output

    def _discard(self, container: _SDKContainer) -> None:
        """Remove a throwaway container, best effort: its result is already read, so a
        daemon fault here is a warning naming what is left, not the command's failure."""
        name = container.name or container.short_id
        try:
            with _daemon(f"removing container {name}"):
                try:
                    container.remove(force=True)
                except docker.errors.NotFound:
                    pass
        except DockerError as exc:
            log.warn(f"{exc.message}; it is left behind: `docker rm -f {name}`")

    # -- containers ---------------------------------------------------------
    def containers(self, *, label: str, all_states: bool = False) -> list[Container]:
        """Containers carrying `label` (running ones only unless `all_states`), newest first."""
        with _daemon(f"listing the containers labelled {label}"):
            # ignore_removed: an AutoRemove container may go between the list and its inspect
            found = self.client.containers.list(all=all_states, filters={"label": label}, ignore_removed=True)
        return [Container(c) for c in found]

    def container(self, name: str) -> Container | None:
        """The container called `name` (or with that id prefix), None when there is none."""
        with _daemon(f"looking up container {name}"):
            try:
                return Container(self.client.containers.get(name))
            except docker.errors.NotFound:
                return None

    def create_container(self, **sdk_kwargs: Any) -> Container:
        """A created (not started) container; `sdk_kwargs` as `RunSpec.sdk_kwargs()` spells them."""
        with _daemon(f"creating container {sdk_kwargs.get('name') or 'from ' + str(sdk_kwargs.get('image'))[:80]}"):
            return Container(self.client.containers.create(**sdk_kwargs))

    def remove_container(self, name: str, timeout_s: float = 30) -> None:
        """Remove `name` if it still exists and return once it is gone: AutoRemove may be
        deleting it already, and a caller that lists containers next must not see it."""
        api = self.client.api
        with _daemon(f"removing container {name}", hint=f"`docker rm -f {name}` once `docker info` answers normally"):
            failed: docker.errors.APIError | None = None
            try:
                # by name, no inspect first: the one request that must work for nothing to be left
                api.remove_container(name, force=True)
            except docker.errors.NotFound:
                return
            except docker.errors.APIError as exc:
                in_progress = "removal of container" in str(exc) or "is already in progress" in str(exc)
                if not in_progress:
                    if not self._removes_itself(name):
                        raise
                    failed = exc  # reported only if AutoRemove does not finish the job
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if self._container_gone(name):
                    return
                time.sleep(0.2)
            if failed is not None:
                raise failed

    def _container_gone(self, name: str) -> bool:
        try:
            self.client.api.inspect_container(name)
        except docker.errors.NotFound:
            return True
        return False

    def _removes_itself(self, name: str) -> bool:
        """Gone, or stopped with AutoRemove (the daemon deletes it in a moment)."""
        try:
            attrs = self.client.api.inspect_container(name)
        except docker.errors.NotFound:
            return True
        auto = bool((attrs.get("HostConfig") or {}).get("AutoRemove"))
        return auto and not (attrs.get("State") or {}).get("Running")

    def create_network(self, name: str, *, labels: dict[str, str]) -> None:
        """A user-defined bridge network: containers on it resolve each other by name."""
        with _daemon(f"creating network {name}"):
            self.client.networks.create(name, driver="bridge", labels=labels)

    def remove_network(self, name: str, timeout_s: float = 10) -> None:
        """Remove network `name` if it exists; retried while auto-removed containers are
        still being detached from it (the daemon does that asynchronously)."""
        deadline = time.monotonic() + timeout_s
        with _daemon(f"removing network {name}", hint=f"`docker network rm {name}` once its containers are gone"):
            while True:
                try:
                    self.client.api.remove_network(name)
                    return
                except docker.errors.NotFound:
                    return
                except docker.errors.APIError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)

    def push(self, ref: str, *, auth_config: dict | None = None, quiet: bool = False) -> PushResult:
        """Push one local tag (layers, then the manifest under that tag) with progress.

        The daemon writes the tag only after every layer is up, so a failure midway
        leaves the registry's tags untouched. `auth_config` travels to the daemon in the
        request header only (never into ~/.docker/config.json)."""
        repo, tag = _name_and_tag(ref)
        t0 = time.monotonic()
        # a refusal, a daemon fault or a broken stream: PushFailed all three (the daemon
        # cancels a push whose client went away; the caller's tags come after the push)
        try:
            with _daemon(f"push of {ref} failed", error=PushFailed), \
                    Activity(f"pushing {ref}", unit_bytes=True, silent=quiet) as activity:
                progress = _PushProgress(activity, quiet=quiet)
                stream = self.client.api.push(repo, tag=tag, stream=True, decode=True, auth_config=auth_config)
                for chunk in stream:
                    progress.feed(chunk)
        except _StreamError as exc:
            raise PushFailed(f"push of {ref} failed: {_one_line(str(exc))}") from None
        progress.result.seconds = time.monotonic() - t0
        if not progress.result.digest:
            raise PushFailed(f"push of {ref} ended without the daemon reporting a manifest digest")
        return progress.result

    def build(
        self,
        context: TarContext,
        *,
        label: str,
        buildargs: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        nocache: bool = False,
        quiet: bool = False,
        platform: str | None = None,
    ) -> BuildResult:
        """Build an untagged image; the caller tags it only once the build succeeded.
        `platform` (linux/arm64): build for it (RUN steps of another architecture need
        qemu registered with binfmt_misc); None: the daemon's own."""
        activity = Activity(label, silent=quiet)
        progress = _BuildProgress(label, activity, quiet=quiet)
        t0 = time.monotonic()
        with tempfile.TemporaryFile() as tar, activity:
            context.write_tar(tar)
            tar.seek(0)
            try:
                stream = self.client.api.build(
                    fileobj=tar,
                    custom_context=True,
                    buildargs=buildargs or {},
                    labels=labels or {},
                    rm=True,
                    forcerm=True,
                    nocache=nocache,
                    decode=True,
                    pull=False,
                    platform=platform,
                )
                for chunk in _guarded(stream):
                    progress.feed(chunk)
            except _StreamError as exc:
                self._fail(progress, str(exc), exc.status)
            except docker.errors.APIError as exc:
                self._fail(progress, fault_text(exc))
            except _DaemonGone as exc:
                self._broken(progress, str(exc))
        progress._close_step()
        result = progress.result
        result.seconds = time.monotonic() - t0
        if not result.image_id:
            self._fail(progress, "the daemon reported no image id")
        if not result.image_id.startswith("sha256:"):
            with _daemon(f"{label}: looking up the image built ({result.image_id[:19]})"):
                result.image_id = id_of(self.client.images.get(result.image_id))
        return result

    def _broken(self, progress: _BuildProgress, why: str) -> NoReturn:
        """The build stream broke: the daemon went away (DockerUnavailable), or it still
        answers and only the connection broke (DockerError); either way the daemon
        cancels the build, and nothing was tagged."""
        progress.activity.stop()
        if not self._alive():
            self._daemon_gone(progress, why)
        step = progress.current or "before the first step"
        raise DockerError(f"{progress.label}: the build's stream broke (at {step}): {_one_line(why)}",
                          hint="nothing was tagged; rerun the same build (finished steps come from the layer cache)")

    def _fail(self, progress: _BuildProgress, message: str, status: int | None = None) -> NoReturn:
        # A daemon shutting down stops the step's container first (so the step "fails",
        # often with 143) and stops listening: a daemon that does not answer now is the cause.
        progress.activity.stop()
        if not self._alive():
            self._daemon_gone(progress, f"the step was stopped (status {status})" if status else message)
        step = progress.current or "(before the first step)"
        tail = "\n".join(f"    | {line}" for line in list(progress.tail)[-25:])
        log.errors.print(f"[red]build failed at[/] {step}", markup=True, highlight=False)
        if tail:
            log.errors.print(tail, markup=False, highlight=False)
        raise BuildFailed(f"{progress.label}: {step}: {message.splitlines()[-1] if message else 'failed'}",
                          step=step, tail=list(progress.step_tail), status=status)

    @staticmethod
    def _daemon_gone(progress: _BuildProgress, why: str) -> NoReturn:
        step = progress.current or "before the first step"
        raise DockerUnavailable(
            f"{progress.label}: the Docker daemon went away during the build (at {step}): {_one_line(why)}",
            hint="nothing was tagged; once `docker info` answers again, rerun the same build "
                 "(finished steps come from the layer cache)")

    def _alive(self) -> bool:
        # a new client: a pooled keep-alive connection may still reach a daemon that has
        # stopped listening and is shutting down
        probe = None
        try:
            probe = docker.from_env(timeout=5)
            probe.ping()
            return True
        except Exception:  # connection refused, reset, timeout: all mean "not there now"
            return False
        finally:
            if probe is not None:
                probe.close()


def _guarded(stream: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The build stream, with a broken connection (daemon stopped or restarted mid-build,
    or a stream cut short) raised as one exception type instead of whatever layer
    noticed it. An APIError stays one: the SDK raises the daemon's refusal of the build
    (an error status) only when the stream is first read."""
    try:
        yield from stream
    except docker.errors.APIError:
        raise
    except _FAULTS as exc:
        raise _DaemonGone(fault_text(exc)) from None


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300] or "failed"


def _name_and_tag(ref: str) -> tuple[str, str]:
    """The repository and tag of `REPO:TAG`, for the SDK calls that take them apart (a
    push without a tag would push every tag of the repository)."""
    parts = imageref.parse(ref)
    if parts.tag is None or parts.digest is not None:
        raise DockerError(f"{ref[:200]} is no REPOSITORY:TAG")
    return parts.name, parts.tag


def registry_of(repo: str) -> str:
    """The registry host serving `repo`, as docker resolves it ("docker.io" for Hub names)."""
    host, _ = docker.auth.resolve_repository_name(repo)
    return host


def index_name(name: str) -> str:
    """A registry host as the docker config keys it (Docker Hub's aliases as one)."""
    return docker.auth.resolve_index_name(name)


def config_auth(config: dict, host: str) -> dict:
    """What a docker config document (`auths`, `credsStore`, `credHelpers`) holds for
    `host`, resolved by the SDK's own auth code ({} when nothing); DockerError when an
    entry is bad or a credential helper fails."""
    try:
        return docker.auth.load_config(config_dict=config).resolve_authconfig(host) or {}
    except docker.errors.DockerException as exc:
        raise DockerError(" ".join(str(exc).split())[:200]) from None


def _required(value: _T | None, what: str) -> _T:
    """A value the SDK types as optional (its models may be built from partial attrs)
    but the daemon always sends for an object it returned."""
    if value is None:
        raise DockerError(f"the Docker daemon returned an object without its {what}")
    return value


def id_of(image: Image) -> str:
    """The id of an image the daemon returned (the SDK types it optional)."""
    return _required(image.id, "image id")


def _short(exc: BaseException) -> str:
    text = getattr(exc, "explanation", None) or str(exc)
    return " ".join(str(text).split())[:300]


def _timed_out(exc: BaseException) -> bool:
    """A wait on the daemon that ran past its timeout: requests raises ReadTimeout, or
    (docker-py's unix socket) a ConnectionError wrapping urllib3's ReadTimeoutError."""
    if isinstance(exc, requests.exceptions.ReadTimeout):
        return True
    return isinstance(exc, requests.exceptions.ConnectionError) and any(
        isinstance(arg, urllib3.exceptions.ReadTimeoutError) for arg in exc.args)
