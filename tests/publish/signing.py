"""Helpers of the signed-publishing tests: the signing password, the registry's manifest
requests read back, signed publishes and `kiln verify` runs of the mini image."""

from __future__ import annotations

import re
import secrets
from pathlib import Path

import requests
from localregistry import OCI_MANIFEST, LocalRegistry
from pubtest import NAME

SIGNING_PASSWORD = "sign-pw-" + secrets.token_hex(8)  # random: a scan for it finds only real leaks
SIG = re.compile(r"^sha256-[0-9a-f]{64}\.(sig|att)$")


def signing_env(**extra) -> dict[str, str]:
    return {"KILN_SIGNING_PASSWORD": SIGNING_PASSWORD, "COSIGN_PASSWORD": "", **extra}


def put_manifest(
    reg: LocalRegistry, repo: str, tag: str, body: bytes, media_type: str = OCI_MANIFEST
) -> requests.Response:
    return requests.put(
        f"http://{reg.host}/v2/{repo}/manifests/{tag}",
        data=body,
        auth=reg.auth,
        timeout=10,
        headers={"Content-Type": media_type},
    )


def upload_blob(reg: LocalRegistry, repo: str, data: bytes) -> str:
    return reg._upload(repo, data, "application/octet-stream")["digest"]


def completed_manifest_requests(reg: LocalRegistry, repo: str) -> list[tuple[str, str]]:
    """(method, manifest reference) of every manifest request the registry completed, in order."""
    out = []
    for line in reg.log_text().splitlines():
        if 'msg="response completed"' not in line:
            continue
        method = re.search(r"http\.request\.method=(\w+)", line)
        uri = re.search(rf"http\.request\.uri=/v2/{re.escape(repo)}/manifests/(\S+)", line)
        if method and uri:
            out.append((method.group(1), uri.group(1)))
    return out


def sig_tag(digest: str, kind: str = "sig") -> str:
    return digest.replace(":", "-") + "." + kind


def publish_signed(mini, reg, ns: str, key: Path, *extra: str):
    mini.pass_smoke()
    result = mini.kiln(
        "publish", NAME, "--registry", f"{reg.host}/{ns}", "--sign", str(key), *extra, registry=reg, **signing_env()
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def run_verify(mini, reg, ref: str, key: Path, *extra: str):
    return mini.kiln("verify", ref, "--key", str(key), *extra, registry=reg)


def pinned_digest(result) -> str:
    return result.stdout.strip().splitlines()[-1].partition("@")[2]


def config_digest(reg, repo: str, tag: str) -> str:
    return reg.manifest(repo, tag)[1]["config"]["digest"]
