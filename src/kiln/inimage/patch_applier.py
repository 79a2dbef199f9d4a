"""The in-image patch applier: its command line, which applies the engine's quilt-style
series (or a recipe's overlays) to an installed engine, swaps in whole-file replacements
and writes the manifest.

Standard library only, on purpose: the harness copies this module and its two siblings,
the patch engine (kiln.inimage.patch_tree) and the parser (kiln.inimage.patch_format), and
no other patch code into engine build contexts as ``kiln_patching.py``,
``kiln_patchtree.py`` and ``kiln_patchformat.py``, and runs the first with the image's
python3 (``main()`` below). The host-side commands (`kiln patches ...`, in
kiln.domain.patching) apply series with the very same code, so "it applies on my machine"
and "it applies in the image" cannot disagree, while editing the host-only diff/merge
tools changes no engine image's inputs. How patches apply: kiln.inimage.patch_tree.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

# One import per place this runs: relative on the host (kiln.inimage.patch_applier, and
# not `kiln.` by name: inimage imports no kiln), by its shipped name in the image build,
# where this runs as a script with kiln_patchformat.py and kiln_patchtree.py next to it
# (kiln.domain.images.engine_image).
if TYPE_CHECKING or __package__:
    from . import patch_format, patch_tree  # noqa: TID252  (see above)
else:  # next to it whatever sys.path holds (python -I or PYTHONSAFEPATH leave this folder out)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import kiln_patchformat as patch_format
    import kiln_patchtree as patch_tree

# The applier's last stderr line on failure starts with this; kiln replaces it with the
# typed error's own hint.
HINT_PREFIX = "hint: "
_HINT_PATCH = "hint: reproduce without Docker: kiln patches check / kiln engine bump --to VERSION --dry-run"
_HINT_OVERLAY = "hint: reproduce without Docker: kiln patches check --recipe RECIPE"
_HINT_DRIFT = "hint: kiln override rebase RECIPE FEATURE --from OLD_VERSION merges the override onto this engine"


# -- the manifest (/opt/kiln/patches.json): what the image's engine was changed by ------
class _PatchEntry(TypedDict):
    name: str
    sha256: str
    source: str  # "series" (the engine's), or "feature:NAME" (a recipe's override)
    files: list[str]


class _ReplacementEntry(TypedDict):
    feature: str
    target: str
    sha256: str
    upstream_sha256: str


class _Manifest(TypedDict):
    patches: list[_PatchEntry]
    replacements: list[_ReplacementEntry]


# -- whole-file replacements -------------------------------------------------------------
@dataclass
class Replacement:
    """A file an experimental feature replaces outright: the feature, target, replacement file and upstream sha256."""

    feature: str
    target: str
    file: Path
    upstream_sha256: str


def apply_replacements(tree: patch_tree.Tree, reps: list[Replacement]) -> list[_ReplacementEntry]:
    """Swap in whole files after checking each target is the upstream file it was forked
    from; raises DriftError listing every mismatch (and nothing is written)."""
    drift: list[str] = []
    entries: list[_ReplacementEntry] = []
    for rep in reps:
        current = tree.read(rep.target)
        actual = patch_format.sha256_bytes(current) if current is not None else "(file missing)"
        if actual != rep.upstream_sha256:
            drift.append(
                f"feature {rep.feature}: {rep.target}: forked from a different upstream file "
                f"(expected sha256 {rep.upstream_sha256}, the engine has {actual})"
            )
            continue
        data = rep.file.read_bytes()
        if any(line.startswith(patch_format.CONFLICT_MARKERS) for line in patch_format.split_lines(data)):
            drift.append(f"feature {rep.feature}: {rep.file}: unresolved conflict markers from `kiln override rebase`")
            continue
        tree.write(rep.target, data)
        entries.append(
            {
                "feature": rep.feature,
                "target": rep.target,
                "sha256": patch_format.sha256_bytes(data),
                "upstream_sha256": rep.upstream_sha256,
            }
        )
    if drift:
        raise patch_format.DriftError(drift)
    return entries


# -- in-image command line -----------------------------------------------------------------
def _manifest_entries(results: list[patch_tree.PatchResult], sources: dict[int, str]) -> list[_PatchEntry]:
    return [
        {"name": r.patch.name, "sha256": r.patch.sha256, "source": sources[id(r.patch)], "files": r.patch.targets}
        for r in results
    ]


def _json_object(path: Path, lists: tuple[str, ...] = (), strings: tuple[str, ...] = ()) -> dict[str, Any]:
    """The JSON object in `path`, each of `lists` (when there) a list and each of `strings`
    a string: plain checks, as no pydantic runs here. PatchFormatError naming the file and
    the field, one line, when it is not."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise patch_format.PatchFormatError([f"{path}: not JSON ({exc})"]) from None
    if not isinstance(doc, dict):
        raise patch_format.PatchFormatError([f"{path}: not a JSON object"])
    for key in lists:
        if not isinstance(doc.get(key, []), list):
            raise patch_format.PatchFormatError([f"{path}: {key}: must be a list"])
    for key in strings:
        if not isinstance(doc.get(key), str):
            raise patch_format.PatchFormatError([f"{path}: {key}: must be a string"])
    return doc


def _write_manifest(
    path: Path, patches: list[_PatchEntry], replacements: list[_ReplacementEntry], append: bool
) -> None:
    doc: _Manifest = {"patches": [], "replacements": []}
    if append and path.is_file():  # the engine's own series' manifest, written at its build
        found = _json_object(path, lists=("patches", "replacements"))
        doc = {"patches": found.get("patches", []), "replacements": found.get("replacements", [])}
    doc["patches"].extend(patches)
    doc["replacements"].extend(replacements)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


def _load_overlays(overlays: Path) -> tuple[list[patch_format.Series], list[Replacement]]:
    """Every `<overlays>/<feature>/overlay.json`, in feature-name order."""
    series_list, reps = [], []
    for fdir in sorted(p for p in overlays.iterdir() if (p / "overlay.json").is_file()):
        path = fdir / "overlay.json"  # kiln.domain.patching.overlay._OverlayJson
        spec = _json_object(path, lists=("replacements",), strings=("name",))
        name, series = spec["name"], spec.get("series")
        if series is not None and not isinstance(series, str):
            raise patch_format.PatchFormatError([f"{path}: series: must be a string or null"])
        if series:
            series_list.append(patch_format.load_series(fdir / series, f"{fdir}/{series}", f"feature:{name}"))
        for i, rep in enumerate(spec.get("replacements", [])):
            if not isinstance(rep, dict) or not all(
                isinstance(rep.get(k), str) for k in ("target", "file", "upstream_sha256")
            ):
                raise patch_format.PatchFormatError(
                    [f"{path}: replacements[{i}]: must hold the strings target, file and upstream_sha256"]
                )
            reps.append(Replacement(name, rep["target"], fdir / rep["file"], rep["upstream_sha256"]))
    return series_list, reps


def _run_apply(root: Path, series_files: list[str], manifest: Path) -> None:
    series_list = [patch_format.load_series(Path(s), s) for s in series_files]
    tree = patch_tree.Tree(root)
    results = patch_tree.apply_series(tree, series_list)
    tree.commit()
    sources = {id(p): s.source for s in series_list for p in s.patches}
    _write_manifest(manifest, _manifest_entries(results, sources), [], append=False)
    for r in results:
        shifted = "".join(f" (hunk #{n} offset {off:+d})" for _, n, off in r.offsets)
        print(f"applied {r.patch.display}{shifted}")


def _run_apply_overlays(root: Path, overlays: Path, manifest: Path) -> None:
    series_list, reps = _load_overlays(overlays)
    tree = patch_tree.Tree(root)
    results = patch_tree.apply_series(tree, series_list)
    entries = apply_replacements(tree, reps)
    tree.commit()
    sources = {id(p): s.source for s in series_list for p in s.patches}
    _write_manifest(manifest, _manifest_entries(results, sources), entries, append=True)
    for r in results:
        print(f"applied {r.patch.display}")
    for e in entries:
        print(f"replaced {e['target']} (feature {e['feature']})")


def main(argv: list[str] | None = None) -> int:
    """The kiln_patching command line (apply, apply-overlays): patch the installed engine; its exit status."""
    ap = argparse.ArgumentParser(prog="kiln_patching", description="apply kiln patch series to an installed engine")
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("apply", help="apply the engine's patch series")
    a.add_argument("--root", required=True, type=Path, help="site-packages holding vllm/")
    a.add_argument("--series", action="append", required=True, help="series file (repeatable, applied in order)")
    a.add_argument("--manifest", required=True, type=Path)
    o = sub.add_parser("apply-overlays", help="apply a recipe's switched-on experimental features")
    o.add_argument("--root", required=True, type=Path)
    o.add_argument("--overlays", required=True, type=Path)
    o.add_argument("--manifest-append", required=True, type=Path)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "apply":
            _run_apply(args.root, args.series, args.manifest)
        else:
            _run_apply_overlays(args.root, args.overlays, args.manifest_append)
    except patch_format.PatchError as exc:
        for line in exc.lines:
            print(line, file=sys.stderr)
        hint = (
            _HINT_DRIFT
            if isinstance(exc, patch_format.DriftError)
            else _HINT_OVERLAY
            if args.cmd == "apply-overlays"
            else _HINT_PATCH
        )
        print(hint, file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
