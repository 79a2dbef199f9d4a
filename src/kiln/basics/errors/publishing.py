"""Errors of publishing: registries, channels and tags, signing and verification, and
the supply-chain documents (SBOM, provenance)."""

from __future__ import annotations

from kiln.basics.errors.base import KilnError


class PushFailed(KilnError):
    """Pushing an image's layers or manifest to the registry failed."""

    exit_code = 9
    hint = "nothing was tagged in the registry; rerun `kiln publish` once the cause is fixed"


class RegistryUnreachable(KilnError):
    """The registry does not answer at the address given."""

    exit_code = 10
    hint = "check the registry address and that it is up (`curl https://HOST/v2/`, or http:// for a plain-HTTP one)"


class RegistryAuthFailed(KilnError):
    """The registry refused the credentials (or asked for some and none were given)."""

    exit_code = 11
    hint = (
        "set KILN_REGISTRY_USER / KILN_REGISTRY_PASSWORD (or `docker login`) with valid credentials"
    )


class NotSmokeTested(KilnError):
    """`kiln publish` of an image without a passing smoke record."""

    exit_code = 12
    hint = "run `kiln smoke NAME` first, or pass --skip-smoke-check (pushed only under a `-unsmoked` tag)"


# -- publishing (kiln publish / kiln promote) ---------------------------------------------
class RegistryInvalid(KilnError):
    """No registry given, or one that is not HOST[:PORT][/NAMESPACE]."""

    exit_code = 40
    hint = "pass --registry HOST[:PORT][/NAMESPACE] or set publish.registry in the recipe"


class ChannelInvalid(KilnError):
    """A channel publish cannot move: not in the recipe's publish.channels, or for an unsmoked image."""

    exit_code = 41
    hint = "use one of the recipe's publish.channels (default: experimental, stable)"


class ChannelEmpty(KilnError):
    """`kiln promote --from C` where the registry has no tag C in the repository."""

    exit_code = 42
    hint = "publish to that channel first: `kiln publish NAME --channel CHANNEL`"


class ManifestMismatch(KilnError):
    """What the registry returns is not what was pushed (digest or image id differ)."""

    exit_code = 43
    hint = "the registry (or a proxy in front of it) rewrote the manifest; no channel tag was moved"


class TagWriteFailed(KilnError):
    """The layers are pushed but the registry refused a tag (manifest PUT)."""

    exit_code = 44
    hint = "check the account may push tags to this repository; rerun `kiln publish` (layers are not re-sent)"


class RegistryRateLimited(KilnError):
    """The registry still answered 429 after the bounded retries (Retry-After honoured)."""

    exit_code = 45
    hint = "wait a few minutes and rerun (layers already up are not re-sent); authenticated accounts get higher limits"


class RegistryServerError(KilnError):
    """The registry answered 5xx on every bounded retry: it is up but failing."""

    exit_code = 46
    hint = (
        "the registry itself is failing (see its logs or status page); rerun once it answers again"
    )


class RecordInvalid(KilnError):
    """A record kiln reads back that is not in the shape its writer gives it (a smoke, build or publish record in the state folder, a measured build in docs/): damaged or edited, so not trusted.

    The message names the file and the field; nothing of the record is used."""

    exit_code = 47
    hint = (
        "move the file named away (kiln trusts no part of it) and redo what wrote it: `kiln smoke NAME` for a "
        "smoke record, `kiln build NAME` for a build record, `kiln publish NAME` for a publish record"
    )


class ImageNotPublished(KilnError):
    """`kiln render k8s` needs the image by digest and this recipe was never published."""

    exit_code = 71
    hint = "`kiln publish NAME` first (it records the digest), or pass --image REPO@sha256:..."


# -- signing and verification (80-89): one class per kind of failure, so that a script or
# an admission hook can tell "nobody signed this" from "somebody tampered with this"
class SigningKeyInvalid(KilnError):
    """A key file kiln cannot use: missing, not a cosign/PEM key, an unsupported algorithm,
    a key pair that would overwrite files, or a key other than the one the recipe pins."""

    exit_code = 80
    hint = "`kiln keys generate` writes a cosign-compatible pair (ECDSA P-256); pass the .key to --sign, the .pub to --key"


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
    hint = "the image under this reference is not the one that was signed; pin the digest you verified (REPO@sha256:...)"


class SignedIdentityMismatch(KilnError):
    """The signature is genuine but names another repository (a signature copied across repositories)."""

    exit_code = 86
    hint = "verify the image in the repository it was signed for, or re-sign it for this one"


class SignatureMalformed(KilnError):
    """A `.sig`/`.att` manifest, payload or DSSE envelope that is not in cosign's format."""

    exit_code = 87
    hint = "the signature artefacts in the registry are damaged or were not written by cosign or kiln; re-sign the image"


class AttestationSubjectMismatch(KilnError):
    """A genuine attestation whose in-toto subject is another image digest."""

    exit_code = 88
    hint = "the SBOM/provenance attached here describes another image; re-attest this digest (`kiln publish --sign`)"


class SigningRequired(KilnError):
    """The recipe requires signatures (publish.require_signature) and no key was given."""

    exit_code = 89
    hint = (
        "pass --sign KEY to publish, --key PUB to promote (or pin publish.public_key in the recipe)"
    )


# NOTE (sign branch): 88 and 89 are allocated to signing (80-89); these two came from the
# sbom branch as 88/89 and are renumbered 90/91 here until the integrator assigns them.
# -- supply chain (kiln sbom; the SBOM and provenance documents) ---------------------------
class SbomReadFailed(KilnError):
    """What an image holds could not be read (the in-image read failed): no SBOM is
    printed rather than one with parts missing (an unreadable engine lock is LockInvalid)."""

    exit_code = 96
    hint = "rerun with --debug; `docker run --rm --entrypoint python IMAGE -V` shows whether the image has a Python"


class SbomWriteFailed(KilnError):
    """`kiln sbom -o FILE` could not write FILE (nothing half-written is left there)."""

    exit_code = 97
    hint = "pick a writable path for -o, or leave -o out to print to stdout"
