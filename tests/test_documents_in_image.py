"""The in-image readers, plain checks (an image has no pydantic of kiln's): the launch probe,
the HF cache check, the SBOM reader and the patch applier refuse what they cannot read in one
line."""

from __future__ import annotations

import json

import pytest
from document_readers import write_at

from kiln.inimage import launch_arg_probe


# -- in-image readers: plain checks (an image has no pydantic of kiln's) ------------------------
@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"dump": "yes"}', "KILN_ARGPROBE: dump: must be true or false"),
        ('{"jobs": [{"env": {}}]}', "KILN_ARGPROBE: jobs[0]: missing field 'groups'"),
        ('{"jobs": [{"groups": [["serve", 5]]}]}', "KILN_ARGPROBE: jobs[0].groups: must be lists of strings"),
        ("serve --model x", "KILN_ARGPROBE: not JSON (Expecting value"),
    ],
)
def test_the_launch_probe_refuses_a_request_it_cannot_read_in_one_line(text, says):
    assert launch_arg_probe._read_request(
        '{"dump": true, "jobs": [{"groups": [["serve", "m"]], "env": {"A": "1"}}]}'
    ) == {"dump": True, "jobs": [{"groups": [["serve", "m"]], "env": {"A": "1"}}]}
    with pytest.raises(SystemExit) as exc:
        launch_arg_probe._read_request(text)
    assert str(exc.value.code).startswith(says) and "\n" not in str(exc.value.code)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            '[{"role": "target", "repo": "org/m", "revision": 7}]',
            "kiln-serve: MODELS_JSON[0].revision: must be a string",
        ),
        ('[{"role": "target", "repo": "org/m"}]', "kiln-serve: MODELS_JSON[0].revision: must be a string"),
        ('{"role": "target"}', "kiln-serve: MODELS_JSON: must be a JSON list"),
        ("org/m@main", "kiln-serve: MODELS_JSON: not JSON ("),
    ],
)
def test_the_hf_cache_check_refuses_models_it_cannot_read_in_one_line(text, says):
    from kiln.inimage import hf_cache

    [model] = hf_cache._read_models('[{"role": "target", "repo": "org/m", "revision": "' + "a" * 40 + '"}]')
    assert (model.repo, model.tokenizer) == ("org/m", True)
    with pytest.raises(SystemExit) as exc:
        hf_cache._read_models(text)
    assert str(exc.value.code).startswith(says) and "\n" not in str(exc.value.code)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ('["/models", 3]', "KILN_SBOM_MODEL_ROOTS: must be a JSON list of paths"),
        ("/models", "KILN_SBOM_MODEL_ROOTS: not JSON ("),
    ],
)
def test_the_sbom_reader_refuses_roots_it_cannot_read_in_one_line(monkeypatch, value, says):
    from kiln.inimage import sbom_reader

    monkeypatch.setenv("KILN_SBOM_MODEL_ROOTS", '["/models"]')
    assert sbom_reader._env_paths("KILN_SBOM_MODEL_ROOTS") == ["/models"]
    monkeypatch.setenv("KILN_SBOM_MODEL_ROOTS", value)
    with pytest.raises(SystemExit) as exc:
        sbom_reader._env_paths("KILN_SBOM_MODEL_ROOTS")
    assert str(exc.value.code).startswith(says) and "\n" not in str(exc.value.code)


@pytest.mark.parametrize(
    ("overlay", "manifest", "says"),
    [
        ({"name": 5, "series": None, "replacements": []}, None, "overlay.json: name: must be a string"),
        (
            {"name": "f", "series": None, "replacements": [{"target": "vllm/x.py", "file": "x.py"}]},
            None,
            "overlay.json: replacements[0]: must hold the strings target, file and upstream_sha256",
        ),
        ("{", None, "overlay.json: not JSON ("),
        ({"name": "f", "series": None, "replacements": []}, '{"patches": {}}', "patches.json: patches: must be a list"),
    ],
)
def test_the_patch_applier_refuses_a_document_it_cannot_read_with_exit_30(tmp_path, capsys, overlay, manifest, says):
    from kiln.inimage import patch_applier

    (tmp_path / "root").mkdir()
    write_at(
        tmp_path, "overlays/f/overlay.json", (overlay if isinstance(overlay, str) else json.dumps(overlay)).encode()
    )
    if manifest is not None:
        write_at(tmp_path, "patches.json", manifest.encode())
    code = patch_applier.main(
        [
            "apply-overlays",
            "--root",
            str(tmp_path / "root"),
            "--overlays",
            str(tmp_path / "overlays"),
            "--manifest-append",
            str(tmp_path / "patches.json"),
        ]
    )
    err = capsys.readouterr().err.splitlines()
    assert code == 30 and says in err[0] and len(err) == 2 and err[1].startswith("hint: "), err
