"""`DockerDaemon`: the one facade over the local Docker daemon. Every request runs
inside `_daemon(doing)` (`faults`); the long streams (build, push) are read in
`building`, containers in `containers`, throwaway script runs in `throwaway_runs`."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

import docker
import docker.errors
from docker.models.images import Image

from kiln.basics import image_ref, log
from kiln.basics.documents import Shape
from kiln.basics.errors import BaseImageMissing, BuildFailed, DockerUnavailable
from kiln.basics.progress import PullDisplay
from kiln.infra.docker import building, throwaway_runs
from kiln.infra.docker.building import TarContext, name_and_tag
from kiln.infra.docker.config import AuthConfig, registry_of, sdk_auth
from kiln.infra.docker.containers import Container, ExecResult
from kiln.infra.docker.faults import _daemon, fault_text, one_line, short
from kiln.infra.docker.streams import BuildResult, PullStream, PushResult, StreamError

_T = TypeVar("_T")


class DockerDaemon:
    """A small facade over the local Docker daemon."""

    def __init__(self, client: docker.DockerClient | None = None) -> None:
        self._client = client

    @property
    def client(self) -> docker.DockerClient:
        """The docker SDK's client, connected and pinged on first use; DockerUnavailable when the daemon cannot be
        reached."""
        if self._client is None:
            try:
                self._client = docker.from_env(timeout=600)
                self._client.ping()
            except Exception as exc:  # the SDK raises several unrelated types here  # noqa: BLE001
                raise DockerUnavailable(f"cannot reach the Docker daemon: {short(exc)}") from None
        return self._client

    def ping(self) -> str:
        """The daemon's Docker version."""
        client = self.client
        with _daemon("asking the Docker daemon its version"):
            return str(client.version().get("Version", "?"))

    def root_dir(self) -> str:
        """The daemon's data root (`docker info`'s DockerRootDir): where its images and
        layer cache live, as a path on the daemon's host."""
        client = self.client
        with _daemon("asking the Docker daemon where it keeps its data (docker info)"):
            return str(client.info().get("DockerRootDir", ""))

    # -- images -------------------------------------------------------------
    def image(self, ref: str) -> Image | None:
        """The local image `ref` names, None when there is none (the daemon's 404)."""
        client = self.client
        with _daemon(f"looking up image {ref[:100]}"):
            try:
                return client.images.get(ref)
            except docker.errors.NotFound:  # ImageNotFound, or a 404 the SDK did not classify
                return None

    def ensure_base(self, ref: str, *, pull: bool, auth: Callable[[str], AuthConfig | None] | None = None) -> Image:
        """The local image `ref`, pulled first when allowed; `auth(registry host)` gives the
        credentials for that pull (asked only when a pull happens)."""
        img = self.image(ref)
        if img is not None:
            return img
        if not pull:
            raise BaseImageMissing(f"base image {ref} is not present locally")
        display = PullDisplay(ref)
        display.announce()
        parts = image_ref.parse(ref)
        # by digest: the whole reference is the name, and no tag may be passed beside it
        repo, tag = (ref, None) if parts.digest else (parts.name, parts.tag)
        auth_config = auth(registry_of(parts.name)) if auth else None
        t0 = time.monotonic()
        # the registry's refusal (an APIError, or an error in the stream) means the base is
        # missing; a broken connection or a daemon fault is the daemon's (DockerError)
        missing = f"base image {ref} is not local and could not be pulled"
        try:
            with _daemon(f"pulling {ref}"):
                try:
                    with display:
                        stream = PullStream(display)
                        for chunk in self.client.api.pull(
                            repo,
                            tag=tag,
                            stream=True,
                            decode=True,
                            auth_config=sdk_auth(auth_config),
                        ):
                            stream.feed(chunk)
                    img = self.client.images.get(ref)
                except docker.errors.APIError as exc:
                    raise BaseImageMissing(f"{missing}: {fault_text(exc)}") from None
        except StreamError as exc:
            raise BaseImageMissing(f"{missing}: {exc}") from None
        display.pulled(time.monotonic() - t0)
        return img

    def tag(self, image_id: str, ref: str) -> None:
        """Tag an image as `ref`, moving the tag if it names another image; BuildFailed when the daemon refuses."""
        repo, tag = name_and_tag(ref)
        with _daemon(f"tagging {image_id[:19]} as {ref}"):
            tagged = self.client.api.tag(image_id, repo, tag, force=True)
        if not tagged:
            raise BuildFailed(f"could not tag {image_id[:19]} as {ref}")

    def require_image(self, ref: str) -> Image:
        """The image `ref` names, which the caller just built or tagged."""
        img = self.image(ref)
        if img is None:
            raise BuildFailed(f"image {ref[:71]} vanished from the daemon right after it was made")
        return img

    def images(self, *, label: str | None = None, name: str | None = None) -> list[Image]:
        """Local images carrying `label` (a key, or key=value) and/or in repository `name`."""
        with _daemon(f"listing images{f' labelled {label}' if label else ''}{f' of {name}' if name else ''}"):
            return self.client.images.list(name=name, filters={"label": label} if label else None)

    def remove_image(self, ref: str) -> bool:
        """False when the daemon refuses because other repositories still reference the
        image (409: pushed or pulled by digest elsewhere); those names are not kiln's."""
        with _daemon(f"removing image {ref}", hint=f"`docker rmi {ref}` once `docker info` answers normally"):
            try:
                self.client.images.remove(ref, noprune=False)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                if exc.status_code == 409 and "multiple repositories" in str(exc):
                    return False
                raise
        return True

    def import_rootfs(self, tarball: Path, ref: str | None, changes: list[str]) -> Image | None:
        """`docker import` of a root filesystem tarball as `ref` (None: untagged), with
        Dockerfile `changes`."""
        repo, tag = name_and_tag(ref) if ref is not None else (None, None)
        with (
            tarball.open("rb") as fh,
            _daemon(f"importing {tarball.name} as {ref or 'an untagged image'}"),
        ):
            resp = self.client.api.import_image(src=fh, repository=repo, tag=tag, changes=changes)
        log.debug(f"docker import: {str(resp)[:200]}")
        if ref is None:
            found = re.search(r"sha256:[0-9a-f]{64}", str(resp))
            return self.image(found.group(0)) if found else None
        return self.image(ref)

    def save(self, image_id: str) -> Iterator[bytes]:
        """`docker save` of one image, as a stream of chunks; BuildFailed when the daemon
        fails it or the stream breaks (callers retry that)."""
        with _daemon(f"docker save of {image_id[:19]} failed", error=BuildFailed):
            yield from self.client.api.get_image(image_id, chunk_size=1 << 20)

    def export_filesystem(self, image_id: str, dest: Path) -> None:
        """`docker export` of a created (never started) container of `image_id` into the
        tar file `dest`: the image's files as one tree; the container is removed after."""
        with _daemon(f"exporting the files of {image_id[:19]}", error=BuildFailed):
            container = self.client.containers.create(
                image_id, command=["true"], labels={"ai.kiln.throwaway": "export"}
            )
            try:
                with dest.open("wb") as out:
                    # the SDK's stubs call the chunks str; the API streams bytes
                    chunks = cast("Iterable[bytes]", container.export(chunk_size=1 << 20))
                    for chunk in chunks:
                        out.write(chunk)
            finally:
                container.remove(force=True)

    def load(self, archive: Iterable[bytes]) -> str:
        """`docker load` of a tar (streamed: chunked upload) holding one untagged image;
        its id as the daemon reports it."""
        # (the SDK's stubs leave load_image unannotated: typed here, at its one use)
        load_image: Callable[[Iterable[bytes]], Iterable[object]] = self.client.api.load_image
        with _daemon("docker load failed", error=BuildFailed):
            out = list(load_image(archive))
        for chunk in out:
            doc = chunk if isinstance(chunk, dict) else {}
            text = str(doc.get("stream", ""))
            if "error" in doc:
                raise BuildFailed(f"docker load failed: {one_line(str(doc['error']))}")
            if text.startswith("Loaded image ID: "):
                return text.removeprefix("Loaded image ID: ").strip()
        raise BuildFailed(f"docker load reported no image id: {one_line(str(out)[:200])}")

    # -- containers ---------------------------------------------------------
    def containers(self, *, label: str, all_states: bool = False) -> list[Container]:
        """Containers carrying `label` (running ones only unless `all_states`), newest first."""
        with _daemon(f"listing the containers labelled {label}"):
            # ignore_removed: an AutoRemove container may go between the list and its inspect
            found = self.client.containers.list(all=all_states, filters={"label": label}, ignore_removed=True)
        return [Container(c) for c in found]

    def container(self, name: str) -> Container | None:
        """The container called `name` (or with that id prefix), None when there is none."""
        with _daemon(f"looking up container {name}"):
            try:
                return Container(self.client.containers.get(name))
            except docker.errors.NotFound:
                return None

    def create_container(self, **sdk_kwargs: Any) -> Container:
        """A created (not started) container; `sdk_kwargs` as `RunSpec.sdk_kwargs()` spells them."""
        with _daemon(f"creating container {sdk_kwargs.get('name') or 'from ' + str(sdk_kwargs.get('image'))[:80]}"):
            return Container(self.client.containers.create(**sdk_kwargs))

    def remove_container(self, name: str, timeout_s: float = 30) -> None:
        """Remove `name` if it still exists and return once it is gone: AutoRemove may be
        deleting it already, and a caller that lists containers next must not see it."""
        api = self.client.api
        with _daemon(
            f"removing container {name}",
            hint=f"`docker rm -f {name}` once `docker info` answers normally",
        ):
            failed: docker.errors.APIError | None = None
            try:
                # by name, no inspect first: the one request that must work for nothing to be left
                api.remove_container(name, force=True)
            except docker.errors.NotFound:
                return
            except docker.errors.APIError as exc:
                in_progress = "removal of container" in str(exc) or "is already in progress" in str(exc)
                if not in_progress:
                    if not self._removes_itself(name):
                        raise
                    failed = exc  # reported only if AutoRemove does not finish the job
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if self._container_gone(name):
                    return
                time.sleep(0.2)
            if failed is not None:
                raise failed

    def _container_gone(self, name: str) -> bool:
        try:
            self.client.api.inspect_container(name)
        except docker.errors.NotFound:
            return True
        return False

    def _removes_itself(self, name: str) -> bool:
        """Gone, or stopped with AutoRemove (the daemon deletes it in a moment)."""
        try:
            attrs = self.client.api.inspect_container(name)
        except docker.errors.NotFound:
            return True
        auto = bool((attrs.get("HostConfig") or {}).get("AutoRemove"))
        return auto and not (attrs.get("State") or {}).get("Running")

    def create_network(self, name: str, *, labels: dict[str, str]) -> None:
        """A user-defined bridge network: containers on it resolve each other by name."""
        with _daemon(f"creating network {name}"):
            self.client.networks.create(name, driver="bridge", labels=labels)

    def remove_network(self, name: str, timeout_s: float = 10) -> None:
        """Remove network `name` if it exists; retried while auto-removed containers are
        still being detached from it (the daemon does that asynchronously)."""
        deadline = time.monotonic() + timeout_s
        with _daemon(
            f"removing network {name}",
            hint=f"`docker network rm {name}` once its containers are gone",
        ):
            while True:
                try:
                    self.client.api.remove_network(name)
                    return
                except docker.errors.NotFound:
                    return
                except docker.errors.APIError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)

    def push(self, ref: str, *, auth_config: AuthConfig | None = None, quiet: bool = False) -> PushResult:
        """Push one local tag (layers, then the manifest under that tag) with progress.

        The daemon writes the tag only after every layer is up, so a failure midway
        leaves the registry's tags untouched. `auth_config` travels to the daemon in the
        request header only (never into ~/.docker/config.json)."""
        return building.push(self.client, ref, auth_config=auth_config, quiet=quiet)

    def build(
        self,
        context: TarContext,
        *,
        label: str,
        buildargs: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        nocache: bool = False,
        quiet: bool = False,
        platform: str | None = None,
    ) -> BuildResult:
        """Build an untagged image; the caller tags it only once the build succeeded.
        `platform` (linux/arm64): build for it (RUN steps of another architecture need
        qemu registered with binfmt_misc); None: the daemon's own."""
        return building.build(
            self.client,
            context,
            label=label,
            buildargs=buildargs,
            labels=labels,
            nocache=nocache,
            quiet=quiet,
            platform=platform,
        )

    # -- throwaway containers ---------------------------------------------------
    def run_script(
        self,
        image_id: str,
        script: str,
        *,
        marker: str,
        answer: Shape[_T],
        what: str,
        timeout_s: float,
        env: dict[str, str] | None = None,
        cause: str = "",
        user: str | None = None,
        mounts: dict[str, tuple[str, bool]] | None = None,
    ) -> _T:
        """`throwaway_runs.run_script` on this daemon (its docstring is the contract)."""
        return throwaway_runs.run_script(
            self.client,
            image_id,
            script,
            marker=marker,
            answer=answer,
            what=what,
            timeout_s=timeout_s,
            env=env,
            cause=cause,
            user=user,
            mounts=mounts,
        )

    def run_command(self, image: str, argv: list[str], *, timeout_s: float, name_prefix: str = "kiln-") -> ExecResult:
        """Run `argv` in a throwaway container of `image` (with network: e.g. apt's
        package lists) and return its exit status and output; the container is removed."""
        return throwaway_runs.run_command(self.client, image, argv, timeout_s=timeout_s, name_prefix=name_prefix)
