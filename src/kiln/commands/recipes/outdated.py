"""`kiln engine outdated [--json] [--index-url URL]`: does any recipe pin an older engine
than the newest release on the package index? Exit 0 when none does, 36
(`EngineOutdated`) when one does, 37 when the index cannot be asked, 38 when its answer
is no index page. Wired into `recipes/patches.py`'s `kiln engine` parser; the rows are
`domain/patching/outdated.py`'s."""

from __future__ import annotations

import argparse

from kiln.basics import log
from kiln.basics.errors import EngineOutdated
from kiln.commands.options import Subparsers, reports
from kiln.domain.patching import outdated as O
from kiln.infra import package_index

_HEADER = ("recipe", "distribution", "pinned", "newest on index", "newest with a kiln series", "status")


def _status(row: O.OutdatedRow) -> str:
    if row["status"] == "current":
        return "up to date"
    if row["status"] == "not-on-index":
        return "not on the index"
    ready = row["next"] is not None and "--recipe" in row["next"]
    return "lags (series ready)" if ready else f"lags (no series for {row['newest_on_index']} yet)"


def _table(doc: O.OutdatedDocument) -> list[str]:
    """The rows for a person: one line per recipe under a header, columns aligned."""
    cells = [_HEADER] + [
        (
            r["recipe"],
            r["distribution"],
            r["engine"]["version"],
            r["newest_on_index"] or "-",
            r["newest_with_series"] or "-",
            _status(r),
        )
        for r in doc["recipes"]
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(_HEADER) - 1)]
    return ["  ".join([*(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)), row[-1]]) for row in cells]


def _summary(doc: O.OutdatedDocument, behind: list[O.OutdatedRow]) -> str:
    """One line: how many recipes lag, and what is out per distribution."""
    news: dict[tuple[str, str], set[str]] = {}
    for r in behind:
        news.setdefault((r["distribution"], r["newest_on_index"] or ""), set()).add(r["engine"]["version"])
    what = "; ".join(
        f"{dist} {newest} is out (pinned: {', '.join(sorted(pins))})" for (dist, newest), pins in sorted(news.items())
    )
    return f"{len(behind)} of {len(doc['recipes'])} recipe(s) lag the package index {doc['index']}: {what}"


def _cmd_engine_outdated(args: argparse.Namespace) -> int:
    index = (args.index_url or package_index.index_url()).rstrip("/")
    cafile = package_index.index_cafile()
    doc = O.outdated(index, lambda dist: package_index.wheel_releases(dist, index=index, cafile=cafile))
    behind = O.lagging(doc)
    if args.json:
        log.emit_json(doc)
    else:
        for line in _table(doc):
            log.out.print(line, markup=False)
    if behind:
        for step in sorted({r["next"] for r in behind if r["next"]}):
            log.info(f"next: {step}")
        raise EngineOutdated(_summary(doc, behind))
    log.ok(f"{len(doc['recipes'])} recipe(s) pin the newest engine release on {index}")
    return 0


def register_engine(es: Subparsers) -> None:
    """`kiln engine outdated` (added to the `kiln engine` subcommands)."""
    s = reports(
        es.add_parser(
            "outdated", help="does a recipe pin an older engine than the newest release on the package index? (exit 36)"
        )
    )
    s.add_argument(
        "--index-url",
        metavar="URL",
        help="the simple index to ask (default: pip's index-url, else https://pypi.org/simple)",
    )
    s.set_defaults(func=_cmd_engine_outdated)
