"""The signing steps of `kiln publish --sign` and the verification step of `kiln promote`.

Kept out of usecases/publish.py so that publishing itself (pushes, tags, records) stays
one readable flow; publish calls three functions here:

- `signer_for` before anything moves: the private key, decrypted (a wrong password or a
  key other than the recipe's pinned `publish.public_key` fails before any push), or
  SigningRequired when the recipe requires signatures and no --sign was given;
- `sign_and_verify` after the push and before any consumer tag: signature and the SBOM
  and provenance attestations go up, are read back from the registry and verified with
  the public half of the key; only then does publish write the engine, channel and
  digest tags;
- `verify_for_promote` before a channel moves.

Only the public key's fingerprint reaches records and output.
"""

from __future__ import annotations

from pathlib import Path

from kiln.basics.errors import SigningKeyInvalid, SigningRequired
from kiln.domain.images.definitions import RecipeImage
from kiln.domain.publishing.publish_records import AttestationEntry, SignatureEvidence
from kiln.domain.recipes.recipe import LoadedRecipe
from kiln.domain.signing import keys, layer_checks, signatures
from kiln.domain.supplychain.attest import kiln_attestations
from kiln.domain.supplychain.image_subject import kiln_version
from kiln.infra import key_password
from kiln.infra.docker import DockerDaemon, Image
from kiln.infra.registry import RegistryClient
from kiln.usecases import progress

STAGING_SUFFIX = "-staging"  # the tag the daemon pushes under while signing (not a consumer tag)


def _required(loaded: LoadedRecipe) -> bool:
    pub = loaded.recipe.publish
    return bool(pub and pub.require_signature)


def _pinned_key(loaded: LoadedRecipe) -> keys.PublicKey | None:
    """The recipe's publish.public_key (relative to its folder), if it pins one."""
    pub = loaded.recipe.publish
    if not pub or not pub.public_key:
        return None
    path = (loaded.dir / pub.public_key).resolve()
    try:
        return keys.load_public_key(path)
    except SigningKeyInvalid as exc:
        exc.message = f"{loaded.where('publish', 'public_key')}: publish.public_key: {exc.message}"
        raise


def signer_for(loaded: LoadedRecipe, sign_key: Path | None, *, stdin_taken: str | None) -> keys.PrivateKey | None:
    """The private key to sign with (its password read once), or None when none is given
    and the recipe requires none; a key other than the pinned one is refused before
    anything moves."""
    if sign_key is None:
        if _required(loaded):
            raise SigningRequired(
                f"{loaded.where('publish', 'require_signature')}: publish.require_signature is "
                f"true; refusing to publish {loaded.name} unsigned (no --sign KEY)"
            )
        return None
    password = key_password.read(what=f"private key {sign_key}", stdin_taken=stdin_taken)
    key = keys.load_private_key(sign_key, password)
    pinned = _pinned_key(loaded)
    if pinned is not None and pinned.fingerprint != key.public.fingerprint:
        raise SigningKeyInvalid(
            f"{sign_key} is key {key.public.fingerprint}, but {loaded.name} pins "
            f"publish.public_key {pinned.source} ({pinned.fingerprint}); nothing was pushed",
            hint="sign with the key the recipe pins, or change publish.public_key in a reviewed commit",
        )
    progress.info(f"signing with {sign_key} (public key {key.public.fingerprint})")
    return key


def sign_and_verify(
    docker: DockerDaemon,
    client: RegistryClient,
    key: keys.PrivateKey,
    loaded: LoadedRecipe,
    recipe_image: RecipeImage,
    image: Image,
    digest: str,
) -> SignatureEvidence:
    """Sign and attest `digest`, then verify it from the registry; the record's part."""
    repository = layer_checks.identity(client.target)
    progress.step(f"signing {repository}@{digest}: SBOM, provenance, signature")
    attestations = kiln_attestations(docker, loaded, recipe_image, image, repository, digest)
    result = signatures.sign_image(client, digest, key, attestations, creator=f"kiln {kiln_version()}")
    if result.signature_reused:
        progress.info(f"{result.signature_tag} already holds a signature by this key; kept")
    # read back and check it all as a verifier would, before any consumer tag
    checked = signatures.verify_image(client, digest, key.public, required=result.predicate_types)
    progress.ok(
        f"signature and {len(result.predicate_types)} attestations verified from the registry "
        f"({result.signature_tag}, {result.attestation_tag})"
    )
    return SignatureEvidence(
        key_fingerprint=result.key_fingerprint,
        signature_tag=result.signature_tag,
        signature_manifest=result.signature_manifest,
        attestation_tag=result.attestation_tag,
        attestation_manifest=result.attestation_manifest,
        predicate_types=result.predicate_types,
        signature_reused=result.signature_reused,
        verified=True,
        attestations=_attestations(checked),
    )


def verify_for_promote(
    loaded: LoadedRecipe, client: RegistryClient, digest: str, key_path: Path | None
) -> SignatureEvidence | None:
    """Verification of the image a channel is about to point at: with --key, or the
    recipe's pinned key; required when publish.require_signature is set."""
    key = keys.load_public_key(key_path) if key_path is not None else _pinned_key(loaded)
    if key is None:
        if _required(loaded):
            raise SigningRequired(
                f"{loaded.where('publish', 'require_signature')}: publish.require_signature is "
                f"true; promote needs a key to verify {digest} with (--key PUB or "
                "publish.public_key)"
            )
        return None
    checked = signatures.verify_image(client, digest, key)
    progress.ok(f"{digest} verified with {key.source} ({key.fingerprint})")
    return SignatureEvidence(
        key_fingerprint=checked.key_fingerprint,
        signature_tag=checked.signature_tag,
        signature_manifest=checked.signature_manifest,
        attestation_tag=checked.attestation_tag,
        attestation_manifest=checked.attestation_manifest,
        verified=True,
        attestations=_attestations(checked),
    )


def _attestations(checked: signatures.Verification) -> list[AttestationEntry]:
    return [
        AttestationEntry(
            predicate_type=a.predicate_type, layer_digest=a.layer_digest, verified=a.verified, problem=a.problem
        )
        for a in checked.attestations
    ]
