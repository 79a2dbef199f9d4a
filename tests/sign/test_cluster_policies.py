"""The cluster policies in docs/supply-chain.md, validated against the published CRD
schemas of Kyverno (ClusterPolicy) and sigstore policy-controller (ClusterImagePolicy),
stored in tests/fixtures/k8s (sources in its README), unknown fields refused; and they
pin what kiln writes: a P-256 public key, no transparency log, kiln's predicate types."""

from __future__ import annotations

import functools
import re

import jsonschema
import pytest
import yaml
from kilntest import FIXTURES, REPO

from kiln.domain.signing import cosign, keys

DOC = REPO / "docs" / "supply-chain.md"
CRDS = {
    ("kyverno.io/v1", "ClusterPolicy"): ("kyverno.io_clusterpolicies.yaml", "v1"),
    ("policy.sigstore.dev/v1beta1", "ClusterImagePolicy"): ("policy.sigstore.dev_clusterimagepolicies.yaml", "v1beta1"),
}
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the Kyverno CRD is 1.4 MB


def _strict(schema):
    """additionalProperties: false on every object schema that lists its properties (an API
    server would prune unknown fields silently; a misspelt field must fail here)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if (
        schema.get("type") == "object"
        and "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def validator(api_version: str, kind: str) -> jsonschema.Draft7Validator:
    name, version = CRDS[(api_version, kind)]
    crd = yaml.load((FIXTURES / "k8s" / name).read_text(), Loader=_LOADER)
    assert crd["spec"]["names"]["kind"] == kind and api_version.startswith(crd["spec"]["group"] + "/")
    [v] = [v for v in crd["spec"]["versions"] if v["name"] == version]
    assert v["served"]
    return jsonschema.Draft7Validator(_strict(v["schema"]["openAPIV3Schema"]))


def policies() -> dict[str, dict]:
    found = {}
    for block in re.findall(r"^```yaml\n(.*?)^```", DOC.read_text(), re.DOTALL | re.MULTILINE):
        doc = yaml.safe_load(block)
        if isinstance(doc, dict) and (doc.get("apiVersion"), doc.get("kind")) in CRDS:
            found[doc["kind"]] = doc
    return found


def _errors(doc: dict) -> list[str]:
    body = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind", "metadata")}
    return [
        f"{e.message} at {list(e.absolute_path)}" for e in validator(doc["apiVersion"], doc["kind"]).iter_errors(body)
    ]


def test_the_doc_has_both_policies():
    assert set(policies()) == {"ClusterPolicy", "ClusterImagePolicy"}


@pytest.mark.parametrize("kind", ["ClusterPolicy", "ClusterImagePolicy"])
def test_policy_is_valid_against_its_crd(kind):
    assert _errors(policies()[kind]) == []


@pytest.mark.parametrize(
    "kind, path, bad",
    [
        ("ClusterPolicy", ["spec", "rules", 0, "verifyImages", 0], {"failureAction": "Block"}),
        (
            "ClusterPolicy",
            ["spec", "rules", 0, "verifyImages", 0, "attestors", 0, "entries", 0, "keys"],
            {"ignoreTlog": True},
        ),
        ("ClusterImagePolicy", ["spec", "authorities", 0, "key"], {"publicKey": "x"}),
        ("ClusterImagePolicy", ["spec"], {"mode": 3}),
    ],
)
def test_the_validation_refuses_a_wrong_field(kind, path, bad):
    """The schema check can fail: a misspelt field or a wrong value is an error."""
    doc = yaml.safe_load(yaml.safe_dump(policies()[kind]))
    node = doc
    for part in path:
        node = node[part]
    node.update(bad)
    assert _errors(doc)


def _pem(text: str, tmp_path) -> keys.PublicKey:
    path = tmp_path / "policy.pub"
    path.write_text(text.strip() + "\n")
    return keys.load_public_key(path)


def test_kyverno_policy_pins_a_key_without_transparency_log_and_kilns_attestations(tmp_path):
    rule = policies()["ClusterPolicy"]["spec"]["rules"][0]["verifyImages"][0]
    entry = rule["attestors"][0]["entries"][0]["keys"]
    _pem(entry["publicKeys"], tmp_path)  # a P-256 public key, as `kiln keys generate` writes
    assert entry["rekor"] == {"ignoreTlog": True} and entry["ctlog"] == {"ignoreSCT": True}
    assert {a["predicateType"] for a in rule["attestations"]} == {cosign.CYCLONEDX_PREDICATE, cosign.SLSA_PROVENANCE_V1}
    assert rule["failureAction"] == "Enforce" and rule["required"] is True


def test_policy_controller_policy_pins_a_key_without_transparency_log_and_kilns_attestations(tmp_path):
    from kiln.domain.supplychain.provenance import _BUILD_TYPE as BUILD_TYPE

    [authority] = policies()["ClusterImagePolicy"]["spec"]["authorities"]
    _pem(authority["key"]["data"], tmp_path)
    assert "ctlog" not in authority and "keyless" not in authority
    assert {a["predicateType"] for a in authority["attestations"]} == {
        cosign.CYCLONEDX_PREDICATE,
        cosign.SLSA_PROVENANCE_V1,
    }
    assert BUILD_TYPE in authority["attestations"][1]["policy"]["data"]
