"""`kiln verify REF --key PUB`: is the image under REF the one the key's holder signed?

Checks, against the registry and nothing else (no transparency log, no OIDC: the
offline, key-pair mode of cosign): the signature in `sha256-<hex>.sig` over the payload,
the payload's manifest digest against the image's, its repository identity, then the
SBOM and provenance attestations in `sha256-<hex>.att` (their DSSE signatures and in-toto
subjects). Every kind of failure is one line and its own exit code (80-88, see
`kiln --help`'s error list in the README); `--json` prints the verification document.

REF is HOST[:PORT]/REPOSITORY:TAG, ...@sha256:DIGEST, or ...:TAG@sha256:DIGEST (then the
tag must still point at that digest: a moved tag fails).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kiln.basics import log
from kiln.commands.options import Subparsers
from kiln.domain.signing import keys, signatures
from kiln.infra import credentials
from kiln.infra.registry import RegistryClient


def verify(
    ref: str,
    key_path: Path,
    *,
    plain_http: bool = False,
    password_stdin: bool = False,
    signature_only: bool = False,
    signed_repository: str | None = None,
    creds: credentials.Credentials | None = None,
) -> signatures.Verification:
    """The verification of the image under `ref` against the public key at `key_path`:
    its signature, and unless `signature_only` its SBOM and provenance attestations."""
    public = keys.load_public_key(key_path)  # a bad key fails before any network
    image = signatures.parse_reference(ref, plain_http=plain_http)
    if creds is None:
        creds = credentials.resolve(image.target.host, password_stdin=password_stdin)
    client = RegistryClient(image.target, creds)
    client.check_access()
    digest = signatures.resolve(client, image)
    required = () if signature_only else signatures.KILN_PREDICATES
    return signatures.verify_image(
        client, digest, public, required=required, reference=str(image), signed_repository=signed_repository
    )


def _cmd_verify(args: argparse.Namespace) -> int:
    result = verify(
        args.ref,
        Path(args.key),
        plain_http=args.plain_http,
        password_stdin=args.password_stdin,
        signature_only=args.signature_only,
        signed_repository=args.signed_repository,
    )
    if args.json:
        log.emit_json(result.as_dict())
        return 0
    rows: dict[str, object] = {
        "digest": result.digest,
        "key": result.key_fingerprint,
        "signature": f"{result.signature_tag} (signed for {result.signed_identity})",
    }
    for check in result.attestations:
        rows[f"attestation {check.predicate_type}"] = "verified" if check.verified else f"NOT verified: {check.problem}"
    log.summary(f"verified {result.reference}", rows)
    log.out.print(f"{result.repository}@{result.digest}", markup=False)  # stdout: what to pin
    return 0


def register(sub: Subparsers) -> None:
    """Add `kiln verify` to the `kiln` subparsers."""
    p = sub.add_parser(
        "verify", help="check an image's cosign signature and its SBOM/provenance attestations against a public key"
    )
    p.add_argument("ref", metavar="REF", help="HOST[:PORT]/REPOSITORY:TAG, ...@sha256:DIGEST or ...:TAG@sha256:DIGEST")
    p.add_argument(
        "--key",
        required=True,
        metavar="PUB",
        help="the signer's public key (PEM, as `kiln keys generate` or `cosign generate-key-pair` writes)",
    )
    p.add_argument(
        "--signature-only",
        action="store_true",
        help="check the signature only, not the SBOM and provenance attestations",
    )
    p.add_argument(
        "--signed-repository",
        metavar="HOST/REPOSITORY",
        help="the repository the signature must name, when it is not REF's (an image copied to a mirror "
        "keeps the identity it was signed for)",
    )
    p.add_argument("--plain-http", action="store_true", help="talk HTTP, not HTTPS (same as writing http://HOST)")
    p.add_argument(
        "--password-stdin",
        action="store_true",
        help=f"read the registry password from stdin (user from ${credentials.USER_ENV})",
    )
    p.add_argument("--json", action="store_true", help="print the verification as one JSON document")
    p.set_defaults(func=_cmd_verify)
