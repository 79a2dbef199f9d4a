"""The GPU twin's host and device halves without a GPU: the plan prepare.py makes from a
recipe's own launch command, the runner's one-line refusals of missing or damaged parts,
and analyse.py's lossless verdicts (benchmarks/gpu_twin)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from kiln_testkit.scripts import load_script

prepare = load_script("benchmarks/gpu_twin/prepare.py")
runner = load_script("benchmarks/gpu_twin/runner.py")
analyse = load_script("benchmarks/gpu_twin/analyse.py")


def _flag(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_plan_is_the_recipes_command_with_each_change_listed():
    plan = prepare.plan("glm53-kindling", "av-cut")
    changed = {c["what"]: c for c in plan["changes"]}
    assert changed["--tensor-parallel-size"]["from"] == "8" and changed["--tensor-parallel-size"]["to"] == "(dropped)"
    assert changed["model"]["from"] == "/models/glm-5.3"
    shipped = plan["configs"]["shipped"]
    assert shipped["argv"][:2] == ["serve", prepare.TARGET]
    assert _flag(shipped["argv"], "--served-model-name") == "glm-5.3"  # kept: the recipe's own
    assert "--tensor-parallel-size" not in shipped["argv"]
    assert _flag(shipped["argv"], "--attention-backend") == "TRITON_ATTN"
    spec = json.loads(_flag(shipped["argv"], "--speculative-config"))
    assert spec["model"] == prepare.DRAFT and spec[prepare.SCHEDULE]  # the recipe's schedule, as shipped
    assert shipped["env"]["KILN_DRAFT_TRUNC"] == "1" and shipped["env"]["KILN_GPU_TWIN"] == "1"


def test_configurations_each_change_one_thing():
    configs = prepare.plan("glm53-kindling", "av-cut")["configs"]
    assert list(configs) == [
        *("spec-off", "spec", "dt-cost", "dt-tau", "shipped", "schedule", "av", "av-dt", "kiln-av"),
        *("mtp-off", "mtp", "mtp-schedule", "mtp-av"),
    ]
    assert _flag(configs["spec-off"]["argv"], "--speculative-config") is None
    specs = {n: json.loads(_flag(c["argv"], "--speculative-config") or "null") for n, c in configs.items()}
    for name in ("spec", "dt-cost", "dt-tau"):
        assert prepare.SCHEDULE not in specs[name] and prepare.AV not in specs[name]
    for name in ("av", "av-dt", "kiln-av"):
        assert specs[name][prepare.AV] is True and prepare.SCHEDULE not in specs[name]
    assert configs["av"]["env"]["KILN_DRAFT_TRUNC"] == "0"
    assert configs["kiln-av"]["env_delta"] == {
        "KILN_DRAFT_TRUNC": "1",
        "KILN_DRAFT_TRUNC_WITH_AV": "1",
        "KILN_DRAFT_TRUNC_AV_CALIBRATE": "1",
        "KILN_DRAFT_TRUNC_AV_TIMING": "1",
    }
    # the schedule alone: the shipped speculative config, draft-trunc off
    assert specs["schedule"] == specs["shipped"] and prepare.SCHEDULE in specs["schedule"]
    assert configs["schedule"]["env_delta"] == {"KILN_DRAFT_TRUNC": "0"}
    assert configs["dt-tau"]["env"]["KILN_DRAFT_TRUNC_TAU"] == "0.25"


def test_mtp_runs_serve_the_mtp_twin_with_one_change_each():
    configs = prepare.plan("glm53-kindling", "av-cut")["configs"]
    specs = {n: json.loads(_flag(c["argv"], "--speculative-config") or "null") for n, c in configs.items()}
    for name in ("mtp-off", "mtp", "mtp-schedule", "mtp-av"):
        assert configs[name]["argv"][:2] == ["serve", prepare.MTP_TARGET]
        assert configs[name]["env_delta"] == {"KILN_DRAFT_TRUNC": "0"}
    assert configs["spec"]["argv"][1] == prepare.TARGET
    assert specs["mtp-off"] is None
    assert specs["mtp"] == {"method": "mtp", "num_speculative_tokens": prepare.MTP_K}
    assert specs["mtp-schedule"] == {**specs["mtp"], prepare.SCHEDULE: specs["shipped"][prepare.SCHEDULE]}
    assert specs["mtp-av"] == {**specs["mtp"], prepare.AV: True}


@pytest.mark.parametrize(
    ("recipe", "why"),
    [("tiny-kindling", "is a CPU recipe"), ("deepseek-v32-mtp", "method is mtp"), ("gpt-oss-120b", "method is unset")],
)
def test_plan_refuses_what_the_twin_cannot_serve_in_one_line(recipe, why):
    with pytest.raises(SystemExit, match=why) as exc:
        prepare.plan(recipe, "av-cut")
    assert "\n" not in str(exc.value.code)


@pytest.fixture
def stash(tmp_path, monkeypatch):
    for name, sub in (("STASH", ""), ("CHUNKS", "chunks"), ("PARTS", "parts"), ("SITE", "site")):
        monkeypatch.setattr(runner, name, tmp_path / "stash" / sub)
    return tmp_path / "stash"


def _packed(tmp_path: Path, monkeypatch, chunk: int = 40) -> Path:
    """A three-part bundle split into `chunk`-byte calls, as prepare.py splits the real one."""
    monkeypatch.setattr(prepare, "_travelling_bytes", lambda: prepare.CALL_LIMIT - prepare.MARGIN - chunk)
    files = {}
    for name, text in (("plan.json", '{"models": {}}'), ("a.txt", "x" * 50), ("b/c.txt", "y" * 30)):
        path = tmp_path / "src" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        files[name] = path
    out = tmp_path / "out"
    manifest = prepare.pack(files, out)
    assert len(manifest["chunks"]) > 2
    return out


def test_stash_then_join_gives_back_every_member(tmp_path, monkeypatch, stash):
    out = _packed(tmp_path, monkeypatch)
    for folder in sorted(out.glob("call-*")):
        runner.stash(folder)
    runner._bundle_members(json.loads((runner.CHUNKS / "manifest.json").read_text()))
    assert (runner.PARTS / "b" / "c.txt").read_text() == "y" * 30


def test_a_missing_chunk_names_the_call_that_carries_it(tmp_path, monkeypatch, stash, capsys):
    out = _packed(tmp_path, monkeypatch)
    runner.stash(out / "call-1")
    assert runner.main(["assemble"]) == 3
    err = capsys.readouterr().err.strip()
    assert err.startswith("gpu-twin: chunk-2 of") and "carry .gpu-twin/call-2" in err and "\n" not in err


def test_a_damaged_chunk_is_refused_at_stash(tmp_path, monkeypatch, stash, capsys):
    out = _packed(tmp_path, monkeypatch)
    chunk = out / "call-2" / "chunk-2"
    chunk.write_bytes(b"!" + chunk.read_bytes()[1:])
    assert runner.main(["stash", str(out / "call-2")]) == 3
    assert "sha256 differs from its manifest" in capsys.readouterr().err


def test_assemble_with_nothing_stashed_says_what_to_carry(stash, capsys):
    assert runner.main(["assemble"]) == 3
    assert "carry .gpu-twin/call-1" in capsys.readouterr().err


def _completion(ids: list[int], margin: float = 1.0) -> dict:
    return {"prompt": 0, "token_ids": ids, "top": [[[t, 0.0], [t + 1, -margin]] for t in ids], "seconds": 0.1}


def _runs(greedy: list[int], seeded: list[list[int]], margin: float = 1.0) -> dict:
    return {
        "greedy": {"completions": [_completion(greedy, margin)], "metrics_after": ""},
        "seeded": {"runs": [[_completion(s)] for s in seeded], "metrics_after": ""},
    }


@pytest.mark.parametrize(
    ("greedy", "margin", "seeded", "lossless"),
    [
        ([1, 2, 3], 1.0, [[5, 6], [5, 6]], True),
        ([1, 2, 4], 1.0, [[5, 6], [5, 6]], False),  # greedy differs away from a tie
        ([1, 2, 4], 1e-6, [[5, 6], [5, 6]], True),  # ... at a numeric tie
        ([1, 2, 3], 1.0, [[5, 6], [5, 7]], False),  # the same seeds gave other tokens
    ],
)
def test_lossless_verdicts_follow_the_cpu_twins_rules(greedy, margin, seeded, lossless):
    reference = _runs([1, 2, 3], [[5, 6], [5, 6]], margin)
    verdict = analyse.lossless("x", _runs(greedy, seeded), reference)
    assert verdict["lossless"] is lossless


# -- the documents prepare.py and the runner write, read back with plain checks ---------------
@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            '{"bundle_sha256": "ab", "chunks": "chunk-1", "members": {}}',
            "manifest.json.chunks: must be a JSON array, not str",
        ),
        ('{"bundle_sha256": "ab", "members": {}}', "manifest.json: missing field 'chunks'"),
        (
            '{"bundle_sha256": "ab", "chunks": [{"name": "chunk-1"}], "members": {}}',
            "chunks[0]: missing field 'sha256'",
        ),
        ("PK\x03\x04 not json at all", "manifest.json: not JSON (Expecting value: line 1 column 1 (char 0))"),
    ],
)
def test_a_damaged_manifest_is_one_line_and_exit_3(tmp_path, stash, capsys, text, says):
    folder = tmp_path / "call-1"
    folder.mkdir()
    (folder / "manifest.json").write_text(text)
    assert runner.main(["stash", str(folder)]) == 3
    err = capsys.readouterr().err.strip()
    assert err.startswith("gpu-twin: ") and says in err and "\n" not in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    ("plan", "says"),
    [
        (
            {"recipe": "r", "engine": "0.34.0", "commit": "c", "models": {"script": "s", "args": "x"}, "configs": {}},
            "models.args: must be a JSON array, not str",
        ),
        (
            {"recipe": "r", "engine": "0.34.0", "commit": "c", "models": {"script": "s", "args": []}},
            "missing field 'configs'",
        ),
    ],
)
def test_a_damaged_plan_is_refused_naming_the_field(tmp_path, plan, says):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    with pytest.raises(runner.PartProblem, match=re.escape(f"{path}: {says}")):
        runner.read_plan(path)
    path.write_text("{")
    with pytest.raises(runner.PartProblem, match=r"plan\.json: not JSON \("):
        runner.read_plan(path)


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        (
            {"date": "2026-01-01", "plan": {"commit": 1, "recipe": "r", "engine": "e"}, "configs": {}},
            "plan.commit: must be a JSON string",
        ),
        ({"date": "2026-01-01", "plan": {"commit": "c", "recipe": "r", "engine": "e"}}, "missing field 'configs'"),
        (
            {"date": "2026-01-01", "plan": {"commit": "c", "recipe": "r", "engine": "e"}, "configs": {}},
            "configs: no runs",
        ),
        (
            {"date": "2026-01-01", "plan": {"commit": "c", "recipe": "r", "engine": "e"}, "configs": {"spec": {}}},
            "configs: no 'spec-off' run to judge 'spec' against",
        ),
        (
            {"date": "2026-01-01", "plan": {"commit": "c", "recipe": "r", "engine": "e"}, "configs": {"mtp-av": {}}},
            "configs: no 'mtp-off' run to judge 'mtp-av' against",
        ),
        ("not json", "not JSON ("),
    ],
)
def test_analyse_refuses_a_damaged_results_document_in_one_line(tmp_path, doc, says):
    path = tmp_path / "gpu-twin-results.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    with pytest.raises(SystemExit) as exc:
        analyse.main([str(path), "--out", str(tmp_path / "out")])
    assert str(exc.value.code).startswith(f"gpu-twin: {path}: ") and says in str(exc.value.code)
    assert "\n" not in str(exc.value.code)


def test_kiln_av_counters_over_a_load_give_calls_survival_and_hook_time():
    before = {"av_steps": 10.0, "av_survival_raw": 1.0, "av_survival_corrected": 1.5, "av_hook_timed": 10.0}
    after = {
        "av_steps": 30.0,
        "av_survival_raw": 5.0,
        "av_survival_corrected": 7.5,
        "av_hook_timed": 30.0,
        "av_hook_seconds": 0.0004,
        "av_hook_host_seconds": 0.0016,
    }
    row = analyse.kiln_av(before, after)
    assert row["av_calls"] == 20
    assert row["av_survival_raw"] == pytest.approx(4.0) and row["av_survival_corrected"] == pytest.approx(6.0)
    assert row["av_hook_us_gpu"] == pytest.approx(20.0) and row["av_hook_us_host"] == pytest.approx(80.0)
    # no kiln-av calls in the load (av, or a configuration without it): nothing to report
    assert analyse.kiln_av(after, after) == {}
    assert analyse.kiln_av({}, {"proposed": 5.0}) == {}
