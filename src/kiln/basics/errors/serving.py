"""Errors of serving an image: containers, GPUs, ports, models, smoke checks, and the
plan that fits a recipe to its GPUs."""

from __future__ import annotations

from collections.abc import Mapping

from kiln.basics.errors.base import KilnError, ManyProblems, one_line


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


class LaunchArgInvalid(ManyProblems, KilnError):
    """The pinned engine refuses the launch command: a flag, a value or a feature knob;
    each problem its own ``file:line: field: message`` line."""

    exit_code = 17
    hint = "the pinned engine refuses it; check `vllm serve --help=all` (and kiln-engine's knobs) for that version"

    def __init__(self, problems: list[str] | str, *, hint: str | None = None):
        problems = [problems] if isinstance(problems, str) else problems
        super().__init__([one_line(p) for p in problems], hint=hint)


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


# -- the collection: fitting a recipe to its GPUs, and weights from a Hugging Face cache
# (92-95 of the 90-95 allocation)
class PlanDoesNotFit(ManyProblems, KilnError):
    """`kiln plan` / `kiln check`: the recipe's weights, KV cache and engine reserve exceed
    what its GPUs give vLLM (capacity x gpu-memory-utilization)."""

    exit_code = 92
    hint = "`kiln plan NAME --gpu G --gpus N` shows the table; use more or larger GPUs, a lower max-model-len, or a smaller dtype"


class HfSnapshotMissing(ManyProblems, KilnError):
    """A Hugging Face cache lacks a pinned snapshot, or part of one (the server runs
    offline and would fail inside the hub client)."""

    exit_code = 93
    hint = "`kiln fetch NAME` fills the cache where the hub is reachable (KILN_HF_CACHE picks the cache folder)"


class FetchFailed(KilnError):
    """`kiln fetch` could not download a pinned snapshot (network, authorisation, a
    revision the hub does not have), or the download left it incomplete."""

    exit_code = 94
    hint = "check the network and HF_TOKEN (a gated repo needs one); nothing half-downloaded is used: rerun to resume"


class ModelShapeUnknown(KilnError):
    """`kiln plan` has neither the model's config.json nor a `shape:` block in the recipe,
    or the config lacks a number the plan needs."""

    exit_code = 95
    hint = "add a `shape:` block to the model in recipe.yaml (config.json's keys, with their source), or fetch the weights"
