"""Errors of the Docker daemon: not reachable, or failing a request."""

from __future__ import annotations

from kiln.basics.errors.base import KilnError


class DockerUnavailable(KilnError):
    """The Docker daemon cannot be reached."""

    exit_code = 3
    hint = "start the daemon (`sudo dockerd &` or `systemctl start docker`) and check `kiln doctor`"


class DockerDaemonError(KilnError):
    """The Docker daemon answered a request with an error, or broke off its answer (it is
    reachable: that is `DockerUnavailable`). The message names what kiln was doing and
    quotes the daemon."""

    exit_code = 34
    hint = (
        "`docker info` and the daemon's log (`journalctl -u docker`, or dockerd's output) show its state; "
        "rerun once it answers normally"
    )
