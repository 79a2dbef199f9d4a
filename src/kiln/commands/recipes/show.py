"""`kiln show NAME`: one recipe resolved, for a person (or the whole document with --json)."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Mapping
from typing import Any

from kiln.basics import log
from kiln.commands.options import Subparsers, reports
from kiln.domain.catalogue.entries import show_document
from kiln.domain.recipes.feature_registry import flag_on
from kiln.domain.recipes.resolved import ResolvedRecipe, resolve_recipe


def _cmd_show(args: argparse.Namespace) -> int:
    recipe = resolve_recipe(args.name)  # once: the document and the features below read this value
    doc = show_document(recipe)
    if args.json:
        log.emit_json(doc)
        return 0
    r, launch = doc["recipe"], doc["launch"]
    e = r["engine"]
    rows = {
        "description": " ".join((r.get("description") or "").split()),
        "file": doc["file"],
        "engine": f"{e['name']}=={e['version']} ({e['flavour']})",
        "features": features(recipe),
        "tag": doc["tag"],
        "input digest": doc["input_digest"],
        "engine image": doc["engine_image"]["tag"],
        "platforms": ", ".join(
            f"{p} ({v['tag'].split(':')[-1]})" if "tag" in v else f"{p} ({v['problem']})"
            for p, v in doc["platforms"].items()
        ),
        "served as": f"{r['launch']['served_model_name']} on port {r['launch']['port']}",
        "speculation": _speculation(r["launch"].get("speculative_config"), launch["env"]),
    }
    if r["launch"].get("speculative_config") and r["smoke"].get("gpu"):  # CI serves the CPU recipes
        rows["served"] = served(r.get("served") or [])
    out = log.out
    out.print(r["name"], markup=False)
    width = max(len(k) for k in rows)
    for key, value in rows.items():
        out.print(f"  {key.ljust(width)}  {value}", markup=False)
    out.print("  launch:", markup=False)
    out.print("    " + shlex.join(launch["argv"]), markup=False)
    for key, value in sorted(launch["env"].items()):
        out.print(f"    {key}={value}", markup=False)
    out.print(f"  (`kiln show {r['name']} --json` prints the whole resolved recipe)", markup=False)
    return 0


def features(recipe: ResolvedRecipe) -> str:
    """Each feature the recipe switches on, with the engine versions it has a series
    for: the versions a recipe may pin with it (docs/patches.md). Its overrides are the
    ones the resolved recipe read for the launch document (`recipe.features`)."""
    parts = []
    for entry, feature in zip(recipe.recipe.experimental, recipe.features, strict=True):
        versions = feature.override.series_versions()
        where = "" if entry.from_ is None or entry.from_ == recipe.name else f" from {entry.from_}"
        supports = f"series for {recipe.engine.name} {', '.join(versions)}" if versions else "no versioned series"
        parts.append(f"{feature.name}{where} ({supports})")
    return ", ".join(parts) or "none"


# the recipe's launch.speculative_config: vLLM's own free-form mapping, passed through as is
def _speculation(spec: Mapping[str, Any] | None, env: Mapping[str, str]) -> str:
    """The recipe's speculative decoding in one line: the drafter, how many drafts (per
    batch size where vLLM's schedule is set) and what draft-trunc does on top, so the
    configuration a recipe chose (docs/draft-trunc-policy.md, section 4) is visible."""
    if not spec:
        return "none"
    k = spec.get("num_speculative_tokens")
    parts = [f"{spec.get('method', '?')}, {k} drafts"]
    table = spec.get("num_speculative_tokens_per_batch_size")
    if table:
        ranges = ", ".join(f"{a}: {n}" if a == b else f"{a}-{b}: {n}" for a, b, n in table)
        parts[0] = f"{spec.get('method', '?')}, drafts by batch size {ranges} (at most {k})"
    if spec.get("enable_adaptive_verification"):
        parts.append("vLLM adaptive verification")
    features = env.get("KILN_FEATURES", "").split(",")
    if "draft-trunc" in features and env.get("KILN_DRAFT_TRUNC", "1").lower() not in ("0", "false", "no", "off"):
        dt = (
            f"draft-trunc: fixed tau {env['KILN_DRAFT_TRUNC_TAU']}"
            if "KILN_DRAFT_TRUNC_TAU" in env
            else "draft-trunc: cost-aware"
        )
        if env.get("KILN_DRAFT_TRUNC_DRAFT_COST"):
            dt += ", drafting priced"
        if flag_on(env, "KILN_DRAFT_TRUNC_DEPTH"):
            dt += ", decides how far to draft"
        if flag_on(env, "KILN_DRAFT_TRUNC_AV_CALIBRATE"):
            dt += ", calibrates adaptive verification"
        parts.append(dt)
    return "; ".join(parts)


def served(runs: list[Mapping[str, Any]]) -> str:
    """What served the speculation configuration (the recipe's `served:`), newest first."""
    if not runs:
        return "nothing here has served this speculation configuration"
    return "; ".join(
        f"{r['by']}, {r['date']}, {r['device']}, {r['configuration']}: {r['result']} ({r['record']})"
        for r in sorted(runs, key=lambda r: str(r["date"]), reverse=True)
    )


def register(sub: Subparsers) -> None:
    """Add `kiln show` to the `kiln` subparsers."""
    s = reports(sub.add_parser("show", help="one recipe resolved: input digest, tag, launch command"))
    s.add_argument("name")
    s.set_defaults(func=_cmd_show)
