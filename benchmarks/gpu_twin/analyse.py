#!/usr/bin/env python3
"""Judge a GPU-twin run (runner.py's gpu-twin-results.json) on the host: lossless per
configuration against speculation off, with the CPU twin's own rules (kiln_testkit.
twinstats), the counters, tokens/s per load; a Markdown table, a JSON summary and a
PNG plot (`nox -s gpu_twin_report -- RESULTS.json`).

Lossless, as tests/e2e/test_tiny_kindling.py has it:
- greedy: token ids equal to speculation off's, or diverging only where speculation
  off's top-2 logprob margin is below 1e-4 (a numeric tie);
- seeded: the same seeds give the same tokens twice (reproducible), and the tokens are
  equal in distribution to speculation off's (permutation test, p >= 0.01).
"""

from __future__ import annotations

import argparse
import json
import lzma
import sys
from pathlib import Path

from kiln_testkit.requestsets import Completion
from kiln_testkit.twinserve import parse_spec_decode
from kiln_testkit.twinstats import greedy_divergences, permutation_test

TIE = 1e-4  # the CPU twin's numeric-tie rule (tests/e2e/test_tiny_kindling.py)
P_MIN = 0.01
VOCAB = 1024  # make_models.py's tokenizer
REFERENCE = "spec-off"
MTP_REFERENCE = "mtp-off"  # the MTP twin's target without speculation judges the mtp-* runs


def reference_of(name: str) -> str:
    """The configuration this one is judged against: its own target, speculation off."""
    return MTP_REFERENCE if name.startswith("mtp") else REFERENCE


KILN_COUNTERS = ("proposed", "kept", "dead", "accepted", "expert_slots_saved")


def _completions(rows: list[dict]) -> list[Completion]:
    return [
        Completion(
            r["prompt"], r["token_ids"], [[(int(t), float(lp)) for t, lp in pos] for pos in r["top"]], r["seconds"]
        )
        for r in rows
    ]


def _kiln(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name.startswith("kiln_draft_trunc_") and name.endswith("_total"):
            out[name[len("kiln_draft_trunc_") : -len("_total")]] = float(value)
    return out


def lossless(name: str, runs: dict, reference: dict) -> dict:
    """This configuration's greedy and seeded verdicts against the reference's."""
    greedy = greedy_divergences(
        _completions(runs["greedy"]["completions"]), _completions(reference["greedy"]["completions"])
    )
    not_ties = [d for d in greedy if not d.margin < TIE]
    first, second = (_completions(r) for r in runs["seeded"]["runs"])
    reproducible = all(a.token_ids == b.token_ids for a, b in zip(first, second, strict=True))
    tvd, p = permutation_test(
        [c.token_ids for c in first], [c.token_ids for c in _completions(reference["seeded"]["runs"][0])], VOCAB
    )
    return {
        "config": name,
        "greedy_divergences": len(greedy),
        "greedy_not_ties": len(not_ties),
        "greedy_equal": not not_ties,
        "seeded_reproducible": reproducible,
        "tvd": tvd,
        "p": p,
        "seeded_equal_in_distribution": p >= P_MIN,
        "lossless": not not_ties and reproducible and p >= P_MIN,
    }


def counters(text: str) -> dict:
    spec = parse_spec_decode(text)
    out: dict = {"kiln": _kiln(text)}
    if spec is not None:
        out.update(
            drafts=spec.drafts,
            draft_tokens=spec.draft_tokens,
            accepted=spec.accepted,
            accepted_per_pos=spec.accepted_per_pos,
        )
    return out


def loads(rows: list[dict]) -> list[dict]:
    """tokens/s and, from the counters' deltas, accepted tokens per verify window."""
    out = []
    for r in rows:
        before, after = parse_spec_decode(r["metrics_before"]), parse_spec_decode(r["metrics_after"])
        row = {"load": r["load"], "tokens_per_s": r["tokens_per_s"]}
        if after is not None:
            delta = after - before if before is not None else after
            if delta.drafts:
                row["accepted_per_window"] = delta.accepted / delta.drafts
                row["accepted_per_pos"] = [a / delta.drafts for a in delta.accepted_per_pos]
        kb, ka = _kiln(r["metrics_before"]), _kiln(r["metrics_after"])
        proposed = ka.get("proposed", 0) - kb.get("proposed", 0)
        if proposed > 0:
            row["kiln_kept_share"] = (ka["kept"] - kb.get("kept", 0)) / proposed
            if after is not None and before is not None and after.draft_tokens > before.draft_tokens:
                # draft-trunc's hook sees the drafts adaptive verification admitted; vLLM
                # counts the drafts scheduled, so their ratio is the budget's cut
                row["admitted_share"] = proposed / (after.draft_tokens - before.draft_tokens)
        row.update(kiln_av(kb, ka))
        out.append(row)
    return out


def kiln_av(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """kiln-av's counters over one load: its calls, the survival it was handed and the one it
    passed on (summed over requests and drafts), and the hook's time a call where it was
    timed (KILN_DRAFT_TRUNC_AV_TIMING); empty where kiln-av did not run."""
    calls = after.get("av_steps", 0) - before.get("av_steps", 0)
    if calls <= 0:
        return {}
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after if k.startswith("av_")}
    out = {
        "av_calls": calls,
        "av_survival_raw": d.get("av_survival_raw", 0.0),
        "av_survival_corrected": d.get("av_survival_corrected", 0.0),
    }
    timed = d.get("av_hook_timed", 0)
    if timed > 0:
        out["av_hook_us_gpu"] = d.get("av_hook_seconds", 0.0) / timed * 1e6
        out["av_hook_us_host"] = d.get("av_hook_host_seconds", 0.0) / timed * 1e6
    return out


def summarise(doc: dict) -> dict:
    configs = doc["configs"]
    summary: dict = {
        "date": doc["date"],
        "commit": doc["plan"]["commit"],
        "recipe": doc["plan"]["recipe"],
        "engine": doc["plan"]["engine"],
        "preflight": doc.get("preflight", ""),
        "configs": {},
    }
    for name, runs in configs.items():
        entry: dict = {"startup_s": runs.get("startup_s"), "errors": runs.get("errors", [])}
        if "greedy" in runs and "seeded" in runs:
            entry["counters"] = counters(runs["seeded"]["metrics_after"])
            if name != reference_of(name):
                entry["lossless"] = lossless(name, runs, configs[reference_of(name)])
        if "timed" in runs:
            entry["loads"] = loads(runs["timed"])
        summary["configs"][name] = entry
    return summary


def markdown(summary: dict) -> str:
    lines = [
        (
            "| configuration | greedy (divergences / not ties) | seeded reproducible | TVD, p vs off | "
            "accepted / draft tokens | tok/s at 1 / 4 / 8 / 32 |"
        ),
        "|---|---|---|---|---|---|",
    ]
    for name, e in summary["configs"].items():
        ll = e.get("lossless")
        greedy = f"{ll['greedy_divergences']} / {ll['greedy_not_ties']}" if ll else "reference"
        seeded = ("yes" if ll["seeded_reproducible"] else "**no**") if ll else "reference"
        dist = f"{ll['tvd']:.3f}, {ll['p']:.2f}" if ll else "reference"
        c = e.get("counters", {})
        acc = f"{c['accepted']:.0f} / {c['draft_tokens']:.0f}" if "draft_tokens" in c else "-"
        tps = " / ".join(f"{r['tokens_per_s']:.0f}" for r in e.get("loads", []))
        lines.append(f"| {name} | {greedy} | {seeded} | {dist} | {acc} | {tps} |")
    return "\n".join(lines) + "\n" + _kiln_av_table(summary)


def _kiln_av_table(summary: dict) -> str:
    """kiln-av's counters per load, for the configurations that ran it."""
    rows = [
        f"| {name} | {r['load']} | {r['av_calls']:.0f} | {r['av_survival_raw']:.1f} -> "
        f"{r['av_survival_corrected']:.1f} | "
        + (f"{r['av_hook_us_gpu']:.1f} / {r['av_hook_us_host']:.1f} |" if "av_hook_us_gpu" in r else "- |")
        for name, e in summary["configs"].items()
        for r in e.get("loads", [])
        if "av_calls" in r
    ]
    if not rows:
        return ""
    head = [
        "",
        "| configuration | requests | kiln-av calls | survival handed -> passed on | hook us a call, GPU / host |",
        "|---|---|---|---|---|",
    ]
    return "\n".join(head + rows) + "\n"


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, e in summary["configs"].items():
        rows = e.get("loads", [])
        if rows:
            ax.plot([r["load"] for r in rows], [r["tokens_per_s"] for r in rows], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("output tokens/s")
    ax.set_title(f"GPU twin ({summary['recipe']}, vLLM {summary['engine']}), {summary['date'][:10]}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def read_results(path: Path) -> dict:
    """runner.py's results document, with the keys summarise reads; SystemExit, one line
    naming the file and the field, when it is not one (plain checks: the runner writes
    it on a device without kiln). A `.xz` file is read through lzma: the committed raw
    runs are `-raw.json.xz`."""
    try:
        text = (
            # read whole, closed by the collector
            lzma.open(path, "rt").read()  # noqa: SIM115
            if path.suffix == ".xz"
            else path.read_text()
        )
        doc = json.loads(text)
    except (OSError, ValueError, lzma.LZMAError) as exc:
        sys.exit(f"gpu-twin: {path}: not JSON ({' '.join(str(exc).split())})")
    checks = [
        ((), "date", str),
        ((), "plan", dict),
        ((), "configs", dict),
        (("plan",), "commit", str),
        (("plan",), "recipe", str),
        (("plan",), "engine", str),
    ]
    for parent, key, kind in checks:
        node = doc
        for step in parent:
            node = node[step]
        where = ".".join([*parent, key])
        if not isinstance(node, dict) or key not in node:
            sys.exit(f"gpu-twin: {path}: missing field {where!r}")
        if not isinstance(node[key], kind):
            sys.exit(f"gpu-twin: {path}: {where}: must be a JSON {'string' if kind is str else 'object'}")
    for name, runs in doc["configs"].items():
        if not isinstance(runs, dict):
            sys.exit(f"gpu-twin: {path}: configs.{name}: must be a JSON object")
    if not doc["configs"]:
        sys.exit(f"gpu-twin: {path}: configs: no runs")
    for name in doc["configs"]:
        if reference_of(name) not in doc["configs"]:
            sys.exit(f"gpu-twin: {path}: configs: no {reference_of(name)!r} run to judge {name!r} against")
    return doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path)
    p.add_argument("--out", type=Path, default=Path("benchmarks/gpu_twin/results"))
    p.add_argument("--name", help="file stem (default gpu-twin-DATE-RECIPE)")
    args = p.parse_args(argv)
    summary = summarise(read_results(args.results))
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.name or f"gpu-twin-{summary['date'][:10]}-{summary['recipe']}"
    (args.out / f"{stem}.json").write_text(json.dumps(summary, indent=1) + "\n")
    (args.out / f"{stem}.md").write_text(markdown(summary))
    plot(summary, args.out / f"{stem}.png")
    print(markdown(summary))
    failed = [
        n
        for n, e in summary["configs"].items()
        if e.get("errors") or not e.get("lossless", {"lossless": True})["lossless"]
    ]
    judged = [n for n in summary["configs"] if n != reference_of(n)]
    print(
        f"lossless: {len(judged) - len(failed)} of {len(judged)} configurations"
        + (f"; not: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
