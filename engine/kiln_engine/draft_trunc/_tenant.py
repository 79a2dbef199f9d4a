"""Keep requests whose sampling settings act on the target only out of the calibration
(vllm-project/vllm#57533 asks the same of vLLM's own estimator).

vLLM's drafters sample with the request's temperature and seed and nothing else
(``_copy_request_inputs`` in ``spec_decode/speculator.py``, 0.32.0-0.34.0), while the
rejection sampler verifies against the target's logits after every sampling setting
(``Sampler.apply_sampling_params``, the grammar bitmask). A request with a penalty, a
logit bias, bad words, a grammar, ... is therefore graded on a distribution the draft
never saw: its accept/reject labels describe that request's settings, not the draft, and
one tenant sending many of them would move the calibration every request is priced by
(the cost policy's cut, kiln-av's budget). ``graded`` leaves their drafts out of the
calibration's cells; everything else about them (truncation, verification, the estimator
vLLM owns) is unchanged.

The runner calls ``note_request`` once per request it adds (hook: the runner's
``add_requests``, patch 0012), with the request's slot and its ``SamplingParams``. The
flag lives by slot, on the host (a set) and, once any request was flagged, on the device
(a bool per slot) for ``graded`` to read without a host sync. While no slot holds a
flagged request nothing is allocated and ``graded`` launches nothing more.

Pure Python at import: torch loads only when a flagged request meets a graded step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from . import _state

if TYPE_CHECKING:
    import torch

# vLLM samples greedily below this temperature and resets top_k, top_p and min_p to
# neutral there (``_SAMPLING_EPS``, ``SamplingParams.__post_init__``).
GREEDY_BELOW = 1e-5

# Numeric settings the drafter ignores, at vLLM's neutral values. A request is only
# flagged where it differs from what the server gives every request by default (the
# model's generation config, ``get_diff_sampling_param``): that default is everyone's
# traffic, which the calibration exists to describe, not one tenant's choice.
PENALTIES: Mapping[str, float] = {
    "repetition_penalty": 1.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
}
# Truncations of the target's distribution: no-ops for a greedy request (the argmax
# survives them), target-only for a sampled one.
TRUNCATIONS: Mapping[str, float] = {"top_k": 0.0, "top_p": 1.0, "min_p": 0.0}
# Settings that are off when empty or None (name reported -> SamplingParams attribute).
PRESENT: Mapping[str, str] = {
    "logit_bias": "logit_bias",
    "allowed_token_ids": "allowed_token_ids",
    "bad_words": "bad_words_token_ids",
    "structured_outputs": "structured_outputs",
    "thinking_token_budget": "thinking_token_budget",
    "trace_decode_token_ids": "trace_decode_token_ids",
}


def _number(value: Any, name: str, neutral: float) -> float:
    number = neutral if value is None else float(value)
    # top_k <= 0 means "every token", as vLLM's sampler reads it
    return 0.0 if name == "top_k" and number <= 0 else number


def _departs(params: Any, defaults: Mapping[str, Any], name: str, neutral: float) -> bool:
    """The request's value differs from the server's default (vLLM's neutral one unless
    the generation config gives another)."""
    mine = _number(getattr(params, name, None), name, neutral)
    return mine != _number(defaults.get(name), name, neutral)


def _present(value: Any) -> bool:
    if isinstance(value, list | tuple | dict | set):
        return len(value) > 0
    return value is not None


def target_only_settings(params: Any, defaults: Mapping[str, Any] | None = None) -> list[str]:
    """The settings of ``params`` (vLLM's ``SamplingParams``, read by attribute) that change
    the target's distribution and not the draft's, by name; empty for a request whose
    drafts describe the draft. ``defaults``: the server's default sampling parameters."""
    defaults = defaults or {}
    found = [name for name, neutral in PENALTIES.items() if _departs(params, defaults, name, neutral)]
    if _number(getattr(params, "temperature", None), "temperature", 1.0) >= GREEDY_BELOW:
        found += [name for name, neutral in TRUNCATIONS.items() if _departs(params, defaults, name, neutral)]
    found += [name for name, attr in PRESENT.items() if _present(getattr(params, attr, None))]
    # min_tokens masks the stop tokens (EOS included) on the target until it is reached
    if (getattr(params, "min_tokens", 0) or 0) > 0 and getattr(params, "all_stop_token_ids", None):
        found.append("min_tokens")
    return found


def note_request(slot: int, sampling_params: Any) -> None:
    """Hook: the runner added a request to ``slot`` (each new request, before its first
    step). Flags the slot when the request's settings act on the target only, and clears
    a flag a previous request of the slot left. No-op when draft_trunc is off."""
    state = _state.current
    if not state.enabled:
        return
    flagged = bool(target_only_settings(sampling_params, state.sampling_defaults))
    if flagged == (slot in state.target_only):
        return
    if flagged:
        state.target_only.add(slot)
    else:
        state.target_only.discard(slot)
    mask = state.excluded
    if mask is not None and slot < mask.shape[0]:
        # one tiny device write, ordered on the stream after the steps graded before it
        mask[slot] = flagged


def excluded_rows(slots: torch.Tensor, like: torch.Tensor) -> torch.Tensor | None:
    """Per row of ``slots`` (batch order; -1 for padded rows): its request's drafts stay
    out of the calibration. None while no slot holds a flagged request. ``like``: a
    per-slot buffer whose size and device the mask takes (draft_trunc's ``live``)."""
    state = _state.current
    if not state.target_only:
        return None
    import torch

    mask = state.excluded
    if mask is None or mask.shape[0] != like.shape[0] or mask.device != like.device:
        # built once (or when the buffers grow): one copy of the flagged slots
        host = torch.zeros(like.shape[0], dtype=torch.bool)
        host[[s for s in state.target_only if s < like.shape[0]]] = True
        mask = state.excluded = host.to(like.device)
    return mask.index_select(0, slots.clamp(min=0)) & (slots >= 0)
