"""`kiln patches check|checkout|refresh` and `kiln override rebase|to-patch`: the patch-series
tools (argument parsing and printing only; the work is done in kiln.domain.patching)."""

from __future__ import annotations

import argparse

from kiln.basics import log
from kiln.basics.paths import repo_root
from kiln.commands.options import Subparsers
from kiln.domain.patching import series
from kiln.domain.patching.quilt import checkout, refresh
from kiln.domain.patching.quilt_state import Target
from kiln.domain.patching.rebase import rebase, to_patch
from kiln.domain.recipes.resolved import resolve_recipe
from kiln.infra import wheel_cache

_ENGINE = series.ENGINE


def _cmd_patches_check(args: argparse.Namespace) -> int:
    if args.feature:  # every engine version the feature has a series for, or --engine's
        _, ov = series.FeatureRef.parse(args.feature).load()
        versions = (
            [series.parse_engine(args.engine)]
            if args.engine
            else (ov.series_versions() or [ov.override.engine.version])
        )
        series.check_feature(ov, versions, args.flavour)
        return 0
    recipe = resolve_recipe(args.recipe) if args.recipe else None
    if args.engine:
        versions = [series.parse_engine(args.engine)]
    elif recipe is not None:
        versions = [recipe.recipe.engine.version]
    else:
        versions = series.pinned_versions()
        if not versions:
            log.info(f"no series under {series.shown(repo_root() / 'patches' / _ENGINE)}; nothing to check")
            return 0
    flavour = args.flavour or (recipe.recipe.engine.flavour if recipe is not None else None)
    for version in versions:
        series.check(version, flavour, recipe)
    return 0


def _target(args: argparse.Namespace) -> Target:
    """The series checkout/refresh work on: --feature RECIPE/FEATURE or the engine's."""
    feature = series.FeatureRef.parse(args.feature) if getattr(args, "feature", None) else None
    if args.engine:
        version = series.parse_engine(args.engine)
    elif feature is not None:
        version = feature.load()[0].recipe.engine.version
    else:
        version = series.newest_version()
    series_from = getattr(args, "series_from", None)
    return Target(version, series.parse_engine(series_from) if series_from else version, feature)


def _again(args: argparse.Namespace, target: Target) -> str:
    """The refresh command for this checkout, with the options it needs."""
    parts = ["kiln patches refresh"]
    if target.feature is not None:
        parts.append(f"--feature {target.feature}")
    if args.engine or target.feature is not None:
        parts.append(f"--engine {_ENGINE}=={target.version}")
    return " ".join(parts)


def _cmd_patches_checkout(args: argparse.Namespace) -> int:
    target = _target(args)
    scratch = checkout(target, args.flavour, args.force, args.force_apply)
    log.ok(f"series applied in {scratch}")
    log.info(f"edit files there, then `{_again(args, target)}`")
    log.out.print(str(scratch), markup=False)
    return 0


def _cmd_patches_refresh(args: argparse.Namespace) -> int:
    target = _target(args)
    written = refresh(target, args.flavour, args.patch)
    folder = target.series_folder(target.version)
    for name in written:
        log.ok(f"refreshed {series.shown(folder / name)}")
    if not written:
        log.ok("every patch is up to date")
    return 0


def _cmd_override_rebase(args: argparse.Namespace) -> int:
    written = rebase(args.recipe, args.feature, series.parse_engine(args.from_version))
    for f in written:
        log.ok(f"merged {f} onto the pinned engine; upstream_sha256 updated")
    return 0


def _cmd_override_to_patch(args: argparse.Namespace) -> int:
    path = to_patch(args.recipe, args.feature)
    log.ok(f"wrote {series.shown(path)}; override.yaml now uses the series, replacement files removed")
    return 0


def register(sub: Subparsers) -> None:
    """Add `patches` and `override` to the kiln CLI's subparsers."""
    p = sub.add_parser("patches", help="the engine patch series (no Docker needed)")
    ps = p.add_subparsers(dest="patches_command", required=True, parser_class=type(p))
    engine_help = (
        f"{_ENGINE}==X.Y.Z (default: the newest series under patches/{_ENGINE}/, or with --feature the recipe's engine)"
    )
    flavour_help = "wheel whose sources are used: cpu (default, smaller) or cuda"
    feature_help = "a recipe feature's own series instead of the engine's, e.g. glm53-kindling/draft-trunc"

    s = ps.add_parser("check", help="apply the series to the pinned engine's sources in a scratch tree")
    s.add_argument("--engine", help=f"{_ENGINE}==X.Y.Z (default: every series under patches/{_ENGINE}/)")
    s.add_argument("--recipe", help="also apply this recipe's switched-on experimental features")
    s.add_argument(
        "--feature",
        metavar="RECIPE/FEATURE",
        help="check a feature's series for every engine version it has one for (or --engine's)",
    )
    s.add_argument("--flavour", choices=sorted(wheel_cache.DISTRIBUTIONS), help=flavour_help)
    s.set_defaults(func=_cmd_patches_check)

    s = ps.add_parser("checkout", help="scratch tree with the series applied, for editing patches")
    s.add_argument("--engine", help=engine_help)
    s.add_argument("--feature", metavar="RECIPE/FEATURE", help=feature_help)
    s.add_argument("--series-from", help="apply this version's series instead (porting to a new engine)")
    s.add_argument("--flavour", choices=sorted(wheel_cache.DISTRIBUTIONS), help=flavour_help)
    s.add_argument("--force", action="store_true", help="discard unrefreshed edits in an existing scratch tree")
    s.add_argument("--force-apply", action="store_true", help="apply what applies, write .rej files for the rest")
    s.set_defaults(func=_cmd_patches_checkout)

    s = ps.add_parser("refresh", help="regenerate the patch files from the edited scratch tree")
    s.add_argument("--engine", help=engine_help)
    s.add_argument("--feature", metavar="RECIPE/FEATURE", help=feature_help)
    s.add_argument("--flavour", choices=sorted(wheel_cache.DISTRIBUTIONS), help=flavour_help)
    s.add_argument(
        "--patch",
        metavar="NAME",
        help="edits go into this patch, not the last one touching the file (the later "
        "patches are rebased over them); edited files no patch touches are added to it",
    )
    s.set_defaults(func=_cmd_patches_refresh)

    override = sub.add_parser("override", help="experimental overrides (recipes/NAME/experimental/FEATURE)")
    override_sub = override.add_subparsers(dest="override_command", required=True, parser_class=type(override))
    s = override_sub.add_parser(
        "rebase", help="move a feature onto the pinned engine (3-way merges whole-file replacements)"
    )
    s.add_argument("recipe")
    s.add_argument("feature")
    s.add_argument("--from", dest="from_version", required=True, help="engine version the override was forked from")
    s.set_defaults(func=_cmd_override_rebase)
    s = override_sub.add_parser("to-patch", help="turn a feature's whole-file replacements into a patch")
    s.add_argument("recipe")
    s.add_argument("feature")
    s.set_defaults(func=_cmd_override_to_patch)
