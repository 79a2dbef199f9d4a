"""The index reader tries a page again only when the failure may pass: a resolver's
"try again", a timeout, a reset, HTTP 429/5xx. A page that is not there, or a name
that does not exist, fails on the first answer. The HTTP cases run against a real
server on loopback; the resolver cases replace urlopen (a resolver cannot be made to
say "try again" on demand)."""

from __future__ import annotations

import io
import json
import socket
import threading
import urllib.error
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kiln.basics.errors import EngineFetchFailed
from kiln.infra import package_index

PAGE = {
    "name": "six",
    "versions": ["1.17.0"],
    "files": [
        {
            "filename": "six-1.17.0-py2.py3-none-any.whl",
            "url": "https://files.example/six.whl",
            "hashes": {"sha256": "ab" * 32},
            "requires-python": None,
        }
    ],
}


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch):
    monkeypatch.setattr(package_index, "_RETRY_WAITS_S", (0.0, 0.0, 0.0))


@contextmanager
def _index(statuses: list[int]):
    """A loopback index that answers each GET with the next status (the last repeats);
    yields its URL and the paths it was asked for, and stops when the block ends."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            seen.append(self.path)
            code = statuses[min(len(seen), len(statuses)) - 1]
            body = json.dumps(PAGE).encode() if code == 200 else b"no"
            self.send_response(code)
            self.send_header("Content-Type", package_index._ACCEPT if code == 200 else "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple", seen
    finally:
        server.shutdown()


@pytest.mark.registry  # HTTP on 127.0.0.1
@pytest.mark.parametrize("blip", [503, 502, 429])
def test_a_passing_server_error_is_tried_again_until_the_page_comes(blip):
    with _index([blip, blip, 200]) as (index, seen):
        page = package_index.project("Six", cafile=None, index=index)
    assert [f.filename for f in page.files] == ["six-1.17.0-py2.py3-none-any.whl"]
    assert seen == ["/simple/six/"] * 3


@pytest.mark.registry  # HTTP on 127.0.0.1
def test_a_missing_page_fails_on_the_first_answer():
    with (
        _index([404]) as (index, seen),
        pytest.raises(EngineFetchFailed, match=r"package index: .*/simple/six/: HTTP 404$"),
    ):
        package_index.project("six", cafile=None, index=index)
    assert len(seen) == 1


@pytest.mark.registry  # HTTP on 127.0.0.1
def test_a_server_error_that_persists_fails_after_the_last_wait():
    with _index([503]) as (index, seen), pytest.raises(EngineFetchFailed, match=r"HTTP 503$"):
        package_index.project("six", cafile=None, index=index)
    assert len(seen) == len(package_index._RETRY_WAITS_S) + 1


def _urlopen_failing(errors: list[BaseException]):
    calls: list[str] = []

    def urlopen(req, **kwargs):
        calls.append(req.full_url)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return io.BytesIO(json.dumps(PAGE).encode())

    return urlopen, calls


def test_a_resolver_that_says_try_again_is_tried_again(monkeypatch):
    again = urllib.error.URLError(socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution"))
    urlopen, calls = _urlopen_failing([again, TimeoutError("timed out")])
    monkeypatch.setattr(package_index.urllib.request, "urlopen", urlopen)
    page = package_index.project("six", cafile=None, index="https://pypi.example/simple")
    assert page.versions == ["1.17.0"]
    assert len(calls) == 3


def test_a_name_that_does_not_exist_fails_at_once(monkeypatch):
    noname = urllib.error.URLError(socket.gaierror(socket.EAI_NONAME, "Name or service not known"))
    urlopen, calls = _urlopen_failing([noname])
    monkeypatch.setattr(package_index.urllib.request, "urlopen", urlopen)
    with pytest.raises(EngineFetchFailed, match=r"pypi\.example/simple/six/: .*Name or service not known"):
        package_index.project("six", cafile=None, index="https://pypi.example/simple")
    assert len(calls) == 1
