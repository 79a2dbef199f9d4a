"""A small threaded HTTP proxy on 127.0.0.1 in front of a real registry, injecting faults.

Faults are a queue: each names the requests it hits (method and a path substring) and
what it does to the next `times` of them (answer a status with headers, or drop the
connection without answering). Everything else is forwarded unchanged, Host header
included, so the registry's upload `Location`s point back through the proxy.

With `token_front(...)` the proxy also plays a registry's token service: requests need
`Authorization: Bearer <token>`; tokens come from GET /token (Basic auth with the
registry's user) and expire after `uses` requests, as short-lived cloud tokens do.
Behind it, the proxy speaks Basic to the real (htpasswd) registry.
"""

from __future__ import annotations

import base64
import http.client
import itertools
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade", "content-length"}


@dataclass
class Fault:
    method: str  # "*" for any
    path: str  # substring of the request path
    times: int
    status: int = 0  # 0: drop the connection instead of answering
    headers: dict = field(default_factory=dict)

    def hits(self, method: str, path: str) -> bool:
        return self.times > 0 and self.method in ("*", method) and self.path in path


class FaultProxy:
    def __init__(self, upstream: str):
        self.upstream = upstream  # HOST:PORT of the real registry
        self.faults: list[Fault] = []
        self.log: list[tuple[str, str, int]] = []  # (method, path, status answered), faults included
        self.tokens_issued = 0
        self._token = None  # (user, password, uses) when fronting with tokens
        self._live: dict[str, int] = {}  # token -> uses left
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.host = f"127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> FaultProxy:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def inject(self, method: str, path: str, times: int, status: int = 0, **headers: str) -> Fault:
        fault = Fault(method, path, times, status, {k.replace("_", "-"): v for k, v in headers.items()})
        self.faults.append(fault)
        return fault

    def token_front(self, user: str, password: str, uses: int) -> None:
        self._token = (user, password, uses)

    def statuses(self, method: str, path: str) -> list[int]:
        return [s for m, p, s in self.log if m == method and path in p]

    # -- the handler -------------------------------------------------------------------
    def _fault_for(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.hits(method, path):
                    fault.times -= 1
                    return fault
        return None

    def _handler(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    parts = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return b"".join(parts)
                        parts.append(self.rfile.read(size))
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _answer(
                self, status: int, body: bytes = b"", headers: dict | None = None, length: int | None = None
            ) -> None:
                proxy.log.append((self.command, self.path, status))
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                # HEAD: the length of what a GET would return, and no body
                self.send_header("Content-Length", str(len(body) if length is None else length))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _handle(self) -> None:
                body = self._body()
                fault = proxy._fault_for(self.command, self.path)
                if fault is not None:
                    if not fault.status:
                        proxy.log.append((self.command, self.path, 0))
                        self.close_connection = True
                        self.connection.shutdown(2)  # no answer at all: a dropped connection
                        return None
                    return self._answer(
                        fault.status,
                        b'{"errors":[{"code":"INJECTED"}]}',
                        {"Content-Type": "application/json", **fault.headers},
                    )
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                if proxy._token is not None:
                    if self.path.startswith("/token"):
                        return self._serve_token()
                    if not self._token_ok():
                        return None
                    user, password, _ = proxy._token
                    headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
                self._forward(body, headers)

            def _serve_token(self) -> None:
                user, password, uses = proxy._token
                good = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
                if self.headers.get("Authorization") != good:
                    return self._answer(401, b"{}")
                token = f"tok-{next(proxy._ids)}"
                with proxy._lock:
                    proxy._live[token] = uses
                    proxy.tokens_issued += 1
                self._answer(200, json.dumps({"token": token}).encode(), {"Content-Type": "application/json"})

            def _token_ok(self) -> bool:
                given = self.headers.get("Authorization", "").removeprefix("Bearer ")
                with proxy._lock:
                    left = proxy._live.get(given, 0)
                    if left > 0:
                        proxy._live[given] = left - 1
                        return True
                realm = f"http://{proxy.host}/token"
                error = ',error="invalid_token"' if given in proxy._live else ""
                self._answer(
                    401,
                    b'{"errors":[{"code":"UNAUTHORIZED"}]}',
                    {"WWW-Authenticate": f'Bearer realm="{realm}",service="faultproxy"{error}'},
                )
                return False

            def _forward(self, body: bytes, headers: dict) -> None:
                if body or self.command in ("PUT", "POST", "PATCH"):
                    headers["Content-Length"] = str(len(body))
                conn = http.client.HTTPConnection(proxy.upstream, timeout=60)
                try:
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    length = resp.getheader("Content-Length")
                    out = {k: v for k, v in resp.getheaders() if k.lower() not in _HOP}
                finally:
                    conn.close()
                head_length = int(length) if self.command == "HEAD" and length else None
                self._answer(resp.status, data, out, head_length)

            do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _handle

        return Handler
