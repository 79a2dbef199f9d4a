"""Image references split into their parts: `[HOST[:PORT]/]PATH[:TAG][@DIGEST]`.

One reading for every place kiln takes a reference apart (tagging, pushing, pinning a
base image, purls, signatures), with docker's rules: the tag is after the last `:` of
the last path component (a registry port is no tag), the digest after `@`, and the
first component names a registry only when it holds a dot or a port, or is localhost.
This splits; it does not validate. Callers that take a reference from a user check its
parts (`kiln verify`: kiln.domain.signing.signatures.parse_reference)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class _ImageReference:
    name: str  # [HOST[:PORT]/]PATH: what docker calls the repository
    tag: str | None
    digest: str | None  # sha256:<hex>, as written

    @property
    def host(self) -> str | None:
        """The registry the name starts with, None for a name with none (docker.io)."""
        first, slash, _ = self.name.partition("/")
        if slash and ("." in first or ":" in first or first == "localhost" or first.startswith("[")):
            return first
        return None

    @property
    def path(self) -> str:
        """The repository path inside its registry (the name without its host)."""
        host = self.host
        return self.name[len(host) + 1 :] if host is not None else self.name

    def pinned(self, digest: str) -> str:
        """`NAME@digest`: the tag only labels an image, the digest is what is pulled."""
        return f"{self.name}@{digest}"

    def __str__(self) -> str:
        return (
            self.name
            + (f":{self.tag}" if self.tag is not None else "")
            + (f"@{self.digest}" if self.digest is not None else "")
        )


def parse(ref: str) -> _ImageReference:
    """`ref` taken apart (nothing is checked: see the module's note)."""
    rest, at, digest = ref.partition("@")
    slash, colon = rest.rfind("/"), rest.rfind(":")
    if colon > slash:
        return _ImageReference(rest[:colon], rest[colon + 1 :], digest if at else None)
    return _ImageReference(rest, None, digest if at else None)
