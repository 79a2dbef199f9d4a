"""A fault-injecting proxy between kiln and the real Docker daemon's unix socket.

kiln (and any Docker client) is pointed at it with `DOCKER_HOST=unix://<proxy.path>`.
Every request goes through to the daemon unchanged, except those that the armed fault
matches (method and a regular expression over the path, without the `/v1.NN` prefix
and the query). Those get one of:

- `status`: an HTTP error answered by the proxy, with a daemon-style JSON body
  (`{"message": ...}`), as dockerd answers a request it fails (the body is read first,
  as the daemon does, so the client sees the answer and not a broken upload);
- `cut`: the request goes to the daemon, which acts on it, and the connection to the
  client is closed after the response head and `after` bytes of the body: a stream (a
  build, push, save, log) or an answer cut short.

Each client connection carries one request: the proxy asks the daemon to close after
its answer (`Connection: close`), so the client reconnects for the next one, and a
hijacked connection (`docker exec`'s `Upgrade: tcp`) is passed through raw.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import socketserver
import threading
from dataclasses import dataclass, field
from pathlib import Path

DAEMON_SOCKET = "/var/run/docker.sock"
_VERSION = re.compile(r"^/v\d+\.\d+(?=/)")
_HEAD_END = b"\r\n\r\n"
_REASONS = {
    400: "Bad Request",
    404: "Not Found",
    409: "Conflict",
    500: "Internal Server Error",
    503: "Service Unavailable",
}

# The daemon's endpoints by name (method, path pattern): what the tests arm and what the
# log of requests is grouped by. Names and ids may hold slashes (image references).
ENDPOINTS: dict[str, tuple[str, str]] = {
    "ping": ("GET", r"/_ping"),
    "version": ("GET", r"/version"),
    "info": ("GET", r"/info"),
    "image list": ("GET", r"/images/json"),
    "image inspect": ("GET", r"/images/.+/json"),
    "image tag": ("POST", r"/images/.+/tag"),
    "image remove": ("DELETE", r"/images/.+"),
    "image push": ("POST", r"/images/.+/push"),
    "image save": ("GET", r"/images/.+/get"),
    "image load": ("POST", r"/images/load"),
    "image create": ("POST", r"/images/create"),
    "build": ("POST", r"/build"),
    "container create": ("POST", r"/containers/create"),
    "container list": ("GET", r"/containers/json"),
    "container inspect": ("GET", r"/containers/[^/]+/json"),
    "container start": ("POST", r"/containers/[^/]+/start"),
    "container wait": ("POST", r"/containers/[^/]+/wait"),
    "container logs": ("GET", r"/containers/[^/]+/logs"),
    "container stop": ("POST", r"/containers/[^/]+/stop"),
    "container remove": ("DELETE", r"/containers/[^/]+"),
    "exec create": ("POST", r"/containers/[^/]+/exec"),
    "exec start": ("POST", r"/exec/[^/]+/start"),
    "exec inspect": ("GET", r"/exec/[^/]+/json"),
    "network create": ("POST", r"/networks/create"),
    "network inspect": ("GET", r"/networks/[^/]+"),
    "network remove": ("DELETE", r"/networks/[^/]+"),
}


def endpoint_of(method: str, path: str) -> str:
    """The name of the endpoint a request went to; `METHOD path` when none matches."""
    for name, (m, pattern) in ENDPOINTS.items():
        if m == method and re.fullmatch(pattern, path):
            return name
    return f"{method} {path}"


@dataclass
class Fault:
    endpoint: str  # a key of ENDPOINTS
    mode: str  # "status" or "cut"
    status: int = 500
    message: str = "injected fault: the daemon failed this request"
    after: int = 64  # cut: body bytes passed on before the connection is closed
    times: int | None = None  # None: every matching request
    skip: int = 0  # matching requests passed on before the fault starts
    hits: int = 0  # requests it answered or cut (a cut whose body ended first does not count)

    def matches(self, method: str, path: str) -> bool:
        m, pattern = ENDPOINTS[self.endpoint]
        return method == m and re.fullmatch(pattern, path) is not None and (self.times is None or self.times > 0)

    def take(self) -> bool:
        """Whether this matching request is faulted (the first `skip` are not)."""
        if self.skip > 0:
            self.skip -= 1
            return False
        if self.times is not None:
            self.times -= 1
        return True


@dataclass
class _Request:
    method: str
    target: str  # as sent, with version prefix and query
    path: str  # without both
    head: bytes
    rest: bytes  # bytes read past the head (the start of the body)
    headers: dict[str, str] = field(default_factory=dict)


class DockerFaultProxy:
    def __init__(self, path: Path, upstream: str = DAEMON_SOCKET):
        self.path = path
        self.upstream = upstream
        self.fault: Fault | None = None
        self.seen: list[tuple[str, str]] = []  # (method, path) of every request, in order
        self._lock = threading.Lock()
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                proxy._serve(self.request)

        self.server = socketserver.ThreadingUnixStreamServer(str(path), Handler)
        self.server.daemon_threads = True

    @property
    def docker_host(self) -> str:
        return f"unix://{self.path}"

    def start(self) -> DockerFaultProxy:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.path.unlink(missing_ok=True)

    def arm(self, endpoint: str, mode: str, **kwargs: object) -> Fault:
        if endpoint not in ENDPOINTS or mode not in ("status", "cut"):
            raise ValueError(f"no endpoint {endpoint!r} or mode {mode!r}")
        with self._lock:
            self.fault = Fault(endpoint, mode, **kwargs)  # type: ignore[arg-type]
            self.seen.clear()
            return self.fault

    def disarm(self) -> None:
        with self._lock:
            self.fault = None

    def endpoints_seen(self) -> set[str]:
        with self._lock:
            return {endpoint_of(m, p) for m, p in self.seen}

    # -- one connection, one request ------------------------------------------------------
    def _serve(self, client: socket.socket) -> None:
        try:
            request = _read_head(client)
            if request is None:
                return
            with self._lock:
                self.seen.append((request.method, request.path))
                fault = (
                    self.fault if self.fault is not None and self.fault.matches(request.method, request.path) else None
                )
                if fault is not None and not fault.take():
                    fault = None
            if fault is not None and fault.mode == "status":
                _drain_body(client, request)
                body = json.dumps({"message": fault.message}).encode()
                client.sendall(
                    f"HTTP/1.1 {fault.status} {_REASONS.get(fault.status, 'Error')}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                    f"Connection: close\r\n\r\n".encode()
                    + body
                )
                with self._lock:
                    fault.hits += 1
                return
            self._forward(client, request, fault)
        except OSError:  # the client or the daemon went away: nothing to pass on
            pass
        finally:
            _close(client)

    def _forward(self, client: socket.socket, request: _Request, fault: Fault | None) -> None:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        upstream.connect(self.upstream)
        try:
            upstream.sendall(_closing(request) + request.rest)
            threading.Thread(target=_pump, args=(client, upstream), daemon=True).start()
            cut_after = fault.after if fault is not None else None
            if self._relay(upstream, client, cut_after) and fault is not None:
                with self._lock:
                    fault.hits += 1
        finally:
            _close(upstream)

    @staticmethod
    def _relay(upstream: socket.socket, client: socket.socket, cut_after: int | None) -> bool:
        """The daemon's answer to the client; with `cut_after`, only its head and that many
        body bytes, then both connections are shut. True when it was cut."""
        head, body_sent = b"", None
        while True:
            data = upstream.recv(65536)
            if not data:
                return False
            if cut_after is None:
                client.sendall(data)
                continue
            if body_sent is None:
                head += data
                end = head.find(_HEAD_END)
                if end < 0:
                    continue
                client.sendall(head[: end + len(_HEAD_END)])
                data, body_sent = head[end + len(_HEAD_END) :], 0
            room = cut_after - body_sent
            client.sendall(data[:room])
            body_sent += min(len(data), room)
            if body_sent >= cut_after:
                return True  # the caller closes both connections


def _close(sock: socket.socket) -> None:
    """Shut down, then close: a plain close() leaves the connection open while the pump
    thread is blocked reading it (the peer would never see the end)."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def _read_head(client: socket.socket) -> _Request | None:
    buf = b""
    while _HEAD_END not in buf:
        data = client.recv(65536)
        if not data:
            return None
        buf += data
    head, _, rest = buf.partition(_HEAD_END)
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()
    path = _VERSION.sub("", target.split("?", 1)[0])
    return _Request(method, target, path, head + _HEAD_END, rest, headers)


def _closing(request: _Request) -> bytes:
    """The request head, asking the daemon to close after its answer (one request per
    connection); an upgrade (a hijacked exec stream) keeps its own Connection header."""
    if "upgrade" in request.headers:
        return request.head
    lines = [ln for ln in request.head[: -len(_HEAD_END)].split(b"\r\n") if not ln.lower().startswith(b"connection:")]
    return b"\r\n".join([*lines, b"Connection: close"]) + _HEAD_END


def _drain_body(client: socket.socket, request: _Request) -> None:
    """Read the request's body (Content-Length or chunked) before answering, as the
    daemon does: answering mid-upload would break the upload, not fail the request."""
    reader = _Reader(client, request.rest)
    if request.headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int(reader.line().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while reader.line() not in (b"", b"\r\n"):  # trailers, then the blank line
                    pass
                return
            reader.read(size + 2)  # the chunk and its CRLF
    reader.read(int(request.headers.get("content-length") or 0))


class _Reader:
    """Lines and counted reads from a socket, after bytes already read."""

    def __init__(self, sock: socket.socket, buf: bytes):
        self.sock, self.buf = sock, buf

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        self.buf += data
        return bool(data)

    def line(self) -> bytes:
        while b"\r\n" not in self.buf:
            if not self._fill():
                return b""
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line + b"\r\n"

    def read(self, n: int) -> None:
        while n > len(self.buf):
            n -= len(self.buf)
            self.buf = b""
            if not self._fill():
                return
        self.buf = self.buf[n:]


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """The client's bytes (a request body, a hijacked stream's input) to the daemon."""
    try:
        while True:
            data = src.recv(65536)
            if not data:
                dst.shutdown(socket.SHUT_WR)
                return
            dst.sendall(data)
    except OSError:
        return
