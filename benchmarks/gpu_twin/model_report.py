"""model_check.py's report: the Markdown table and the PNG plot of the model against
what the GPU twin served (`nox -s gpu_twin_model`)."""

from __future__ import annotations

from pathlib import Path


def _grid(rows: list[dict], cell) -> list[str]:
    loads = sorted({r["load"] for r in rows})
    at = {(r["config"], r["load"]): r for r in rows}
    out = ["| configuration | " + " | ".join(f"R={b}" for b in loads) + " |", "|---|" + "---|" * len(loads)]
    for name in dict.fromkeys(r["config"] for r in rows):
        out.append(f"| {name} | " + " | ".join(cell(at[name, b]) if (name, b) in at else "-" for b in loads) + " |")
    return out


def _said(top: dict | None) -> str:
    if top is None:
        return "none"
    reqs = f"{top['load']} request" + ("s" if top["load"] != 1 else "")
    return (
        f"{top['config']} at {reqs}: predicted {top['predicted_tokens_per_s']:.0f}, "
        f"served {top['served_tokens_per_s']:.0f} tokens/s (x{top['ratio']:.2f})"
    )


def markdown(report: dict) -> str:
    c = report["costs"]
    d = c["draft_position_ms"]
    lines = [
        (
            f"Model against the GPU twin: `{report['source']}` (vLLM {report['engine']}, "
            f"{report['device'] or 'device not recorded'}, {report['date'][:10]})"
        ),
        "",
        (
            f"Fitted to spec-off and spec: drafting {d['launch-bound']:.2f} ms a position "
            f"(launch-bound split, c = 0 at R={c['pinned_at']}; all-verify split: "
            f"{d['all-verify']:.2f}); dead tokens save {c['routed_share']:.3f} of a verified "
            f"token's price; as KILN_DRAFT_TRUNC_DRAFT_COST: `{c['knob']}`"
        ),
        "",
        (
            "| R (requests) | t1 (spec-off step, ms) | spec step (ms) | verify per draft token, ms "
            "(launch-bound / all-verify) | drafting share of a K=4 step | draft-trunc hook (ms, "
            "dt-cost less its prediction) |"
        ),
        "|---|---|---|---|---|---|",
    ]
    for b, e in c["loads"].items():
        hook = "-" if e["dt_hook_ms"] is None else f"{e['dt_hook_ms']:.2f}"
        lines.append(
            f"| {b} | {e['t1_ms']:.2f} | {e['spec_step_ms']:.2f} | {e['c_ms_launch-bound']:.3f} / "
            f"{e['c_ms_all-verify']:.3f} | {e['draft_share']:.3f} | {hook} |"
        )
    lines += ["", "Predicted / served tokens/s (their ratio), launch-bound split; spec is the fit", ""]
    lines += _grid(
        report["rows"],
        lambda r: f"{r['predicted_tokens_per_s']:.0f} / {r['served_tokens_per_s']:.0f} ({r['ratio']:.2f})",
    )
    lines += [
        "",
        (
            "Served step less predicted (ms a step: what the model does not price); drafts "
            "verified per window (c: counted by draft-trunc, e: estimated from acceptance)"
        ),
        "",
    ]
    lines += _grid(
        report["rows"],
        lambda r: (
            f"{r['unpriced_ms']:+.2f}; {r['verified_per_window']:.2f}"
            + {"counted": "c", "estimated": "e"}.get(r["verified_from"], "")
        ),
    )
    lines += ["", "Predicted / served with the all-verify split, and with draft-trunc's hook priced (from dt-cost)", ""]
    lines += _grid(
        report["rows"],
        lambda r: f"{r['ratio_all_verify']:.2f} / " + (f"{r['ratio_hook']:.2f}" if "ratio_hook" in r else "-"),
    )
    lines += [
        "",
        f"Largest disagreement: {_said(report['largest'])}.",
        f"With the all-verify split: {_said(report['largest_all_verify'])}.",
        f"With draft-trunc's hook priced: {_said(report['largest_hook'])}.",
    ]
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    names = list(dict.fromkeys(r["config"] for r in report["rows"]))
    cols = 4
    fig, axes = plt.subplots(-(-(len(names) + 1) // cols), cols, figsize=(13, 6.4), squeeze=False)
    flat = list(axes.flat)
    for ax, name in zip(flat, names, strict=False):
        rs = [r for r in report["rows"] if r["config"] == name]
        x = [r["load"] for r in rs]
        pred = [r["predicted_tokens_per_s"] for r in rs]
        alt = [r["served_tokens_per_s"] * r["ratio_all_verify"] for r in rs]
        ax.fill_between(x, pred, alt, color="C0", alpha=0.15, label="any split of spec's step")
        ax.plot(x, pred, "C0-", label="predicted (launch-bound split)")
        if any("ratio_hook" in r for r in rs):
            ax.plot(
                x,
                [r["served_tokens_per_s"] * r.get("ratio_hook", r["ratio"]) for r in rs],
                "C2--",
                label="predicted, draft-trunc's hook priced",
            )
        ax.plot(x, [r["served_tokens_per_s"] for r in rs], "C3o", label="served")
        ax.set_title(name + (" (the fit)" if rs[0]["role"] == "fit" else ""), fontsize=9)
    ratio_ax = flat[len(names)]
    for i, name in enumerate(names):
        rs = [r for r in report["rows"] if r["config"] == name]
        ratio_ax.plot([r["load"] for r in rs], [r["ratio"] for r in rs], "o-", color=f"C{i}", ms=3, label=name)
    ratio_ax.axhline(1.0, color="grey", lw=0.8)
    ratio_ax.set_title("predicted / served (launch-bound split)", fontsize=9)
    ratio_ax.legend(fontsize=6)
    for ax in flat[: len(names) + 1]:
        # log y: a ratio reads the same at 100 and at 3000 tokens/s
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r["load"] for r in report["rows"]}))
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("concurrent requests", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3, which="both")
    for ax in flat[len(names) + 1 :]:
        ax.axis("off")
    flat[0].set_ylabel("tokens/s")
    handles = {}
    for ax in flat[: len(names)]:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, h)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=len(handles), fontsize=8)
    fig.suptitle(
        f"sim_adaptive's step model with the twin's own costs against what it served "
        f"({report['source']}, vLLM {report['engine']})",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
