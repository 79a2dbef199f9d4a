"""`kiln keys generate` / `kiln keys fingerprint`: cosign-compatible signing keys.

`_generate` writes PREFIX.key (the ECDSA P-256 private key, encrypted as cosign encrypts
it; mode 0600) and PREFIX.pub (its public key), the files `cosign generate-key-pair`
writes; cosign, Kyverno and sigstore's policy-controller read them as they read
cosign's own. The password comes from KILN_SIGNING_PASSWORD / COSIGN_PASSWORD or is typed
(twice); there is no flag for it. stdout carries the public key's fingerprint, the one
value records and policies may name the key by.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TypedDict

from kiln.basics import log
from kiln.basics.errors import SigningPasswordInvalid
from kiln.commands.options import Subparsers
from kiln.domain.signing import keys
from kiln.infra import key_password


class _KeyPairDocument(TypedDict):
    """`kiln keys generate --json` (docs/cli-json.md; no schema file)."""

    private_key: str
    public_key: str
    fingerprint: str


class _FingerprintDocument(TypedDict):
    """`kiln keys fingerprint PUB --json`."""

    public_key: str
    fingerprint: str


def _generate(prefix: Path, *, as_json: bool = False) -> keys.KeyPairFiles:
    target = prefix.with_name(prefix.name + ".key")
    password = key_password.read(what=f"the new key {target}", confirm=True)
    if not password:
        raise SigningPasswordInvalid(
            f"refusing to write {target} with an empty password",
            hint="anyone who copies an unencrypted key can sign as you; set KILN_SIGNING_PASSWORD or type a password",
        )
    files = keys.write_key_pair(prefix, password)
    if as_json:
        log.emit_json(
            _KeyPairDocument(
                private_key=str(files.private), public_key=str(files.public), fingerprint=files.fingerprint
            )
        )
    else:
        log.summary(
            "generated a signing key pair (ECDSA P-256, cosign format)",
            {
                "private key": f"{files.private} (encrypted, mode 0600: keep it secret)",
                "public key": f"{files.public} (give this to verifiers and cluster policies)",
                "fingerprint": files.fingerprint,
            },
        )
        log.out.print(files.fingerprint, markup=False)
    return files


def _cmd_generate(args: argparse.Namespace) -> int:
    _generate(Path(args.output_key_prefix), as_json=args.json)
    return 0


def _cmd_fingerprint(args: argparse.Namespace) -> int:
    public = keys.load_public_key(Path(args.public_key))
    if args.json:
        log.emit_json(_FingerprintDocument(public_key=str(args.public_key), fingerprint=public.fingerprint))
    else:
        log.out.print(public.fingerprint, markup=False)
    return 0


def register(sub: Subparsers) -> None:
    """Add `kiln keys generate` and `kiln keys fingerprint` to the `kiln` subparsers."""
    p = sub.add_parser("keys", help="cosign-compatible signing keys (generate, fingerprint)")
    ksub = p.add_subparsers(dest="keys_command", metavar="{generate,fingerprint}", required=True)
    g = ksub.add_parser(
        "generate",
        help="write an encrypted private key and its public key, as "
        "`cosign generate-key-pair` does (password from KILN_SIGNING_PASSWORD "
        "or typed)",
    )
    g.add_argument(
        "--output-key-prefix",
        default="cosign",
        metavar="PREFIX",
        help="write PREFIX.key and PREFIX.pub (default: cosign, as cosign names them); "
        "existing files are never overwritten",
    )
    g.add_argument("--json", action="store_true", help="print {private_key, public_key, fingerprint} on stdout")
    g.set_defaults(func=_cmd_generate)
    f = ksub.add_parser("fingerprint", help="the sha256 fingerprint of a public key (what records keep)")
    f.add_argument("public_key", metavar="PUB")
    f.add_argument("--json", action="store_true", help="print {public_key, fingerprint} on stdout")
    f.set_defaults(func=_cmd_fingerprint)
