"""Package URLs (purl-spec) for the components kiln lists: `pkg:deb`, `pkg:pypi`, `pkg:oci`,
`pkg:docker`. Scanners (Trivy, Grype) match advisories on these, so their spelling
follows the spec: percent-encoded name and version, qualifiers sorted by key."""

from __future__ import annotations

import re
from urllib.parse import quote

from kiln.basics import image_ref


def _enc(text: str, safe: str = ":") -> str:
    return quote(text, safe=safe)


def _purl(
    type_: str,
    name: str,
    version: str | None = None,
    *,
    namespace: str | None = None,
    qualifiers: dict[str, str] | None = None,
) -> str:
    out = f"pkg:{type_}/"
    if namespace:
        out += "/".join(_enc(seg) for seg in namespace.split("/")) + "/"
    out += _enc(name)
    if version:
        out += "@" + _enc(version)
    quals = {k.lower(): v for k, v in (qualifiers or {}).items() if v}
    if quals:
        out += "?" + "&".join(f"{k}={_enc(v, safe=':/')}" for k, v in sorted(quals.items()))
    return out


def _pypi_name(name: str) -> str:
    """purl-spec pypi: lowercase, `_` (and PEP 503's other separators) as `-`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pypi(name: str, version: str) -> str:
    """The package URL of a PyPI distribution version."""
    return _purl("pypi", _pypi_name(name), version)


def deb(name: str, version: str, arch: str, distro: str | None, upstream: str | None = None) -> str:
    """`upstream` is the source package (and `@version` when it differs): Debian's
    security tracker files advisories per source package, which is what scanners match."""
    return _purl(
        "deb",
        name,
        version,
        namespace="debian",
        qualifiers={"arch": arch, "distro": distro or "", "upstream": upstream or ""},
    )


def oci(repository: str, manifest_digest: str, *, arch: str | None = None) -> str:
    """`pkg:oci/NAME@sha256:...?repository_url=HOST/PATH/NAME`: the version is the
    manifest digest, NAME the repository's last path segment."""
    return _purl(
        "oci",
        repository.rsplit("/", 1)[-1],
        manifest_digest,
        qualifiers={"arch": arch or "", "repository_url": repository},
    )


def docker(ref: str) -> str:
    """`pkg:docker/NAMESPACE/NAME@VERSION` for an image reference: the version is its
    digest when pinned (`repo@sha256:...`), else its tag."""
    parts = image_ref.parse(ref)
    namespace, _, last = parts.name.rpartition("/")
    return _purl("docker", last, parts.digest or parts.tag or None, namespace=namespace or None)
