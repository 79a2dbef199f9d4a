"""build_cuda's record: docs/build-cuda.json (or build-cuda-<arch>.json) and the generated
block of docs/build-cuda.md rendered from it."""

from __future__ import annotations

import re
from pathlib import Path

from kiln_testkit.import_allowlist import UPSTREAM
from kiln_testkit.scripts import load_script
from kiln_testkit.tree import REPO

plain = load_script("benchmarks/build_cuda_plain.py")

DOC = REPO / "docs" / "build-cuda.md"
DATA = REPO / "docs" / "build-cuda.json"  # linux/amd64; another platform: build-cuda-<arch>.json
GOAL_RATIO = 0.8


def data_file(platform: str) -> Path:
    return DATA if platform == "linux/amd64" else DATA.with_name(f"build-cuda-{platform.split('/')[1]}.json")


def markers(platform: str) -> tuple[str, str]:
    """The generated block of docs/build-cuda.md for `platform` (amd64's markers name no arch)."""
    if platform == "linux/amd64":
        return "<!-- build_cuda: begin (generated from docs/build-cuda.json) -->", "<!-- build_cuda: end -->"
    arch = platform.split("/")[1]
    return (
        f"<!-- build_cuda {arch}: begin (generated from docs/{data_file(platform).name}) -->",
        f"<!-- build_cuda {arch}: end -->",
    )


def render(run: dict, platform: str = "linux/amd64") -> None:
    """Replace the generated block of docs/build-cuda.md for `platform` with this run's numbers."""
    BEGIN, END = markers(platform)  # the two markers, constants of the file  # noqa: N806
    text = DOC.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOC.relative_to(REPO)}: the markers {BEGIN!r} and {END!r} are missing")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(head + BEGIN + "\n" + "\n".join(generated(run)) + "\n" + END + tail)


def generated(run: dict) -> list[str]:
    e, p = run["engine_build"], run["plain_build"]
    lines = [
        "",
        (
            f"Measured by `nox -s {_session(run)}` on {run['date']} ({run['cpus']} CPU cores, no GPU), vLLM "
            f"{run['engine']} on `{run['base_image']}`, legacy Docker builder"
            f"{', cold (no layer cache)' if run['cold'] else ''}{_where(run)}. "
            "Sizes are uncompressed, as `docker images` shows them."
        ),
        "",
        "| image | size | build | layer cache |",
        "|---|---|---|---|",
        (
            f"| `{p['tag']}`: plain `pip install vllm=={run['engine']}` in a venv | {plain.gb(p['size']):.2f} GB | "
            f"{p['seconds']} s | {p['cached_steps']} |"
        ),
        (
            f"| `{e['tag']}`: kiln engine-cuda | {plain.gb(e['size']):.2f} GB | "
            f"{'up to date' if e['skipped'] else str(e['seconds']) + ' s'} | {e['cached_steps']} steps cached |"
        ),
    ]
    r = run.get("recipe_build", {})
    if "size" in r:
        lines.append(f"| `{r['tag']}`: glm53-kindling (engine + recipe tail) | {plain.gb(r['size']):.2f} GB | | |")
    else:
        lines.append(f"| glm53-kindling | not built: {r.get('error', '?')[:160]} | | |")
    lines += [
        "",
        (
            f"**engine-cuda / plain = {run['ratio']:.3f} x** (goal <= {GOAL_RATIO}: "
            f"{'met' if run['goal_met'] else 'NOT met'})."
        ),
        "",
    ]
    lines += _du_table(run["du_mb"])
    lines += ["", "Checks in the image (CPU, no network):", "", "| check | result |", "|---|---|"]
    for c in run["checks"]:
        last = c["detail"].splitlines()[-1] if c["detail"] else ""
        lines.append(f"| {c['check']} | {'ok' if c['ok'] else 'FAILED'}: {last.replace('|', '/')[:140]} |")
    lines += _proof_lines(run)
    return lines


def _session(run: dict) -> str:
    plat = run.get("platform", "linux/amd64")
    return "build_cuda" if plat == "linux/amd64" else "build_cuda_" + plat.split("/")[1]


def _where(run: dict) -> str:
    """Which steps ran on which machine, for a platform other than the host's."""
    plat, builder = run.get("platform", "linux/amd64"), run.get("builder_platform", "linux/amd64")
    if plat == builder:
        return ""
    return (
        f"; image for {plat}, its wheels placed, stripped and byte-compiled on {builder} (cross placement), "
        "the runtime OS's apt, the plain anchor and every check under qemu"
    )


def _kinds(upstream: dict[str, int]) -> str:
    """'needs the GPU driver: 21, optional dependencies: 80 (lmcache, ...), other: 6'."""
    driver = sum(n for k, n in upstream.items() if "driver" in k)
    optional = {k.rsplit(": ", 1)[1]: n for k, n in upstream.items() if k.startswith("optional dependency")}
    other = sum(upstream.values()) - driver - sum(optional.values())
    names = ", ".join(sorted(optional, key=lambda k: -optional[k])[:8])
    return (
        f"needs the GPU driver: {driver}; optional dependencies not installed: {sum(optional.values())}"
        f"{f' ({names}, ...)' if names else ''}; other upstream errors: {other}"
    )


def _du_table(du_mb: dict) -> list[str]:
    kiln, plain = du_mb["kiln"], du_mb["plain"]
    # ties by name: set order differs between runs, and the generated block must not churn
    names = sorted(set(kiln) | set(plain), key=lambda n: (-max(kiln.get(n, 0), plain.get(n, 0)), n))
    rows = [
        "Where the bytes are (`du -sm`, MB; site-packages entries, then the OS):",
        "",
        "| path | plain | kiln | kiln - plain |",
        "|---|---:|---:|---:|",
    ]
    for name in names:
        a, b = plain.get(name, 0), kiln.get(name, 0)
        if max(a, b) >= 20 or (a and not b):
            if name.endswith((".dist-info", ".pth")) and max(a, b) < 20:
                continue
            rows.append(f"| `{name}` | {a or '-'} | {b or '-'} | {b - a:+d} |")
    return rows


def _proof_lines(run: dict) -> list[str]:
    if "proofs" not in run:
        return ["", "Proofs: not run (--no-proofs)."]
    p = run["proofs"]
    lines = [
        "",
        (
            f"Proofs inside the image (`tests/cuda/test_image_proofs.py`): "
            f"**{'all passed' if run['proofs_ok'] else 'FAILED'}**."
        ),
        "",
    ]
    if "elf" in p:
        c = p["elf"]["counts"]
        lines.append(
            f"- ELF: {c['elf_files']} files, {c['needed_entries']} DT_NEEDED entries: "
            f"{c['by_search_path']} by the loader's search path, {c['by_soname_preloaded']} by a "
            f"library loaded first (by soname), {c['driver']} driver libraries "
            f"({', '.join(p['elf']['driver']) or 'none'}), **{c['unresolved']} unresolved**."
        )
    for package, r in p.get("imports", {}).items():
        upstream = {w.split(": ", 1)[1]: n for w, n in r["allowed"].items() if w.startswith(UPSTREAM)}
        ours = {w: n for w, n in r["allowed"].items() if not w.startswith(UPSTREAM)}
        lines.append(
            f"- `import` every module of {package}: {r['imported']}/{r['modules']} imported; "
            f"{sum(upstream.values())} fail exactly as in the plain image ({_kinds(upstream)}); "
            f"{sum(ours.values())} fail only here, as intended "
            f"({'; '.join(f'{n}: {w}' for w, n in ours.items()) or 'none'}); "
            f"**{len(r['unexpected'])} unexpected**; {r['programs']} `__main__` not run."
        )
    if "dlopen" in p:
        d = p["dlopen"]
        lines.append(
            f"- dlopen: {d['loaded_count']} libraries of torch/lib and nvidia/ loaded without a GPU "
            f"(torch {d['torch']}, CUDA {d['cuda']}; {', '.join(f'{k} {v}' for k, v in d.get('calls', {}).items())}), "
            f"{len(d['driver_only'])} need only the driver, **{len(d['failed'])} failed**."
        )
    if "removed_symbols" in p:
        r = p["removed_symbols"]
        control = ", ".join(u.split("site-packages/")[-1] for u in r["control_users"]) or "none"
        lines.append(
            f"- removed cuDNN sub-libraries ({', '.join(x.rsplit('/', 1)[-1] for x in r['libraries'])}): "
            f"their {r['entry_points']} exported symbols (read in the plain image) are imported by "
            f"**{len(r['users'])} ELF files** here (control: `cudnnGetVersion` is imported by {control})"
        )
    if "compilers" in p:
        for name, detail in p["compilers"]["ok"].items():
            lines.append(f"- compiler `{name}`: {detail}")
        for name, detail in p["compilers"]["failed"].items():
            flat = re.sub(r"\s+", " ", detail)[:200]
            lines.append(f"- compiler `{name}`: **FAILED**: {flat}")
    return lines
