"""The attestations a signed publish attaches: the image's SBOM and its SLSA provenance.

Both are in-toto Statements about the pushed manifest digest, signed into DSSE envelopes
by domain/signing/signatures.py. The SBOM (CycloneDX 1.6, read from the image's filesystem by
domain/supplychain/sbom.py) becomes the predicate of a Statement of predicate type
`https://cyclonedx.org/bom`, the type `cosign attest --type cyclonedx` uses (so `cosign
verify-attestation --type cyclonedx`, Kyverno's `type:` and policy-controller's
`predicateType:` find it); the provenance is domain/supplychain/provenance.py's Statement as it is
(predicate type `https://slsa.dev/provenance/v1`).
"""

from __future__ import annotations

from kiln.domain.images.definitions import RecipeImage
from kiln.domain.recipes.recipe import LoadedRecipe
from kiln.domain.signing import cosign
from kiln.domain.signing.signatures import Attestation
from kiln.domain.supplychain.provenance import build_provenance
from kiln.domain.supplychain.sbom import build_sbom
from kiln.infra.docker import DockerDaemon, Image


def kiln_attestations(
    docker: DockerDaemon, loaded: LoadedRecipe, recipe_image: RecipeImage, image: Image, repository: str, digest: str
) -> list[Attestation]:
    """SBOM and provenance of `image`, pushed as `repository@digest`."""
    subjects = [(repository, digest)]
    sbom = build_sbom(docker, loaded, image)
    provenance = build_provenance(loaded, recipe_image, image, subjects)
    # the provenance names its subjects itself; the SBOM statement gets the same ones
    return [
        Attestation(cosign.CYCLONEDX_PREDICATE, cosign.statement(cosign.CYCLONEDX_PREDICATE, sbom, subjects)),
        Attestation(str(provenance["predicateType"]), provenance),
    ]
