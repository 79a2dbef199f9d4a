"""The SBOM's licences: every SPDX id kiln knows is on the SPDX list, expressions recognised
only when made of known ids, classifiers giving ids only for one licence version."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kiln.domain.supplychain import licences


# -- licences ---------------------------------------------------------------------------------------
def _spdx_list() -> set[str]:
    import cyclonedx  # late: only for the location of its bundled schemas

    schema = Path(cyclonedx.__file__).parent / "schema" / "_res" / "spdx.SNAPSHOT.schema.json"
    return set(json.loads(schema.read_text())["enum"])


def test_every_spdx_id_kiln_knows_is_on_the_spdx_list():
    known = _spdx_list()
    assert known >= licences._SPDX_IDS, licences._SPDX_IDS - known
    assert set(licences._CLASSIFIER_IDS.values()) <= known
    assert known >= licences._SPDX_EXCEPTIONS  # the bundled list carries the exception ids too


@pytest.mark.parametrize(
    "text,expected",
    [
        ("MIT", "MIT"),
        ("MIT OR Apache-2.0", "MIT OR Apache-2.0"),
        ("(MIT AND BSD-3-Clause) OR ISC", "(MIT AND BSD-3-Clause) OR ISC"),
        ("Apache-2.0 WITH LLVM-exception", "Apache-2.0 WITH LLVM-exception"),
        ("GPL-2.0-or-later", "GPL-2.0-or-later"),
        ("BSD", None),
        ("Apache 2.0", None),
        ("MIT OR", None),
        ("MIT AND (ISC", None),
        ("MIT WITH ISC", None),
        ("3-Clause BSD License", None),
        ("", None),
    ],
)
def test_spdx_expressions_recognised_only_when_made_of_known_ids(text, expected):
    assert licences._spdx_expression(text) == expected


def test_classifiers_give_ids_only_for_one_licence_version():
    lic = licences.declared_licences(
        {
            "license": "Apache 2.0",
            "classifiers": [
                "License :: OSI Approved :: Apache Software License",
                "License :: OSI Approved :: MIT License",
                "License :: OSI Approved",
            ],
        }
    )
    assert (lic.expression, lic.ids, lic.names) == (None, ("MIT",), ("Apache 2.0", "Apache Software License"))
    assert licences.declared_licences({"license": "UNKNOWN"}) == licences.DeclaredLicences(None)
