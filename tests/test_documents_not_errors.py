"""What a document reader takes without an error: a build record line cut short by a crash, a
smoke record that did not pass, a damaged launch cache entry, a registry error body that is
not one; and the one it stops at (a damaged publish record, exit 47)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from document_readers import (
    IMAGE_ID,
    answering_daemon,
    build_record,
    publish_record,
    read_builds,
    read_smoke,
    set_field,
    write_at,
)
from kilntest import passing_smoke_record, run_kiln

from kiln.domain.imagecheck import launch_arg_check
from kiln.infra import records
from kiln.infra.registry import _error_code
from kiln.inimage import launch_arg_probe


# -- what is not an error ----------------------------------------------------------------------
def test_a_build_record_line_cut_short_by_a_crash_is_skipped_with_a_warning(tmp_path, monkeypatch, capsys):
    found = read_builds(b'{"image_id": "sha256:', tmp_path, monkeypatch)
    assert found == [build_record()]
    assert ".jsonl: line 2: not JSON (a build record cut short by a crash?): skipped" in capsys.readouterr().err


def test_a_smoke_record_that_did_not_pass_is_no_error_and_none_is_none(tmp_path, monkeypatch):
    assert (
        read_smoke(
            json.dumps({**passing_smoke_record(IMAGE_ID, "tiny-moe"), "passed": False}).encode(), tmp_path, monkeypatch
        )
        is None
    )
    records.record_path(IMAGE_ID).unlink()
    assert records.passing_smoke_record(IMAGE_ID) is None


def test_a_damaged_launch_cache_entry_is_asked_again_with_a_warning(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    answer = {
        "version": "0.32.0",
        "kiln_engine": None,
        "jobs": [],
        "flags": {"max-num-seqs": {"takes_value": True, "default_on": False}},
    }
    docker = answering_daemon(launch_arg_probe.MARKER, json.dumps(answer).encode())
    assert launch_arg_check.engine_args(docker, IMAGE_ID).flags == answer["flags"]  # asked, then cached
    cache = launch_arg_check._cache_file(IMAGE_ID)
    entry = json.loads(cache.read_text())
    cache.write_text(json.dumps({**entry, "flags": {"max-num-seqs": {"takes_value": "yes"}}}))
    asked = []
    monkeypatch.setattr(launch_arg_check, "_probe", lambda *a, **k: asked.append(1) or answer)
    assert launch_arg_check.engine_args(docker, IMAGE_ID).flags == answer["flags"]
    assert asked == [1]
    err = capsys.readouterr().err
    assert "argcheck/" in err and "flags[max-num-seqs].takes_value: Input should be a valid boolean" in err
    assert "a damaged cache entry, asked the engine image again" in err
    # an entry of another schema is asked again without a word
    cache.write_text(json.dumps({"schema": launch_arg_check._SCHEMA - 1}))
    assert launch_arg_check.engine_args(docker, IMAGE_ID).flags == answer["flags"]
    assert asked == [1, 1] and "damaged" not in capsys.readouterr().err


def test_a_registry_error_body_that_is_not_one_adds_nothing():
    assert _error_code(SimpleNamespace(content=b'{"errors": [{"code": "DENIED", "message": "no"}]}')) == ": DENIED no"
    for body in (b"<html>502</html>", b"[]", b'{"errors": [{"message": 5}]}'):
        assert _error_code(SimpleNamespace(content=body)) == ""


def test_render_k8s_stops_at_a_damaged_publish_record_with_exit_47(tmp_path):
    """The whole way through the CLI: one `kiln: error:` line naming the file and the field."""
    state = tmp_path / "state"
    doc = set_field(publish_record(), ("smoke", "status"), 1)
    write_at(state, "publish/tiny-moe-publish-20260101T000000Z.json", json.dumps(doc).encode())
    result = run_kiln(
        "render",
        "k8s",
        "tiny-moe",
        env={"KILN_RESULTS_DIR": str(state), "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"},
    )
    assert result.returncode == 47, result.stderr
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("kiln: error:")]
    assert errors == [
        "kiln: error: "
        + str(state / "publish" / "tiny-moe-publish-20260101T000000Z.json")
        + ": smoke.status: Input should be 'passed' or 'skipped'"
    ], result.stderr
    assert "Traceback" not in result.stderr
