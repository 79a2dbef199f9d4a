"""The registry side of a publish: the client (access checked first), the image's
layers pushed through the Docker daemon only when the registry lacks them, the tags
written in order and read back."""

from __future__ import annotations

from kiln.basics import log
from kiln.basics.errors import DockerDaemonError, KilnError, ManifestMismatch, PushFailed, RegistryAuthFailed
from kiln.infra import credentials
from kiln.infra.docker import DockerDaemon
from kiln.infra.manifests import Manifest
from kiln.infra.registry import RegistryClient, Target


def registry_client(target: Target, password_stdin: bool, creds: credentials.Credentials | None) -> RegistryClient:
    """A client for the target registry with credentials resolved, its access checked."""
    if creds is None:
        creds = credentials.resolve(target.host, password_stdin=password_stdin)
    client = RegistryClient(target, creds)
    client.check_access()
    return client


def _push_error(message: str) -> KilnError:
    """The daemon's push error as the kiln error a user can act on."""
    text = f"{message}; no channel or digest tag was written"
    lowered = message.lower()
    if any(word in lowered for word in ("unauthorized", "denied", "authentication required")):
        return RegistryAuthFailed(
            text, hint="the account may read but not push this repository, or the daemon was handed other credentials"
        )
    if "http response to https client" in lowered:
        return PushFailed(
            text,
            hint="the Docker daemon must list this registry in insecure-registries "
            "(/etc/docker/daemon.json) to push over plain HTTP",
        )
    return PushFailed(text)


def upload(
    docker: DockerDaemon, client: RegistryClient, digest_tag: str, image_id: str, push_tag: str
) -> tuple[Manifest, bool]:
    """The manifest of `image_id` in the registry, pushing its layers only if needed
    (the daemon's push writes `push_tag`, the first tag a publish writes anyway)."""
    target = client.target
    present = client.manifest(digest_tag)
    # the image id is the digest of the image config, which names every layer: the same
    # config means the same image, whatever compression another push chose
    if present is not None and present.config_digest == image_id:
        log.ok(f"{target.ref(digest_tag)} already holds this image ({present.digest}); push skipped")
        return present, False
    if present is not None:
        log.info(f"{target.ref(digest_tag)} holds another build of these inputs; replacing it")
    pushing = target.ref(push_tag)
    docker.tag(image_id, pushing)
    auth = client.credentials.auth_config(target.host) if client.credentials else None
    try:
        pushed = docker.push(pushing, auth_config=auth)
    except PushFailed as exc:
        raise _push_error(exc.message) from None
    finally:
        _drop_local_tag(docker, pushing)
    log.info(
        f"layers: {pushed.layers_pushed} pushed, {pushed.layers_existing} already there "
        f"[{log.human_secs(pushed.seconds)}]"
    )
    manifest = client.manifest(pushed.digest)  # read back by digest: did the registry keep it?
    moved = f"; only tag {push_tag} moved (no channel or digest tag)"
    if manifest is None:
        raise ManifestMismatch(f"the registry accepted {pushed.digest} but does not return it{moved}")
    if manifest.config_digest != image_id:
        raise ManifestMismatch(f"{pushed.digest} holds image {manifest.config_digest}, pushed {image_id}{moved}")
    return manifest, True


def _drop_local_tag(docker: DockerDaemon, pushing: str) -> None:
    """Remove the local tag the push used, best effort: a daemon fault here must neither
    hide the push's own error nor stop a publish whose layers are up (a warning says
    what is left)."""
    try:
        docker.remove_image(pushing)  # only the local tag; the image keeps its kiln/ tags
    except DockerDaemonError as exc:
        log.warn(f"{exc.message}; the local tag {pushing} is left behind: `docker rmi {pushing}`")


def write_tags(client: RegistryClient, manifest: Manifest, tags: list[str]) -> None:
    """Point each tag at the manifest (skipping those that already do); a failure names the tags already moved."""
    done: list[str] = []
    for tag in tags:
        try:
            current = client.manifest(tag)
            if current is None or current.digest != manifest.digest:
                client.put_manifest(tag, manifest)
        except KilnError as exc:
            # same class (exit code), plus what state the registry is left in
            exc.message = (
                f"{exc.message} (writing tag {tag}; written so far: {', '.join(done) or 'none'}; "
                "the input-digest tag comes last, so a rerun finishes the publish)"
            )
            raise
        done.append(tag)


def verify_tags(client: RegistryClient, manifest: Manifest, tags: list[str]) -> None:
    """Read each tag back; ManifestMismatch when one is not the manifest."""
    for tag in tags:
        got = client.manifest(tag)
        if got is None or got.digest != manifest.digest:
            raise ManifestMismatch(
                f"{client.target.ref(tag)} reads back as {got.digest if got else 'missing'}, expected {manifest.digest}"
            )
