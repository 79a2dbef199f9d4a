"""draft_trunc's Prometheus counters: registered at start, at 0, and added to at
every statistics flush.

Prometheus convention is that a counter exists from the first scrape, so that
dashboards, ``rate()`` and absence alerts work before anything was counted.
``check_config`` (runner start, before the server answers) therefore registers
them in the process that counts: vLLM's engine-core/worker process. That process
does not serve ``/metrics``; the API server does, from its own registry, unless
``PROMETHEUS_MULTIPROC_DIR`` is set. ``kiln-serve`` sets one, and then every
counter writes its value, 0 from the moment it is created, to a file there that
the API server's collector sums on every scrape.

Pure Python (prometheus_client is optional: without it nothing is published).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:  # prometheus_client is imported only where counters are made
    from prometheus_client import CollectorRegistry, Counter

PREFIX = "kiln_draft_trunc_"

# name (without PREFIX and "_total") -> help text; the feature registry
# (kiln_engine.features.DRAFT_TRUNC.metrics) lists the same names as exposed
HELP: Mapping[str, str] = {
    "proposed": "drafts proposed to draft_trunc",
    "kept": "drafts kept for verification",
    "accepted": "kept drafts accepted",
    "dead": "draft tokens whose routed experts were skipped",
    "expert_slots_saved": "routed expert slots skipped (top_k * dead)",
    "wasted": "kept drafts that were rejected",
    "boundary": "requests that accepted every kept draft of a truncated window",
    "tokens": "tokens scheduled in truncating steps",
    # kiln-av (KILN_DRAFT_TRUNC_AV_CALIBRATE; _av_stats): counted per hook call
    "av_steps": "steps whose adaptive-verification confidences kiln-av corrected",
    "av_stepped_aside": "steps kiln-av left alone (fewer requests than KILN_DRAFT_TRUNC_AV_MIN_BATCH)",
    "av_drafts": "draft slots kiln-av corrected",
    "av_survival_raw": "sum of the estimator's survival over the draft slots kiln-av corrected",
    "av_survival_corrected": "sum of their survival as kiln-av corrected it",
    "av_survival_shift": "sum of |corrected - estimated| survival over those draft slots",
    "av_hook_timed": "kiln-av hook calls timed (KILN_DRAFT_TRUNC_AV_TIMING=1)",
    "av_hook_seconds": "GPU seconds of the timed kiln-av hook calls (CUDA events)",
    "av_hook_host_seconds": "host seconds of the timed kiln-av hook calls",
    "graded": "verified drafts graded into the cost policy's calibration",
    "excluded": "verified drafts kept out of the calibration: their request's sampling settings act on the target only",
}


def exposed_names() -> tuple[str, ...]:
    """The series as /metrics shows them (prometheus_client appends ``_total``)."""
    return tuple(f"{PREFIX}{key}_total" for key in HELP)


@dataclass(frozen=True)
class FeatureCounters:
    """The counters of one registry, by name (without PREFIX)."""

    by_name: Mapping[str, Counter]

    # One set per registry and process: a registry refuses a second counter of a
    # name, and the process-wide default registry outlives any draft_trunc state.
    _made: ClassVar[weakref.WeakKeyDictionary[CollectorRegistry, FeatureCounters]] = weakref.WeakKeyDictionary()

    @classmethod
    def register(cls, registry: CollectorRegistry | None = None) -> FeatureCounters | None:
        """Every counter of HELP in ``registry`` (default: prometheus_client's
        process-wide one), at 0; the same object on later calls. None without
        prometheus_client."""
        try:
            import prometheus_client as prom
        except ImportError:
            return None
        target = prom.REGISTRY if registry is None else registry
        made = cls._made.get(target)
        if made is None:
            made = cls({key: prom.Counter(f"{PREFIX}{key}", doc, registry=target) for key, doc in HELP.items()})
            cls._made[target] = made
        return made

    def add(self, totals: Mapping[str, float]) -> None:
        """Add one flush's totals (negative values, which a counter refuses, as 0).
        A flush of the truncation's statistics or of kiln-av's names only its own."""
        for key, counter in self.by_name.items():
            if key in totals:
                counter.inc(max(totals[key], 0.0))


def served_elsewhere_warning(environ: Mapping[str, str] | None = None) -> str | None:
    """Why this process's counters may never reach /metrics, or None.

    vLLM runs its engine core in a process of its own unless
    VLLM_ENABLE_V1_MULTIPROCESSING=0, and without PROMETHEUS_MULTIPROC_DIR the API
    server serves its own registry only."""
    environ = os.environ if environ is None else environ
    if environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return None
    if environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1").strip() == "0":
        return None
    return (
        "draft_trunc: PROMETHEUS_MULTIPROC_DIR is unset, so the API server's /metrics will not "
        "show the kiln_draft_trunc_* counters of this engine process (kiln-serve sets it; "
        "set it to a fresh, empty directory when starting vLLM another way)"
    )
