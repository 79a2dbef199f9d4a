"""Building an image (the legacy builder, untagged) and pushing a tag: the two long
streams, read by `streams` and shown by the caller's display (`kiln.basics.progress`),
with their failures typed: BuildFailed, PushFailed, or a daemon that went away."""

from __future__ import annotations

import tempfile
import time
from typing import IO, NoReturn, Protocol

import docker
import docker.errors

from kiln.basics import image_ref
from kiln.basics.errors import BuildFailed, DockerUnavailable, PushFailed
from kiln.basics.progress import BuildDisplay, PushDisplay
from kiln.infra.docker.config import AuthConfig, sdk_auth
from kiln.infra.docker.faults import DockerError, _daemon, fault_text, id_of, one_line
from kiln.infra.docker.streams import (
    BuildResult,
    BuildStream,
    DaemonGone,
    PushResult,
    PushStream,
    StreamError,
    guarded,
)


class TarContext(Protocol):
    """A build context, as the daemon needs it: a tar stream (kiln.domain.images.build_context.BuildContext)."""

    def write_tar(self, fileobj: IO[bytes]) -> None:
        """Write the build context as a tar stream."""


def build(
    client: docker.DockerClient,
    context: TarContext,
    *,
    label: str,
    buildargs: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    nocache: bool = False,
    quiet: bool = False,
    platform: str | None = None,
) -> BuildResult:
    """`DockerDaemon.build`: an untagged image, its steps shown as they run."""
    display = BuildDisplay(label, quiet=quiet)
    stream = BuildStream(label, display)
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as tar, display:
        context.write_tar(tar)
        tar.seek(0)
        try:
            chunks = client.api.build(
                fileobj=tar,
                custom_context=True,
                buildargs=buildargs or {},
                labels=labels or {},
                rm=True,
                forcerm=True,
                nocache=nocache,
                decode=True,
                pull=False,
                platform=platform,
            )
            for chunk in guarded(chunks):
                stream.feed(chunk)
        except StreamError as exc:
            _fail(stream, display, str(exc), exc.status)
        except docker.errors.APIError as exc:
            _fail(stream, display, fault_text(exc))
        except DaemonGone as exc:
            _broken(stream, display, str(exc))
    stream.close_step()
    result = stream.result
    result.seconds = time.monotonic() - t0
    if not result.image_id:
        _fail(stream, display, "the daemon reported no image id")
    if not result.image_id.startswith("sha256:"):
        with _daemon(f"{label}: looking up the image built ({result.image_id[:19]})"):
            result.image_id = id_of(client.images.get(result.image_id))
    return result


def _broken(stream: BuildStream, display: BuildDisplay, why: str) -> NoReturn:
    """The build stream broke: the daemon went away (DockerUnavailable), or it still
    answers and only the connection broke (DockerError); either way the daemon
    cancels the build, and nothing was tagged."""
    display.stop()
    if not _alive():
        _daemon_gone(stream, why)
    step = stream.current or "before the first step"
    raise DockerError(
        f"{stream.label}: the build's stream broke (at {step}): {one_line(why)}",
        hint="nothing was tagged; rerun the same build (finished steps come from the layer cache)",
    )


def _fail(stream: BuildStream, display: BuildDisplay, message: str, status: int | None = None) -> NoReturn:
    # A daemon shutting down stops the step's container first (so the step "fails",
    # often with 143) and stops listening: a daemon that does not answer now is the cause.
    display.stop()
    if not _alive():
        _daemon_gone(stream, f"the step was stopped (status {status})" if status else message)
    step = stream.current or "(before the first step)"
    display.failed(step, list(stream.tail)[-25:])
    raise BuildFailed(
        f"{stream.label}: {step}: {message.splitlines()[-1] if message else 'failed'}",
        step=step,
        tail=list(stream.step_tail),
        status=status,
    )


def _daemon_gone(stream: BuildStream, why: str) -> NoReturn:
    step = stream.current or "before the first step"
    raise DockerUnavailable(
        f"{stream.label}: the Docker daemon went away during the build (at {step}): {one_line(why)}",
        hint="nothing was tagged; once `docker info` answers again, rerun the same build "
        "(finished steps come from the layer cache)",
    )


def _alive() -> bool:
    # a new client: a pooled keep-alive connection may still reach a daemon that has
    # stopped listening and is shutting down
    probe = None
    try:
        probe = docker.from_env(timeout=5)
        probe.ping()
        return True
    except Exception:  # connection refused, reset, timeout: all mean "not there now"  # noqa: BLE001
        return False
    finally:
        if probe is not None:
            probe.close()


def push(
    client: docker.DockerClient,
    ref: str,
    *,
    auth_config: AuthConfig | None = None,
    quiet: bool = False,
) -> PushResult:
    """`DockerDaemon.push`: one local tag, its layers shown as they go up."""
    repo, tag = name_and_tag(ref)
    t0 = time.monotonic()
    # a refusal, a daemon fault or a broken stream: PushFailed all three (the daemon
    # cancels a push whose client went away; the caller's tags come after the push)
    try:
        with (
            _daemon(f"push of {ref} failed", error=PushFailed),
            PushDisplay(ref, quiet=quiet) as display,
        ):
            stream = PushStream(display)
            chunks = client.api.push(repo, tag=tag, stream=True, decode=True, auth_config=sdk_auth(auth_config))
            for chunk in chunks:
                stream.feed(chunk)
    except StreamError as exc:
        raise PushFailed(f"push of {ref} failed: {one_line(str(exc))}") from None
    stream.result.seconds = time.monotonic() - t0
    if not stream.result.digest:
        raise PushFailed(f"push of {ref} ended without the daemon reporting a manifest digest")
    return stream.result


def name_and_tag(ref: str) -> tuple[str, str]:
    """The repository and tag of `REPO:TAG`, for the SDK calls that take them apart (a
    push without a tag would push every tag of the repository)."""
    parts = image_ref.parse(ref)
    if parts.tag is None or parts.digest is not None:
        raise DockerError(f"{ref[:200]} is no REPOSITORY:TAG")
    return parts.name, parts.tag
