"""`kiln engine bump --dry-run --report`: what moving recipes from one engine version to
another would change, for the recipe's owner and a pull request.

The flags and
speculative-config keys that changed (arg_surface, read from each version's own sources),
each one a recipe uses marked; every patch of the engine series and of each moving
recipe's features, classified as bump classifies; the engine's requirements; the engine
image's measured size. Rendered as terminal text and as Markdown."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import NotRequired, TypedDict

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from kiln.basics.documents import Shape, read_document
from kiln.basics.errors import RecordInvalid
from kiln.domain.patching.arg_surface import FLAG, Change, used_changes
from kiln.domain.patching.bump import PortedEngine, Row, port_series
from kiln.domain.patching.series import (
    ENGINE,
    engine_root,
    load_feature,
    load_series,
    series_dir,
    series_for,
    shown,
)
from kiln.domain.recipes.recipe import LoadedRecipe
from kiln.inimage import patch_tree

# bump's Row.status in the words of the report
_STATES = {
    "clean": "clean",
    "offset": "offset",
    "merged": "3-way",
    "upstream": "made moot upstream",
    "fails": "conflict",
}
_STATE_ORDER = ("clean", "offset", "3-way", "made moot upstream", "conflict")
_REQUIREMENTS_SOURCE = (
    "the two engine wheels' METADATA Requires-Dist (extras left out); a full lock "
    "needs a resolution per platform (`kiln engine lock`), not made here"
)


@dataclass(frozen=True)
class RecipeUse:
    """A recipe that moves, and what of the engine's surface it uses."""

    name: str
    flags: frozenset[str]  # without `--`
    spec_keys: frozenset[str]
    features: tuple[str, ...] = ()


@dataclass
class SeriesReport:
    """One series classified against the new engine."""

    title: str
    rows: list[Row]
    note: str | None = None

    def counts(self) -> dict[str, int]:
        """How many of the series' patches end in each state, in the report's order of states."""
        states = [_STATES.get(r.status, r.status) for r in self.rows]
        return {s: states.count(s) for s in _STATE_ORDER if s in states}


@dataclass(frozen=True)
class _RequirementChange:
    name: str
    change: str  # added | removed | moved
    old: str | None
    new: str | None


@dataclass(frozen=True)
class _ImageSize:
    platform: str
    before: int | None
    after: int | None


@dataclass
class BumpReport:
    """What an engine bump changes: the launch arguments that changed, the recipes using them and each series' fate."""

    from_version: str
    to_version: str
    flavour: str
    command: str
    date: str
    changes: list[Change]
    recipes: list[RecipeUse]
    series: list[SeriesReport]
    requirements: list[_RequirementChange]
    sizes: list[_ImageSize]
    read: list[str] = field(default_factory=list)

    def users(self, change: Change) -> list[str]:
        """The moving recipes that use `change`'s flag or key."""
        return [r.name for r in self.recipes if used_changes([change], set(r.flags), set(r.spec_keys))]


def state(row: Row) -> str:
    """The state a patch row is reported in."""
    return _STATES.get(row.status, row.status)


def underneath(to_version: str, flavour: str | None) -> patch_tree.Tree | None:
    """The new engine with its own ported series (patches/vllm/<to>/) applied, when that
    series exists: what a feature is ported onto then."""
    if not (series_dir(to_version) / "series").is_file():
        return None
    tree = patch_tree.Tree(engine_root(to_version, flavour)[0])
    patch_tree.apply_series(tree, [series_for(to_version)])
    return tree


def feature_reports(
    engine: PortedEngine,
    loaded: LoadedRecipe,
    versions: tuple[str, str],
    ported: patch_tree.Tree | None,
    seen: dict[Path, str] | None = None,
) -> list[SeriesReport]:
    """Each switched-on feature's series for `from_version`, classified on the new engine.
    `seen`: series files already reported (file -> title), shared by several recipes:
    named once, then referred to."""
    from_version, to_version = versions
    seen = {} if seen is None else seen
    out = []
    for feature in sorted(loaded.recipe.features):
        ov = load_feature(loaded, feature)
        title = f"feature {loaded.name}/{feature}"
        file = ov.series_file_for(from_version)
        if file is None:
            out.append(SeriesReport(title, [], f"no series for {ENGINE} {from_version}: nothing to port"))
            continue
        if file.resolve() in seen:
            out.append(SeriesReport(title, [], f"the same series as {seen[file.resolve()]}: classified there"))
            continue
        seen[file.resolve()] = title
        under = (
            f"on the ported engine series {shown(series_dir(to_version))}/"
            if ported is not None
            else f"on {ENGINE} {to_version} with the {from_version} engine series as bump ports it"
        )
        rows = port_series(engine, load_series(file, f"feature:{feature}"), ported)
        out.append(SeriesReport(f"{title} ({shown(file.parent)})", rows, under))
    return out


# -- requirements -------------------------------------------------------------------------------
def _by_name(requirements: list[str]) -> dict[str, str]:
    """name -> what is required of it (specifier and marker; several lines joined)."""
    out: dict[str, list[str]] = {}
    for raw in requirements:
        try:
            req = Requirement(raw)
        except InvalidRequirement:
            continue
        text = str(req.specifier) or "any"
        if req.marker is not None:
            text += f" ; {req.marker}"
        out.setdefault(canonicalize_name(req.name), []).append(text)
    return {name: " / ".join(sorted(parts)) for name, parts in out.items()}


def _rank(name: str) -> tuple[int, str]:
    """torch first, then CUDA (nvidia-*), then flashinfer, then the rest."""
    if name == "torch" or name.startswith("torch"):
        return 0, name
    if name.startswith(("nvidia-", "cuda-")):
        return 1, name
    if name.startswith("flashinfer"):
        return 2, name
    return 3, name


def requirement_changes(old: list[str], new: list[str]) -> list[_RequirementChange]:
    """Packages added, removed or whose requirement moved between two requirement lists;
    torch, CUDA (nvidia-*) and flashinfer first, and listed even when unchanged."""
    a, b = _by_name(old), _by_name(new)
    out = []
    for name in sorted(a.keys() | b.keys(), key=_rank):
        if name in a and a.get(name) == b.get(name) and _rank(name)[0] < 3:
            out.append(_RequirementChange(name, "unchanged", a[name], b[name]))  # torch, CUDA, flashinfer: always
        elif name not in b:
            out.append(_RequirementChange(name, "removed", a[name], None))
        elif name not in a:
            out.append(_RequirementChange(name, "added", None, b[name]))
        elif a[name] != b[name]:
            out.append(_RequirementChange(name, "moved", a[name], b[name]))
    return out


def _headline_requirements(changes: list[_RequirementChange]) -> list[_RequirementChange]:
    return [c for c in changes if _rank(c.name)[0] < 3]


# -- image sizes --------------------------------------------------------------------------------
class _EngineBuild(TypedDict):
    size: int  # bytes


class _BuildCudaRun(TypedDict):
    """What the report reads of a measured build record (docs/build-cuda*.json, written
    by benchmarks/build_cuda.py; its other keys are not the report's)."""

    engine: str  # the engine version built
    platform: NotRequired[str | None]  # None or absent: linux/amd64
    engine_build: _EngineBuild


_BUILD_CUDA_RUN = Shape(_BuildCudaRun)


def measured_sizes(records: list[Path], from_version: str, to_version: str) -> list[_ImageSize]:
    """The engine image's size per platform from build records (docs/build-cuda*.json:
    `engine`, `platform`, `engine_build.size`) for the two versions; None: not built.
    RecordInvalid naming the file and field for a record that is not one."""
    found: dict[str, dict[str, int]] = {}
    invalid = functools.partial(
        RecordInvalid,
        hint="restore the file from git, or measure again: `nox -s build_cuda` (benchmarks/build_cuda.py)",
    )
    for path in records:
        doc = read_document(path, _BUILD_CUDA_RUN, invalid, source=shown(path))
        if doc["engine"] in (from_version, to_version):
            found.setdefault(doc.get("platform") or "linux/amd64", {})[doc["engine"]] = doc["engine_build"]["size"]
    return [_ImageSize(p, v.get(from_version), v.get(to_version)) for p, v in sorted(found.items())]


# -- rendering ----------------------------------------------------------------------------------
def _gib(size: int | None) -> str:
    return "not built" if size is None else f"{size / 2**30:.2f} GiB ({size:,} bytes)"


def _cell(text: str | None) -> str:
    return "—" if text is None or text == "" else text.replace("|", "\\|").replace("\n", " ")


def _code(text: str | None) -> str:
    return "—" if text is None else f"`{text}`"


def _change_words(change: Change) -> str:
    if change.change == "default":
        return f"default {change.old} -> {change.new}"
    if change.change == "removed":
        return "removed" + (f" ({change.note})" if change.note else " (no deprecation note in the new sources)")
    return change.change


def _ordered(report: BumpReport) -> list[Change]:
    """Used ones first, flags before keys, by name."""
    return sorted(report.changes, key=lambda c: (not report.users(c), c.kind != FLAG, c.name))


def _series_line(series: SeriesReport) -> str:
    counts = series.counts()
    return ", ".join(f"{n} {k}" for k, n in counts.items()) if counts else (series.note or "no patches")


def _headlines(report: BumpReport) -> list[str]:
    """The few lines a reviewer reads first."""
    out = [
        f"Recipes that move ({ENGINE} {report.from_version}, flavour {report.flavour}): "
        + (", ".join(r.name for r in report.recipes) or "none")
    ]
    used = [c for c in _ordered(report) if report.users(c)]
    if used:
        out += [
            f"Used and changed: {c.shown} {_change_words(c)} [{', '.join(report.users(c))}]"
            + (" (each sets it: its own value stays)" if c.change == "default" else "")
            for c in used
        ]
    else:
        out.append(
            "None of the removed, deprecated or changed flags and speculative-config keys is used by a moving recipe"
        )
    unset = [c for c in report.changes if c.change == "default" and len(report.users(c)) < len(report.recipes)]
    if unset:  # a recipe that sets a flag keeps its value; one that does not gets the new default
        out.append(
            "New defaults for the recipes that do not set them: "
            + ", ".join(f"{c.shown} {c.old} -> {c.new}" for c in unset)
        )
    out += [f"Patches, {s.title}: {_series_line(s)}" for s in report.series]
    moves = _headline_requirements(report.requirements)
    out += [
        f"{m.name}: {m.old} (unchanged)"
        if m.change == "unchanged"
        else f"{m.name}: {m.old or 'not required'} -> {m.new or 'not required'}"
        for m in moves
    ] or ["torch, CUDA (nvidia-*) and flashinfer requirements unchanged"]
    out += [f"Engine image ({s.platform}): {_gib(s.before)} -> {_gib(s.after)}" for s in report.sizes] or [
        "Engine image size: not measured for either version"
    ]
    return out


def render_text(report: BumpReport) -> str:
    """The report for the terminal."""
    lines = [f"bump report: {ENGINE} {report.from_version} -> {report.to_version} ({report.flavour})"]
    lines += [f"  {h}" for h in _headlines(report)]
    lines.append(
        f"flags and speculative-config keys that changed ({len(report.changes)}; read from "
        f"{', '.join(report.read) or 'nothing'}):"
    )
    for c in _ordered(report):
        users = report.users(c)
        mark = f"  USED by {', '.join(users)}" if users else ""
        lines.append(f"  {c.shown}: {_change_words(c)}{mark}")
    for s in report.series:
        lines.append(f"{s.title}: {_series_line(s)}" + (f" ({s.note})" if s.note and s.rows else ""))
        lines += [f"  {r.name}  {state(r)}: {r.detail}" for r in s.rows]
    lines.append(f"engine requirements ({_REQUIREMENTS_SOURCE}):")
    lines += [f"  {m.name}: {m.change} {m.old or ''} -> {m.new or ''}".rstrip() for m in report.requirements] or [
        "  unchanged"
    ]
    return "\n".join(lines) + "\n"


def render_markdown(report: BumpReport) -> str:
    """The report as a Markdown document, fit for a pull request."""
    a, b = report.from_version, report.to_version
    out = [
        f"# {ENGINE} {a} -> {b} ({report.flavour}): bump report",
        "",
        f"Generated by `{report.command}` on {report.date}; do not edit by hand (run the command again).",
        "",
        "## Headlines",
        "",
        *[f"- {h}" for h in _headlines(report)],
        "",
    ]
    out += _md_recipes(report) + _md_changes(report) + _md_series(report) + _md_requirements(report)
    out += ["## Engine image size", "", f"| platform | {a} | {b} |", "|---|---|---|"]
    out += [f"| {s.platform} | {_gib(s.before)} | {_gib(s.after)} |" for s in report.sizes] or [
        "| — | not measured | not built |"
    ]
    return "\n".join(out) + "\n"


def _md_recipes(report: BumpReport) -> list[str]:
    out = ["## Recipes that move", "", "| recipe | features | used flags and keys that changed |", "|---|---|---|"]
    for r in report.recipes:
        hit = used_changes(report.changes, set(r.flags), set(r.spec_keys))
        out.append(
            f"| {r.name} | {', '.join(r.features) or '—'} | "
            f"{_cell(', '.join(f'`{c.shown}` ({c.change})' for c in hit)) if hit else 'none'} |"
        )
    return [*out, ""]


def _md_changes(report: BumpReport) -> list[str]:
    a, b = report.from_version, report.to_version
    out = [
        "## Flags and speculative-config keys",
        "",
        (
            f"Read statically from each version's own sources: {', '.join(f'`{f}`' for f in report.read)}. "
            "A default is the source text, resolved through config-class references. A field that is gone "
            'is "removed": whether it was renamed is not guessed; a deprecation line of the sources is quoted.'
        ),
        "",
        f"| used | setting | change | {a} | {b} | used by | note |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in _ordered(report):
        users = report.users(c)
        out.append(
            f"| {'**yes**' if users else ''} | `{c.shown}` | {c.change} | {_cell(_code(c.old))} | "
            f"{_cell(_code(c.new))} | {', '.join(users) or '—'} | {_cell(c.note)} |"
        )
    if not report.changes:
        out.append("| | — | no change | | | | |")
    return [*out, ""]


def _md_series(report: BumpReport) -> list[str]:
    out = [
        "## Patches",
        "",
        (
            "States: clean, offset (applies elsewhere in the file), 3-way (ported by a "
            "3-way merge), made moot upstream (the change is already there), conflict (a human ports it)."
        ),
        "",
    ]
    for s in report.series:
        out += [f"### {s.title}", ""] + ([s.note, ""] if s.note else [])
        if s.rows:
            out += ["| patch | state | detail |", "|---|---|---|"]
            out += [f"| `{r.name}` | {state(r)} | {_cell(r.detail)} |" for r in s.rows]
            out.append("")
    return out


def _md_requirements(report: BumpReport) -> list[str]:
    a, b = report.from_version, report.to_version
    out = [
        "## Engine requirements",
        "",
        f"Compared: {_REQUIREMENTS_SOURCE}. torch, CUDA (nvidia-*) and flashinfer first.",
        "",
        f"| package | change | {a} | {b} |",
        "|---|---|---|---|",
    ]
    out += [f"| {m.name} | {m.change} | {_cell(m.old)} | {_cell(m.new)} |" for m in report.requirements] or [
        "| — | unchanged | | |"
    ]
    return [*out, ""]
