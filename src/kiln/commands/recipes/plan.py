"""`kiln plan NAME [--gpu G] [--gpus N] [--strict]`: per GPU, the recipe's weights, KV
cache and engine reserve against capacity x gpu-memory-utilization (the use-case:
kiln.usecases.plan); exit 92 with one line when it does not fit."""

from __future__ import annotations

import argparse

from kiln.basics import log
from kiln.basics.errors import PlanDoesNotFit
from kiln.commands.options import Subparsers, count
from kiln.domain.planning.plan import Plan, gib, verdict
from kiln.domain.recipes.accelerators import NAMES
from kiln.domain.recipes.resolved import resolve_recipe
from kiln.usecases.plan import plan_recipe


def _count_params(n: int) -> str:
    return f"{n / 1e9:,.2f}B" if n >= 1e9 else f"{n / 1e6:,.2f}M"


def _table(plan: Plan) -> list[str]:
    """The plan as aligned lines (what `kiln plan` prints)."""
    acc = plan.accelerator
    rows: list[tuple[str, str, str]] = []
    for part in plan.parts:
        rows.append(
            (
                f"weights: {part.role}",
                gib(part.weights),
                f"{part.shape.arch}, {_count_params(part.params)} params, {part.precision}",
            )
        )
    full_len = f"max-model-len {plan.max_model_len:,}"
    rows.append(("KV cache: 1 request", gib(plan.kv_one), f"{full_len}, kv-cache-dtype {plan.kv_dtype}"))
    rows.append(("KV cache: all requests", gib(plan.kv_full), f"{full_len} x max-num-seqs {plan.max_num_seqs:,}"))
    if acc is not None:
        reserve = plan.reserve
        rows.append(
            (
                "engine reserve",
                gib(reserve.total),
                (
                    f"estimate: activations {gib(reserve.activations)} at {plan.batched_tokens:,} batched tokens, "
                    f"sampler {gib(reserve.sampler)}, CUDA graphs {gib(reserve.cuda_graphs)}, "
                    f"context {gib(reserve.context)}"
                ),
            )
        )
        rows.append(("usable", gib(plan.usable), f"{gib(plan.capacity)} x gpu-memory-utilization {plan.utilization:g}"))
        rows.append(("left for KV cache", gib(plan.kv_room), f"{plan.kv_tokens:,} tokens"))
    else:
        rows.append(
            (
                "CPU KV cache space",
                gib(plan.cpu_kv_space),
                f"VLLM_CPU_KVCACHE_SPACE; {plan.kv_tokens:,} tokens in blocks of {plan.block}",
            )
        )
    where = f"{plan.layout.gpus} x {acc.label} ({acc.memory_gib:.1f} GiB), {plan.nodes} node(s)" if acc else "CPU"
    head = f"kiln plan {plan.recipe}: {where}, {plan.layout.label()}"
    width = max(len(r[0]) for r in rows)
    value = max(len(r[1]) for r in rows)
    lines = [head, f"  {'per GPU'.ljust(width)}  {'bytes'.rjust(value)}"] if acc else [head]
    lines += [f"  {a.ljust(width)}  {b.rjust(value)}  {c}" for a, b, c in rows]
    full = "yes" if plan.fits_full else f"no: {plan.full_length_requests:,} of {plan.max_num_seqs:,}"
    lines.append(f"  every request at max-model-len at once: {full}")
    lines += [f"  note: {n}" for n in plan.notes]
    sources = sorted({p.shape.source for p in plan.parts if p.shape.source})
    lines += [f"  shape: {s}" for s in sources]
    return lines


def _cmd_plan(args: argparse.Namespace) -> int:
    recipe = resolve_recipe(args.name)  # once (its overrides are never read: a plan is arithmetic)
    plan = plan_recipe(recipe, gpu=args.gpu, gpus=args.gpus)
    for line in _table(plan):
        log.out.print(line, markup=False, highlight=False)
    if not plan.fits or (args.strict and not plan.fits_full):
        why = (
            verdict(plan)
            if not plan.fits
            else (
                f"{plan.recipe}: only {plan.full_length_requests:,} of max-num-seqs {plan.max_num_seqs:,} requests fit "
                f"at max-model-len {plan.max_model_len:,} (--strict)"
            )
        )
        raise PlanDoesNotFit([why])
    log.ok(verdict(plan))
    return 0


def register(sub: Subparsers) -> None:
    """Add `kiln plan` to the `kiln` subparsers."""
    s = sub.add_parser("plan", help="does the recipe fit its GPUs? weights, KV cache and engine reserve per GPU")
    s.add_argument("name")
    s.add_argument("--gpu", choices=NAMES, help="the GPU (default: the recipe's topology.accelerator)")
    s.add_argument("--gpus", type=count("GPU", 4096), metavar="N", help="this many GPUs instead of the recipe's layout")
    s.add_argument(
        "--strict",
        action="store_true",
        help="fail unless every request fits at max-model-len at once (max-num-seqs x max-model-len)",
    )
    s.set_defaults(func=_cmd_plan)
