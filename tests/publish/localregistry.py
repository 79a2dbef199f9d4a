"""A real distribution registry (Debian's `docker-registry`) on 127.0.0.1 with htpasswd
auth, for the publish tests and the end-to-end test.

The Docker daemon talks plain HTTP to 127.0.0.0/8 registries by default, so no daemon
configuration is needed. Each instance owns its storage directory, so a test can stop
the registry, look at exactly what was left behind, and start it again on the same port.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import urljoin

import requests

BINARY = "docker-registry"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MANIFEST_ACCEPT = ", ".join(  # one media type a line  # noqa: FLY002
    (
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def available() -> str | None:
    """Why a registry cannot run here, or None."""
    for tool in (BINARY, "htpasswd"):
        if shutil.which(tool) is None:
            return f"{tool} not installed (apt-get install docker-registry apache2-utils)"
    return None


class LocalRegistry:
    def __init__(self, workdir: Path, port: int | None = None, log_level: str = "warn"):
        self.log_level = log_level  # "info": every request is logged with the user it authenticated as
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.host = f"127.0.0.1:{self.port}"
        # random, so a scan for them cannot hit anything but a real leak
        self.user = "kilnuser" + secrets.token_hex(4)
        self.password = "kilnpw-" + secrets.token_hex(12)
        self.storage = self.dir / "data"
        self.proc: subprocess.Popen | None = None
        self._write_config()

    def _write_config(self) -> None:
        htpasswd = subprocess.run(
            ["htpasswd", "-Bbn", self.user, self.password], capture_output=True, text=True, check=True
        ).stdout
        (self.dir / "htpasswd").write_text(htpasswd)
        (self.dir / "config.yml").write_text(
            "version: 0.1\n"
            f"log: {{level: {self.log_level}}}\n"
            f"storage: {{filesystem: {{rootdirectory: {self.storage}}}}}\n"
            f"http: {{addr: '{self.host}'}}\n"
            f"auth: {{htpasswd: {{realm: kiln-test, path: {self.dir / 'htpasswd'}}}}}\n"
        )

    # -- process ----------------------------------------------------------------------
    def start(self, timeout: float = 15.0) -> LocalRegistry:
        log = (self.dir / "registry.log").open("ab")
        self.proc = subprocess.Popen(
            [BINARY, "serve", str(self.dir / "config.yml")], stdout=log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"registry exited: {(self.dir / 'registry.log').read_text()[-2000:]}")
            try:
                if requests.get(f"http://{self.host}/v2/", timeout=1).status_code == 401:
                    return self
            except requests.ConnectionError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"registry on {self.host} did not come up")

    def stop(self) -> None:
        """SIGKILL: a registry that dies, not one that shuts down politely."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    # -- looking inside -------------------------------------------------------------------
    @property
    def auth(self) -> tuple[str, str]:
        return self.user, self.password

    def env(self) -> dict[str, str]:
        return {"KILN_REGISTRY_USER": self.user, "KILN_REGISTRY_PASSWORD": self.password}

    def secrets(self) -> list[str]:
        """Every form the credentials could leak in."""
        pair = f"{self.user}:{self.password}"
        return [self.password, pair, base64.b64encode(pair.encode()).decode()]

    def tags(self, repo: str) -> list[str]:
        resp = requests.get(f"http://{self.host}/v2/{repo}/tags/list", auth=self.auth, timeout=10)
        if resp.status_code == 404:
            return []
        resp.raise_for_status()
        return sorted(resp.json().get("tags") or [])

    def manifest(self, repo: str, ref: str) -> tuple[str, dict] | None:
        resp = requests.get(
            f"http://{self.host}/v2/{repo}/manifests/{ref}",
            auth=self.auth,
            headers={"Accept": MANIFEST_ACCEPT},
            timeout=10,
        )
        if resp.status_code == 404:
            return None
        resp.raise_for_status()
        return resp.headers["Docker-Content-Digest"], resp.json()

    def blob(self, repo: str, digest: str) -> bytes:
        resp = requests.get(f"http://{self.host}/v2/{repo}/blobs/{digest}", auth=self.auth, timeout=60)
        resp.raise_for_status()
        return resp.content

    def push_tiny(self, repo: str, tag: str) -> tuple[str, bytes]:
        """A one-layer image written straight through the API (no daemon): (digest, manifest bytes)."""
        layer = gzip.compress(b"kiln test layer " + secrets.token_bytes(8))
        config = json.dumps(
            {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}
        ).encode()
        descs = [
            self._upload(repo, data, media)
            for data, media in (
                (config, "application/vnd.oci.image.config.v1+json"),
                (layer, "application/vnd.oci.image.layer.v1.tar+gzip"),
            )
        ]
        body = json.dumps(
            {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": descs[0], "layers": descs[1:]}
        ).encode()
        resp = requests.put(
            f"http://{self.host}/v2/{repo}/manifests/{tag}",
            data=body,
            auth=self.auth,
            headers={"Content-Type": OCI_MANIFEST},
            timeout=10,
        )
        resp.raise_for_status()
        return resp.headers["Docker-Content-Digest"], body

    def _upload(self, repo: str, data: bytes, media: str) -> dict:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        start = requests.post(f"http://{self.host}/v2/{repo}/blobs/uploads/", auth=self.auth, timeout=10)
        start.raise_for_status()
        location = urljoin(f"http://{self.host}/", start.headers["Location"])
        done = requests.put(
            location,
            params={"digest": digest},
            data=data,
            auth=self.auth,
            timeout=10,
            headers={"Content-Type": "application/octet-stream"},
        )
        done.raise_for_status()
        return {"mediaType": media, "digest": digest, "size": len(data)}

    def log_text(self) -> str:
        return (self.dir / "registry.log").read_text(errors="replace")

    def blob_files(self) -> list[Path]:
        return sorted(self.storage.rglob("blobs/sha256/*/*/data"))

    def uploads_started(self) -> bool:
        """True once the registry holds a partial layer upload (the push is midway)."""
        return any(self.storage.rglob("_uploads/*/data"))

    def stored_bytes(self):
        """Every file the registry stored, layers decompressed (a leak in a layer is only
        visible in the tar, not in the gzip stream)."""
        for path in sorted(p for p in self.storage.rglob("*") if p.is_file()):
            data = path.read_bytes()
            if data[:2] == b"\x1f\x8b":
                try:  # the except line says why it passes  # noqa: SIM105
                    data = gzip.decompress(data)
                except (OSError, EOFError):
                    pass  # a truncated upload: scan the raw bytes
            yield path, data
