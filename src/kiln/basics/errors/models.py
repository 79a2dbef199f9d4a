"""Errors of a recipe's model: fitting it to its GPUs (`kiln plan`), and its weights in a
Hugging Face cache (`kiln fetch`)."""

from __future__ import annotations

from kiln.basics.errors.base import KilnError, ManyProblems


class PlanDoesNotFit(ManyProblems, KilnError):
    """`kiln plan` / `kiln check`: the recipe's weights, KV cache and engine reserve exceed
    what its GPUs give vLLM (capacity x gpu-memory-utilization)."""

    exit_code = 92
    hint = (
        "`kiln plan NAME --gpu G --gpus N` shows the table; use more or larger GPUs, "
        "a lower max-model-len, or a smaller dtype"
    )


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
    hint = (
        "add a `shape:` block to the model in recipe.yaml (config.json's keys, with their source), or fetch the weights"
    )
