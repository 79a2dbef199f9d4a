"""The daemon's JSON streams, read: the legacy builder's build stream and a push's
stream, turned into results and events. What the events look like on a terminal or in
CI is not decided here: the caller passes a display (`kiln.basics.progress`)."""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import docker.errors

from kiln.infra.docker.faults import _FAULTS, fault_text, one_line

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
_BUILT = re.compile(r"Successfully built ([0-9a-f]{12,64})")
# the legacy builder's own bookkeeping between a step's header and its output
_BOOKKEEPING = re.compile(r"^ ---> |^Removing intermediate container ")
# daemons that leave errorDetail.code out still end the message with the status
_RUN_STATUS = re.compile(r"returned a non-zero code: (\d+)")

# one decoded JSON object of a daemon stream
_Chunk = dict[str, Any]


class _BuildEvents(Protocol):
    """What a build reports while the daemon streams it (`progress.BuildDisplay` shows it)."""

    def step_started(self, number: str, total: str, line: str) -> None: ...

    def step_finished(self, seconds: float, cached: bool) -> None: ...

    def pulling(self, status: str, progress: str) -> None: ...

    def output(self, line: str, *, chatter: bool) -> None: ...


class _PushEvents(Protocol):
    """What a push reports while the daemon streams it (`progress.PushDisplay` shows it)."""

    def sending(self, layers: int, done: int, total: int) -> None: ...

    def layer_pushed(self, layer: str) -> None: ...

    def layer_present(self, layer: str, status: str) -> None: ...

    def layer_retrying(self, layer: str, status: str) -> None: ...


class _PullEvents(Protocol):
    """What a pull reports while the daemon streams it (`progress.PullDisplay` shows it)."""

    def layer(self, layer: str, status: str, progress: str, *, done: int, total: int) -> None: ...


class BuildStep(NamedTuple):
    """One Dockerfile instruction of a build and what it cost."""

    instruction: str
    seconds: float
    cached: bool


@dataclass
class BuildResult:
    """What a build produced: the image id, its steps, how many were cached and each step's time."""

    image_id: str
    steps: int = 0
    cached_steps: int = 0
    seconds: float = 0.0
    step_times: list[BuildStep] = field(default_factory=list)


class StreamError(Exception):
    """An error the daemon reported in a build, push or pull stream, with a failed RUN step's exit status."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # exit status of a failed RUN step


class DaemonGone(Exception):
    """The connection to the daemon broke while it streamed the build."""


class BuildStream:
    """The legacy builder's JSON stream, read into a `BuildResult` step by step (with
    each step's timing and the output kept for a failure's report); what happens is
    reported to `events`."""

    def __init__(self, label: str, events: _BuildEvents) -> None:
        self.label = label
        self.events = events
        self.tail: deque[str] = deque(maxlen=40)
        self.step_tail: deque[str] = deque(maxlen=40)  # output of the current step only
        self.current: str | None = None
        self.current_cached = False
        self.t_step = time.monotonic()
        self.result = BuildResult(image_id="")

    def close_step(self) -> None:
        """Record the running step's time, if one is running, and report it finished."""
        if self.current is None:
            return
        dt = time.monotonic() - self.t_step
        self.result.step_times.append(BuildStep(self.current, dt, self.current_cached))
        self.events.step_finished(dt, self.current_cached)

    def feed(self, chunk: _Chunk) -> None:
        """Read one chunk of the build stream: errors, the image id, pulls, step starts and output."""
        if "error" in chunk or "errorDetail" in chunk:
            detail = chunk.get("errorDetail") or {}
            message = str(detail.get("message") or chunk.get("error", "")).strip()
            raise StreamError(message, _run_status(detail.get("code"), message))
        if "aux" in chunk and isinstance(chunk["aux"], dict) and "ID" in chunk["aux"]:
            self.result.image_id = chunk["aux"]["ID"]
        if "status" in chunk:  # base image pull during FROM
            self.events.pulling(str(chunk["status"]), str(chunk.get("progress", "")))
            return
        text = chunk.get("stream")
        if not text:
            return
        for line in _ANSI.sub("", text).splitlines():
            line = line.rstrip()  # the same line, stripped  # noqa: PLW2901
            if line:
                self._line(line)

    def _line(self, line: str) -> None:
        m = _STEP.match(line)
        if m:
            self.close_step()
            self.current = line
            self.current_cached = False
            self.step_tail.clear()
            self.t_step = time.monotonic()
            self.result.steps = int(m.group(2))
            self.events.step_started(m.group(1), m.group(2), line)
            return
        if "Using cache" in line:
            self.current_cached = True
            self.result.cached_steps += 1
            return
        m = _BUILT.search(line)
        if m and not self.result.image_id:
            self.result.image_id = m.group(1)
        self.tail.append(line)
        bookkeeping = bool(_BOOKKEEPING.match(line))
        if not bookkeeping:
            self.step_tail.append(line)
        if not line.startswith(" ---> "):
            self.events.output(line, chatter=bookkeeping or line.startswith("Successfully "))


def _run_status(code: object, message: str) -> int | None:
    """A failed RUN's exit status: errorDetail.code, else the number the message ends with."""
    if isinstance(code, int) and code > 0:
        return code
    m = _RUN_STATUS.search(message)
    return int(m.group(1)) if m else None


def guarded(stream: Iterator[_Chunk]) -> Iterator[_Chunk]:
    """The build stream, with a broken connection (daemon stopped or restarted mid-build,
    or a stream cut short) raised as one exception type instead of whatever layer
    noticed it. An APIError stays one: the SDK raises the daemon's refusal of the build
    (an error status) only when the stream is first read."""
    try:
        yield from stream
    except docker.errors.APIError:
        raise
    except _FAULTS as exc:
        raise DaemonGone(fault_text(exc)) from None


@dataclass
class PushResult:
    """What the daemon reported for one pushed tag."""

    digest: str = ""  # manifest digest the registry accepted
    size: int = 0
    layers_pushed: int = 0
    layers_existing: int = 0
    seconds: float = 0.0


class PushStream:
    """The daemon's push stream, read into a `PushResult`: one event per finished layer
    and the bytes sent so far, so a multi-GB push is visibly alive without a line per chunk."""

    def __init__(self, events: _PushEvents) -> None:
        self.events = events
        self.sent: dict[str, tuple[int, int]] = {}  # layer id -> (current, total)
        self.result = PushResult()

    def feed(self, chunk: _Chunk) -> None:
        """Read one chunk of the push stream: errors, the pushed digest and size, and layer progress."""
        if "error" in chunk or "errorDetail" in chunk:
            detail = (chunk.get("errorDetail") or {}).get("message") or chunk.get("error", "")
            raise StreamError(str(detail).strip())
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
            done = sum(c for c, _ in self.sent.values())
            total = sum(t for _, t in self.sent.values())
            self.events.sending(len(self.sent), done, total)
        elif status == "Pushed":
            self.result.layers_pushed += 1
            self.events.layer_pushed(layer)
        elif status.startswith(("Layer already exists", "Mounted from")):
            self.result.layers_existing += 1
            self.events.layer_present(layer, status)
        elif status.startswith("Retrying in"):
            # the daemon retries a failed layer upload itself (5 attempts, growing delay)
            self.events.layer_retrying(layer, status)


class PullStream:
    """The daemon's pull stream: each layer's bytes, summed into one progress event; an
    error in the stream (the registry's refusal) is a StreamError."""

    def __init__(self, events: _PullEvents) -> None:
        self.events = events
        self.layers: dict[str, tuple[int, int]] = {}  # layer id -> (bytes done, bytes total)

    def feed(self, chunk: _Chunk) -> None:
        """Read one chunk of the pull stream: errors and each layer's status and progress."""
        if "error" in chunk or "errorDetail" in chunk:
            said = (chunk.get("errorDetail") or {}).get("message") or chunk.get("error", "")
            raise StreamError(one_line(str(said)))
        if "status" not in chunk:
            return
        detail = chunk.get("progressDetail") or {}
        if chunk.get("id") and detail.get("total"):
            self.layers[chunk["id"]] = (int(detail.get("current") or 0), int(detail["total"]))
        self.events.layer(
            str(chunk.get("id", "")),
            str(chunk["status"]),
            str(chunk.get("progress", "")),
            done=sum(c for c, _ in self.layers.values()),
            total=sum(t for _, t in self.layers.values()),
        )
