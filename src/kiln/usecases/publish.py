"""Publishing and promoting (`kiln publish`, `kiln promote`): put a built, smoke-tested
image into an OCI registry and move it between channels without rebuilding or re-pushing.

Tags written per publish, in this order (each one a manifest PUT of the same bytes):

    <registry>/<repository>:<engine>-<version>-<recipe>   e.g. vllm-0.32.0-tiny-moe
    <registry>/<repository>:<channel>                      e.g. experimental
    <registry>/<repository>:<input digest, 12 hex>         written last

Layers travel through the Docker daemon, pushed under the engine tag (a `docker push`
always writes some tag, and a registry cannot delete a single tag: distribution 2.8
deletes manifests by digest only, which would take every tag on it along; so kiln
writes no tag of its own such as a staging tag). The daemon writes that tag only after
every layer is up, so a push that dies midway moves no tag. The input-digest tag is
written last, so its presence means the publish completed; that is also what "already
published" is checked against.

With `--sign KEY` (required when the recipe sets publish.require_signature) the daemon
pushes under `<input digest, 12 hex>-staging` instead, a tag no consumer follows; the
signature (`sha256-<hex>.sig`) and the SBOM and provenance attestations
(`sha256-<hex>.att`) go up and are verified from the registry (usecases/publish_signing.py);
only then are the three tags above written. So no consumer tag ever points at an image
whose signature is not up and verified.

`--skip-smoke-check` (no passing smoke record) writes none of those three: the image,
labelled `ai.kiln.smoke-check=skipped`, goes out under `<input digest, 12 hex>-unsmoked`
only, so no tag that consumers follow or pin ever points at an unproven image.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from kiln.basics import clock
from kiln.basics.errors import ChannelEmpty, ChannelInvalid, UsageError
from kiln.domain.images.definitions import require_built
from kiln.domain.locks import engine_lock
from kiln.domain.publishing.publish_records import (
    PlatformEntry,
    PromoteResult,
    PublishResult,
    SignatureEvidence,
    SmokeEvidence,
    write_record,
)
from kiln.domain.publishing.registry_push import registry_client, upload, verify_tags, write_tags
from kiln.domain.publishing.rules import (
    built_platforms,
    check_channel,
    consumer_tags,
    index_input_digest,
    platform_tag,
    target_for,
)
from kiln.domain.publishing.smoke_gate import (
    platform_smoke,
    platform_smoke_levels,
    promotable_image_id,
    refuse_unsmoked_channel,
    smoke_evidence,
    unsmoked_image,
    unsmoked_tag,
)
from kiln.domain.recipes.resolved import ResolvedRecipe
from kiln.infra import credentials
from kiln.infra.docker import DockerDaemon, id_of
from kiln.infra.manifests import Manifest, image_index
from kiln.infra.records import record_path
from kiln.usecases import progress, publish_signing


# -- publish ----------------------------------------------------------------------------
def publish(
    resolved: ResolvedRecipe,
    *,
    registry: str | None = None,
    channel: str | None = None,
    skip_smoke_check: bool = False,
    plain_http: bool = False,
    password_stdin: bool = False,
    creds: credentials.Credentials | None = None,
    docker: DockerDaemon | None = None,
    sign_key: Path | None = None,
) -> PublishResult:
    """Push the image built from the recipe's current inputs and tag it (see module doc).
    `creds` (for callers in Python) replaces the env / docker-config lookup; `sign_key`
    (a cosign private key) signs and attests it before any consumer tag. A recipe that
    declares several platforms is published as one image index (`_publish_index`)."""
    docker = docker or DockerDaemon()
    name = resolved.name
    declared = list[str](resolved.engine.platforms)
    if len(declared) > 1:
        return _publish_index(
            name,
            resolved,
            declared,
            registry=registry,
            channel=channel,
            skip_smoke_check=skip_smoke_check,
            plain_http=plain_http,
            password_stdin=password_stdin,
            creds=creds,
            docker=docker,
            sign_key=sign_key,
        )
    built = require_built(docker, resolved)
    loaded, recipe_image, img = built.loaded, built.recipe_image, built.image
    target = target_for(loaded, registry, plain_http=plain_http)
    explicit_channel = channel
    channel = check_channel(loaded, channel)
    built_id = id_of(img)
    smoke = smoke_evidence(recipe_image.tag, built_id, skip_smoke_check)
    image_id = built_id
    tags = consumer_tags(loaded, recipe_image.short, channel)
    if smoke["status"] == "skipped":
        refuse_unsmoked_channel(name, recipe_image.short, explicit_channel)
        channel, tags = None, [unsmoked_tag(recipe_image.short)]
    # the key (and its password) before anything moves: a wrong one fails with nothing pushed
    signer = publish_signing.signer_for(loaded, sign_key, stdin_taken="--password-stdin" if password_stdin else None)
    client = registry_client(target, password_stdin, creds)
    if smoke["status"] == "skipped":
        image_id = unsmoked_image(docker, loaded, recipe_image.short, built_id)
    progress.step(f"publishing {name} ({image_id[:19]}) to {target.host}/{target.path}")
    signing = signer is not None and channel is not None  # unsmoked: its one tag is no consumer tag
    push_tag = f"{recipe_image.short}{publish_signing.STAGING_SUFFIX}" if signing else tags[0]
    manifest, pushed = upload(docker, client, tags[-1], image_id, push_tag)
    signature = None
    if signer is not None:
        pushed_image = img if image_id == built_id else docker.require_image(image_id)
        signature = publish_signing.sign_and_verify(
            docker, client, signer, loaded, recipe_image, pushed_image, manifest.digest
        )
    write_tags(client, manifest, tags)
    verify_tags(client, manifest, tags)
    result = PublishResult(
        recipe=name,
        image_id=image_id,
        input_digest=recipe_image.digest,
        manifest_digest=manifest.digest,
        registry=target.host,
        repository=target.path,
        channel=channel,
        tags=[target.ref(t) for t in tags],
        pushed=pushed,
        smoke=smoke,
        signature=signature,
    )
    doc = {**asdict(result), "built_image_id": built_id, "time": clock.timestamp()}
    doc.pop("record")
    result.record = str(write_record("publish", name, doc))
    return result


# -- publish: several platforms, one image index ----------------------------------------
def _publish_index(
    name: str,
    resolved: ResolvedRecipe,
    declared: list[str],
    *,
    registry: str | None,
    channel: str | None,
    skip_smoke_check: bool,
    plain_http: bool,
    password_stdin: bool,
    creds: credentials.Credentials | None,
    docker: DockerDaemon,
    sign_key: Path | None,
) -> PublishResult:
    """Each built platform's image pushed under its own `<digest12>-<arch>` tag, then one
    OCI image index holding them all under the engine, channel and digest tags (digest
    tag last, as for one platform). With --sign the index digest is signed (what the tags
    point at, so what `cosign verify TAG` checks) before any of those tags is written."""
    if skip_smoke_check:
        raise UsageError(
            f"--skip-smoke-check: {name} is published as a multi-platform index, and every platform "
            "in it needs a passing smoke record",
            hint=f"`kiln smoke {name} --platform P` for each",
        )
    members = built_platforms(docker, resolved, declared)
    loaded = members[0][1].loaded
    target = target_for(loaded, registry, plain_http=plain_http)
    channel = check_channel(loaded, channel)
    records = platform_smoke(name, members)
    levels = platform_smoke_levels(members)
    input_digest = index_input_digest(members)
    short = input_digest.split(":")[1][:12]
    tags = consumer_tags(loaded, short, channel)
    signer = publish_signing.signer_for(loaded, sign_key, stdin_taken="--password-stdin" if password_stdin else None)
    client = registry_client(target, password_stdin, creds)
    progress.step(f"publishing {name} ({', '.join(p for p, _ in members)}) to {target.host}/{target.path} as one index")
    children: list[tuple[str, Manifest]] = []
    pushed_any = False
    for plat, built in members:
        manifest, pushed = upload(docker, client, platform_tag(built), id_of(built.image), platform_tag(built))
        children.append((plat, manifest))
        pushed_any = pushed_any or pushed
    index = image_index(children)
    signature = None
    signed: dict[str, SignatureEvidence] = {}
    if signer is not None:
        client.put_manifest(f"{short}{publish_signing.STAGING_SUFFIX}", index)
        # each platform's image with its own SBOM and provenance (cosign sign --recursive
        # signs an index's images too); `kiln verify` of the index checks every one
        for (plat, built), (_, manifest) in zip(members, children, strict=True):
            signed[plat] = publish_signing.sign_and_verify(
                docker, client, signer, loaded, built.recipe_image, built.image, manifest.digest
            )
        host = engine_lock.host_platform()
        plat, built = next(((p, b) for p, b in members if p == host), members[0])  # its SBOM is read natively
        signature = publish_signing.sign_and_verify(
            docker, client, signer, loaded, built.recipe_image, built.image, index.digest
        )
    present = client.manifest(short)
    already = present is not None and present.digest == index.digest
    write_tags(client, index, tags)
    verify_tags(client, index, tags)
    platforms = {
        plat: PlatformEntry(
            image_id=id_of(built.image),
            input_digest=built.recipe_image.digest,
            manifest_digest=manifest.digest,
            tag=target.ref(platform_tag(built)),
            smoke_record=records[plat],
            smoke_level=levels[plat],
        )
        for (plat, built), (_, manifest) in zip(members, children, strict=True)
    }
    for plat, evidence in signed.items():
        platforms[plat]["signature"] = evidence
    first = members[0][1]
    result = PublishResult(
        recipe=name,
        image_id=id_of(first.image),
        input_digest=input_digest,
        manifest_digest=index.digest,
        registry=target.host,
        repository=target.path,
        channel=channel,
        tags=[target.ref(t) for t in tags],
        pushed=pushed_any or not already,
        smoke=SmokeEvidence(status="passed", record=records[members[0][0]]),
        signature=signature,
        platforms=platforms,
    )
    doc = {**asdict(result), "time": clock.timestamp()}
    doc.pop("record")
    result.record = str(write_record("publish", name, doc))
    return result


# -- promote ----------------------------------------------------------------------------
def promote(
    resolved: ResolvedRecipe,
    *,
    from_channel: str,
    to_channel: str,
    registry: str | None = None,
    plain_http: bool = False,
    password_stdin: bool = False,
    creds: credentials.Credentials | None = None,
    key: Path | None = None,
) -> PromoteResult:
    """Point channel `to` at the exact manifest channel `from` points at (no layer moves),
    after verifying its signature when a key is given or the recipe requires signatures."""
    name, loaded = resolved.name, resolved.loaded
    target = target_for(loaded, registry, plain_http=plain_http)
    source, dest = check_channel(loaded, from_channel), check_channel(loaded, to_channel)
    if source == dest:
        raise ChannelInvalid(f"--from and --to are both {source!r}")
    client = registry_client(target, password_stdin, creds)
    manifest = client.manifest(source)
    if manifest is None:
        raise ChannelEmpty(f"{target.ref(source)} does not exist; nothing to promote")
    image_id = promotable_image_id(name, client, target.ref(source), source, manifest)
    signature = publish_signing.verify_for_promote(loaded, client, manifest.digest, key)
    current = client.manifest(dest)
    moved = current is None or current.digest != manifest.digest
    if moved:
        client.put_manifest(dest, manifest)
    verify_tags(client, manifest, [dest])
    result = PromoteResult(
        recipe=name,
        image_id=image_id,
        manifest_digest=manifest.digest,
        registry=target.host,
        repository=target.path,
        from_channel=source,
        to_channel=dest,
        moved=moved,
        smoke=SmokeEvidence(status="passed", record=str(record_path(image_id))),
        signature=signature,
    )
    doc = {**asdict(result), "time": clock.timestamp()}
    doc.pop("record")
    result.record = str(write_record("promote", name, doc))
    return result


# the use-case's surface: what a command, or a caller in Python, imports from here
__all__ = ["promote", "publish"]
