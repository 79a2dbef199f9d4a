"""`kiln override rebase` and `kiln override to-patch`: move a recipe feature onto the
pinned engine, or turn its whole-file replacements into a patch."""

from __future__ import annotations

from pathlib import Path

from ruamel.yaml.comments import CommentedMap

from kiln.basics import log
from kiln.basics.errors import OverrideDrift, RebaseConflict, UsageError
from kiln.domain.patching.series import (
    ENGINE,
    engine_tree,
    load_feature,
    load_recipe,
    load_series,
    shown,
    translate,
)
from kiln.domain.patching.text_diff import file_diff, merge3
from kiln.domain.patching.yaml_edits import edit_yaml, set_value
from kiln.domain.recipes.overrides import LoadedOverride, load_override
from kiln.inimage import patch_format, patch_tree


def rebase(recipe_name: str, feature: str, from_version: str) -> list[str]:
    """Move `feature` onto the pinned engine, leaving an override `kiln check` accepts.
    Whole-file replacements are 3-way merged: base = the file in `from_version`'s engine,
    ours = the override, theirs = pinned; merged files (with diff3 conflict markers where
    needed) and the new upstream_sha256 are written. A feature's patch series must apply
    to the pinned engine as it is. Then `engine.version` becomes the pinned version.
    Returns the replacement files rewritten; raises on conflicts (version left as is)."""
    loaded = load_recipe(recipe_name)
    ov = load_feature(loaded, feature)
    pinned = loaded.recipe.engine.version
    flavour = loaded.recipe.engine.flavour
    theirs_tree, _ = engine_tree(pinned, flavour)
    series_file = ov.series_file_for(pinned)
    if ov.versioned and series_file is None:
        raise UsageError(
            f"feature {feature} has no series for {ENGINE} {pinned}",
            hint=f"port it with `kiln patches checkout --feature {recipe_name}/{feature} "
            f"--engine {ENGINE}=={pinned} --series-from {from_version}` and `kiln patches refresh`",
        )
    if series_file is not None:
        _check_feature_series(theirs_tree, ov, series_file, recipe_name, pinned)
    rewritten = (
        _rebase_replacements(ov, feature, from_version, pinned, flavour, theirs_tree)
        if ov.override.replacements
        else []
    )
    _set_override_version(ov.dir / "override.yaml", ov.override.engine.version, pinned)
    return rewritten


def _check_feature_series(
    tree: patch_tree.Tree, ov: LoadedOverride, series_file: Path, recipe_name: str, pinned: str
) -> None:
    try:
        results = patch_tree.apply_series(tree.fork(), [load_series(series_file, f"feature:{ov.name}")])
    except patch_format.PatchError as exc:
        raise translate(
            exc,
            hint=f"port the feature's patches to {ENGINE} {pinned} by hand, then check with "
            f"`kiln patches check --recipe {recipe_name}`",
        ) from None
    log.ok(f"feature {ov.name}: {len(results)} patch(es) apply to {ENGINE} {pinned}")


def _rebase_replacements(
    ov: LoadedOverride, feature: str, from_version: str, pinned: str, flavour: str, theirs_tree: patch_tree.Tree
) -> list[str]:
    yaml_file = ov.dir / "override.yaml"
    new_shas: dict[int, str] = {}
    rewritten, conflicts = [], []
    base_tree = None
    for idx, rep in enumerate(ov.override.replacements):
        theirs = theirs_tree.read(rep.target)
        if theirs is None:
            raise OverrideDrift([f"feature {feature}: {rep.target}: no longer exists in {ENGINE} {pinned}"])
        if patch_format.sha256_bytes(theirs) == rep.upstream_sha256:
            log.ok(f"{rep.target}: already forked from {ENGINE} {pinned}'s file")
            continue
        if base_tree is None:  # only download the old engine when something needs merging
            base_tree, _ = engine_tree(from_version, flavour)
        base = base_tree.read(rep.target)
        base_sha = patch_format.sha256_bytes(base) if base is not None else "(file missing)"
        if base is None or base_sha != rep.upstream_sha256:
            raise OverrideDrift(
                [
                    (
                        f"{shown(yaml_file)}: replacements[{idx}]: {rep.target} in {ENGINE} {from_version} has "
                        f"sha256 {base_sha}, not the declared {rep.upstream_sha256}"
                    )
                ],
                hint="--from must name the engine version the override was forked from",
            )
        ours_file = ov.dir / rep.file
        merged = merge3(
            base, ours_file.read_bytes(), theirs, ("override", f"{ENGINE} {from_version}", f"{ENGINE} {pinned}")
        )
        ours_file.write_bytes(merged.data)
        new_shas[idx] = patch_format.sha256_bytes(theirs)
        rewritten.append(rep.file)
        conflicts += [
            f"{shown(ours_file)}:{a}-{b}: conflict: the override and {ENGINE} {pinned} both changed "
            f"these lines of {rep.target}"
            for a, b in merged.conflicts
        ]

    def set_shas(doc: CommentedMap) -> None:
        for idx, sha in new_shas.items():
            doc["replacements"][idx]["upstream_sha256"] = sha

    edit_yaml(yaml_file, set_shas)
    if conflicts:
        raise RebaseConflict(
            conflicts,
            hint=f"resolve the conflict markers, then `kiln check` (the override's "
            f"engine.version is set to {pinned} once they are gone)",
        )
    return rewritten


def _set_override_version(file: Path, current: str, version: str) -> None:
    """engine.version in override.yaml; comments and layout stay."""
    if current == version:
        return
    set_value(file, ("engine", "version"), version)
    log.ok(f"{shown(file)}: engine.version {current} -> {version}")


def to_patch(recipe_name: str, feature: str) -> Path:
    """Turn a feature's whole-file replacements into one patch in its series; the
    override.yaml then names the series and the replacement files are removed."""
    loaded = load_recipe(recipe_name)
    ov = load_feature(loaded, feature)
    reps = ov.override.replacements
    if not reps:
        raise UsageError(f"feature {feature} has no whole-file replacements")
    pinned = loaded.recipe.engine.version
    tree, _ = engine_tree(pinned, loaded.recipe.engine.flavour)
    sections = []
    for rep in reps:
        upstream = tree.read(rep.target)
        if upstream is None or patch_format.sha256_bytes(upstream) != rep.upstream_sha256:
            raise OverrideDrift(
                [f"feature {feature}: {rep.target}: forked from a different upstream file than {ENGINE} {pinned}'s"],
                hint=f"rebase it first: kiln override rebase {recipe_name} {feature} --from OLD_VERSION",
            )
        sections.append(file_diff(rep.target, upstream, (ov.dir / rep.file).read_bytes()))
    desc = " ".join(ov.override.description.split())
    header = (
        f"{feature}: {desc}\n\nWhy: {desc}\nUpstream: no, experimental kiln feature "
        f"(converted from a whole-file override by `kiln override to-patch`)\n\n"
    ).encode()
    folder = ov.series_dir_for(pinned) if ov.versioned else None  # versioned: a folder per version
    series_file = ov.series_file_for(pinned) or (
        folder / "series" if folder is not None else ov.dir / "patches" / "series"
    )
    existing = patch_format.read_series_names(series_file) if series_file.is_file() else []
    name = f"{len(existing) + 1:04d}-{feature}.patch"
    data = header + b"".join(sections)
    patch = patch_format.parse_patch(data, name)
    # It must apply on top of the feature's existing patches, or nothing is changed.
    probe = tree.fork()
    try:
        patch_tree.apply_series(probe, [load_series(series_file)] if existing else [])
        patch_tree.apply_series(probe, [patch_format.Series(name, [patch])])
    except patch_format.PatchError as exc:
        raise translate(exc) from None
    series_file.parent.mkdir(parents=True, exist_ok=True)
    (series_file.parent / name).write_bytes(data)
    with series_file.open("a") as fh:
        fh.write(f"{name}\n")
    if not ov.versioned:
        _name_series(ov.dir / "override.yaml", str(series_file.relative_to(ov.dir)))
    else:
        edit_yaml(ov.dir / "override.yaml", lambda doc: doc.pop("replacements", None))
    for rep in reps:
        (ov.dir / rep.file).unlink(missing_ok=True)
    load_override(ov.dir)  # the rewritten override.yaml must still validate
    return series_file.parent / name


def _name_series(file: Path, series: str) -> None:
    """Drop `replacements:` and name the series, keeping every other key and comment."""

    def change(doc: CommentedMap) -> None:
        doc.pop("replacements", None)
        if "patches" not in doc:
            doc["patches"] = series

    edit_yaml(file, change)
