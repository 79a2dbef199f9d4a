"""Errors of signing and verification: one class per kind of failure, so that a script
or an admission hook can tell "nobody signed this" from "somebody tampered with this"."""

from __future__ import annotations

from kiln.basics.errors.base import KilnError


class SigningKeyInvalid(KilnError):
    """A key file kiln cannot use: missing, not a cosign/PEM key, an unsupported algorithm,
    a key pair that would overwrite files, or a key other than the one the recipe pins."""

    exit_code = 80
    hint = (
        "`kiln keys generate` writes a cosign-compatible pair (ECDSA P-256); pass the .key to --sign, the .pub to --key"
    )


class SigningPasswordInvalid(KilnError):
    """The private key's password is wrong or could not be read."""

    exit_code = 81
    hint = "set KILN_SIGNING_PASSWORD (or COSIGN_PASSWORD), or type the password when asked; never on the command line"


class SignatureMissing(KilnError):
    """No signature (`sha256-<hex>.sig`) or no attestation of a required type for the digest."""

    exit_code = 82
    hint = "publish it with `kiln publish NAME --sign KEY`; an image whose tag moved needs a signature of its own"


class SignatureInvalid(KilnError):
    """A signature or DSSE envelope does not verify: the payload, the signature or the key changed."""

    exit_code = 83
    hint = "do not deploy it: the signed bytes were altered, or the key is not the one that signed"


class SignedByOtherKey(KilnError):
    """The signature names (and verifies with) another key than the one given."""

    exit_code = 84
    hint = "verify with the public key that signed it (see its fingerprint above), or re-sign with yours"


class SignedDigestMismatch(KilnError):
    """The signature is genuine but for another image digest (a tag moved, or a signature copied)."""

    exit_code = 85
    hint = (
        "the image under this reference is not the one that was signed; pin the digest you verified (REPO@sha256:...)"
    )


class SignedIdentityMismatch(KilnError):
    """The signature is genuine but names another repository (a signature copied across repositories)."""

    exit_code = 86
    hint = "verify the image in the repository it was signed for, or re-sign it for this one"


class SignatureMalformed(KilnError):
    """A `.sig`/`.att` manifest, payload or DSSE envelope that is not in cosign's format."""

    exit_code = 87
    hint = (
        "the signature artefacts in the registry are damaged or were not written by cosign or kiln; re-sign the image"
    )


class AttestationSubjectMismatch(KilnError):
    """A genuine attestation whose in-toto subject is another image digest."""

    exit_code = 88
    hint = "the SBOM/provenance attached here describes another image; re-attest this digest (`kiln publish --sign`)"


class SigningRequired(KilnError):
    """The recipe requires signatures (publish.require_signature) and no key was given."""

    exit_code = 89
    hint = "pass --sign KEY to publish, --key PUB to promote (or pin publish.public_key in the recipe)"
