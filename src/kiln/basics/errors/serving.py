"""Errors of serving an image: containers, GPUs, ports, model folders, nodes, smoke checks."""

from __future__ import annotations

from collections.abc import Mapping

from kiln.basics.errors.base import KilnError


class SmokeFailed(KilnError):
    """A smoke check of a served image failed (or the server never turned healthy)."""

    exit_code = 8
    # the smoke record of the failed run, when one was made
    record: Mapping[str, object] | None = None
    hint = "the last container log lines are printed above; `kiln run NAME` serves it interactively"


class ContainerStartFailed(KilnError):
    """A serving container exited or never turned healthy while starting."""

    exit_code = 13
    hint = "see the container log above; `kiln run NAME --print` shows the exact docker command"


class PortInUse(KilnError):
    """The host port to serve on is taken."""

    exit_code = 14
    hint = "pick another port with --port, or stop whatever listens there"


class ModelPathMissing(KilnError):
    """A recipe's host-path model folder does not exist on this host."""

    exit_code = 15
    hint = "download the weights to that path on the host, or point model.host_path at them"


class NoGPU(KilnError):
    """A CUDA recipe, and no NVIDIA GPU or container runtime here."""

    exit_code = 16
    hint = "this recipe needs NVIDIA GPUs and the NVIDIA container runtime; use --print to see the command"


class ContainerNotFound(KilnError):
    """`kiln logs/stop NAME` where NAME is not a container kiln started (or it is gone)."""

    exit_code = 50
    hint = "`kiln ps` lists the containers kiln started"


class ServerExited(KilnError):
    """A served container died after it had turned healthy."""

    exit_code = 51
    hint = "the last container log lines are printed above; `kiln run NAME --print` shows the exact docker command"


class NodeLost(KilnError):
    """A node of a multi-node group exited while the group started or served."""

    exit_code = 70
    hint = "its log tail is above; every node of the group was stopped and removed"
