"""What the daemon's faults become in kiln: every SDK call runs inside `_daemon(doing)`,
which turns whatever the SDK (or the HTTP layers under it) raises into one line naming
what kiln was doing (`DockerError`, or the caller's typed error)."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

import docker
import docker.errors
import docker.utils.socket
import requests
import urllib3
from docker.models.images import Image

from kiln.basics.errors import DockerDaemonError, KilnError

_T = TypeVar("_T")


class DockerError(DockerDaemonError):
    """The daemon (or the SDK reading the docker config) refused a request; the message
    names what kiln was doing and quotes the daemon, on one line. Callers that know
    better turn it into their typed error (ContainerStartFailed, PortInUse); uncaught, it
    is the CLI's `kiln: error:` line with DockerDaemonError's exit code."""


# What the SDK and the HTTP layers under it raise when the daemon answers an error status,
# breaks the connection, or cuts a stream short: APIError (and the SDK's other
# exceptions); requests' ConnectionError/ChunkedEncodingError/ReadTimeout and its JSON
# error for a truncated answer; urllib3's and http.client's own when docker-py reads the
# raw response; docker-py's stream readers' StreamParseError (a JSON stream ending
# inside an object) and SocketError (a hijacked exec/attach socket closing mid-frame).
_FAULTS: tuple[type[BaseException], ...] = (
    docker.errors.DockerException,
    docker.errors.StreamParseError,
    docker.utils.socket.SocketError,
    requests.exceptions.RequestException,
    urllib3.exceptions.HTTPError,
    http.client.HTTPException,
    ConnectionError,
    json.JSONDecodeError,
)


def fault_text(exc: BaseException) -> str:
    """The daemon's own words for a fault (its JSON `message`), or what happened to the
    connection, on one line and without the request URL (it can hold a registry path)."""
    if isinstance(exc, docker.errors.APIError):
        said = exc.explanation or (exc.response.reason if exc.response is not None else "") or str(exc)
        status = exc.status_code if exc.status_code is not None else "an error"
        return f"the Docker daemon answered {status}: {one_line(str(said))}"
    if timed_out(exc):
        return "the Docker daemon did not answer in time"
    if isinstance(
        exc,
        (docker.errors.StreamParseError, json.JSONDecodeError, requests.exceptions.JSONDecodeError),
    ):
        return f"the Docker daemon's answer was cut short ({short(exc)})"
    if isinstance(exc, docker.errors.DockerException):
        return short(exc)
    return f"the connection to the Docker daemon broke ({_innermost(exc)})"


def _innermost(exc: BaseException) -> str:
    """What the innermost of requests' and urllib3's wrapped exceptions says (they wrap
    each other in args: `(('Connection broken: IncompleteRead(...)', IncompleteRead(...)),)`)."""
    for _ in range(5):
        args = getattr(exc, "args", ())
        if args and isinstance(args[0], BaseException):
            exc = args[0]
        elif args and isinstance(args[0], str) and str(args[0]).strip():
            return one_line(args[0])
        else:
            break
    return short(exc) or type(exc).__name__


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
    doing = (
        f"a Docker daemon request ({request.method} /{path})"
        if request is not None and path
        else "a Docker daemon request"
    )
    return DockerError(f"{doing}: {fault_text(exc)}")


def one_line(text: str) -> str:
    """A message folded onto one line and cut at 300 characters; `failed` when empty."""
    return " ".join(text.split())[:300] or "failed"


def short(exc: BaseException) -> str:
    """An exception's message (the daemon's explanation when it has one) on one line, cut at 300 characters."""
    text = getattr(exc, "explanation", None) or str(exc)
    return " ".join(str(text).split())[:300]


def timed_out(exc: BaseException) -> bool:
    """A wait on the daemon that ran past its timeout: requests raises ReadTimeout, or
    (docker-py's unix socket) a ConnectionError wrapping urllib3's ReadTimeoutError."""
    if isinstance(exc, requests.exceptions.ReadTimeout):
        return True
    return isinstance(exc, requests.exceptions.ConnectionError) and any(
        isinstance(arg, urllib3.exceptions.ReadTimeoutError) for arg in exc.args
    )


def required(value: _T | None, what: str) -> _T:
    """A value the SDK types as optional (its models may be built from partial attrs)
    but the daemon always sends for an object it returned."""
    if value is None:
        raise DockerError(f"the Docker daemon returned an object without its {what}")
    return value


def id_of(image: Image) -> str:
    """The id of an image the daemon returned (the SDK types it optional)."""
    return required(image.id, "image id")
