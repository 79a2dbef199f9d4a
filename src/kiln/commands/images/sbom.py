"""`kiln sbom NAME`: the SBOM of a recipe's built image, read from the image itself.

CycloneDX 1.6 JSON by default (what Trivy, Grype and Dependency-Track read), SPDX 2.3
JSON with `--format spdx`; stdout unless `-o FILE`. `--engine` describes the recipe's
engine image instead. `--provenance` prints the SLSA provenance statement instead (the
in-toto Statement kiln would attest; its subject is the local image id)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from kiln.basics import log
from kiln.basics.errors import ImageNotBuilt, SbomWriteFailed, UsageError
from kiln.basics.files import write_atomic
from kiln.commands.options import Subparsers
from kiln.domain.images.definitions import local_image_for, require_built, resolve
from kiln.domain.supplychain import sbom as sbomdoc
from kiln.domain.supplychain import spdx
from kiln.domain.supplychain.cyclonedx_shape import CycloneDxDocument
from kiln.domain.supplychain.provenance import build_provenance
from kiln.infra.docker import DockerDaemon, id_of


def register(sub: Subparsers) -> None:
    """Add `kiln sbom` to the `kiln` subparsers."""
    s = sub.add_parser("sbom", help="SBOM of a built image, read from its filesystem (CycloneDX or SPDX JSON)")
    s.add_argument("name", help="a recipe (its image must be built from the current inputs)")
    s.add_argument(
        "--format",
        choices=("cyclonedx", "spdx"),
        default="cyclonedx",
        help="CycloneDX 1.6 JSON (default) or SPDX 2.3 JSON",
    )
    s.add_argument("-o", "--output", metavar="FILE", help="write it here instead of stdout")
    s.add_argument("--engine", action="store_true", help="the recipe's engine image instead of the recipe image")
    s.add_argument(
        "--manifest-digest",
        metavar="sha256:HEX",
        default=None,
        help="the image's pushed manifest digest, named in the subject (with --repository)",
    )
    s.add_argument(
        "--repository",
        metavar="HOST/PATH",
        default=None,
        help="where the manifest digest lives (the subject's pkg:oci purl)",
    )
    s.add_argument(
        "--provenance",
        action="store_true",
        help="print the SLSA v1.0 provenance statement (in-toto) instead of the SBOM",
    )
    s.set_defaults(func=_sbom_cli)


# a CycloneDX or SPDX document (or an in-toto statement): typed by the domain that builds it
def _document(args: argparse.Namespace, docker: DockerDaemon) -> tuple[Mapping[str, Any], str]:
    if args.manifest_digest is not None:
        _check_digest(args.manifest_digest)
    if args.engine and args.provenance:
        raise UsageError("--provenance describes a recipe image; leave out --engine")
    if args.engine:
        resolved = resolve(args.name)
        loaded, engine_image = resolved.loaded, resolved.engine_image
        image = local_image_for(docker, engine_image.tag, engine_image.digest)
        if image is None:
            raise ImageNotBuilt(f"{engine_image.tag} (the engine of {args.name}, from the current inputs) is not built")
        cdx = sbomdoc.build_image_sbom(
            docker,
            image,
            engine=loaded.recipe.engine,
            roots=(),
            manifest_digest=args.manifest_digest,
            repository=args.repository,
        )
        return (spdx.spdx_document(cdx) if args.format == "spdx" else cdx), engine_image.tag
    built = require_built(docker, args.name)
    loaded, recipe_image, image = built.loaded, built.recipe_image, built.image
    if args.provenance:
        subject = (args.repository or recipe_image.repository, args.manifest_digest or id_of(image))
        return build_provenance(loaded, recipe_image, image, [subject], docker=docker), recipe_image.tag
    doc = sbomdoc.build_sbom(
        docker, loaded, image, manifest_digest=args.manifest_digest, repository=args.repository, spec=args.format
    )
    return doc, recipe_image.tag


def _check_digest(digest: str) -> None:
    if not (digest.startswith("sha256:") and len(digest) == 71 and all(c in "0123456789abcdef" for c in digest[7:])):
        raise UsageError(f"--manifest-digest {digest!r}: expected sha256:<64 lowercase hex>")


def _write(path: Path, text: str) -> None:
    """Write atomically: a failure leaves no half-written FILE behind."""
    try:
        write_atomic(path, text)
    except OSError as exc:
        raise SbomWriteFailed(f"{path}: cannot write: {exc.strerror}") from None


def _sbom_cli(args: argparse.Namespace) -> int:
    docker = DockerDaemon()
    t0 = time.monotonic()
    doc, tag = _document(args, docker)
    text = json.dumps(doc, indent=2) + "\n"
    if args.output:
        _write(Path(args.output), text)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    what = "provenance" if args.provenance else f"SBOM ({args.format})"
    rows: dict[str, object] = {"image": tag}
    if not args.provenance and args.format == "cyclonedx":
        counts = sbomdoc.component_counts(cast("CycloneDxDocument", doc))  # --format cyclonedx: _document's own
        rows["components"] = (
            f"{counts['deb']} Debian, {counts['python']} Python, {counts['patch']} patches, "
            f"{counts['model_file']} model files"
        )
    elif not args.provenance:
        rows["packages"] = str(len(doc["packages"]))
    else:
        rows["dependencies"] = str(len(doc["predicate"]["buildDefinition"]["resolvedDependencies"]))
    if args.output:
        rows["written to"] = args.output
    rows["took"] = log.human_secs(time.monotonic() - t0)
    log.summary(what, rows)
    return 0
