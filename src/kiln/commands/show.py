"""`kiln show NAME`: one recipe resolved, for a person (or the whole document with --json)."""

from __future__ import annotations

import argparse
import shlex

from kiln.basics import log
from kiln.commands.options import reports
from kiln.domain.views.catalogue import show_document


def cmd_show(args: argparse.Namespace) -> int:
    doc = show_document(args.name)
    if args.json:
        log.emit_json(doc)
        return 0
    r, launch = doc["recipe"], doc["launch"]
    e = r["engine"]
    rows = {
        "description": " ".join((r.get("description") or "").split()),
        "file": doc["file"],
        "engine": f"{e['name']}=={e['version']} ({e['flavour']})",
        "features": ", ".join(f if isinstance(f, str) else f"{f['name']} (from {f['from']})"
                              for f in r.get("experimental") or []) or "none",
        "tag": doc["tag"],
        "input digest": doc["input_digest"],
        "engine image": doc["engine_image"]["tag"],
        "platforms": ", ".join(f"{p} ({v['tag'].split(':')[-1]})" if "tag" in v else f"{p} ({v['problem']})"
                               for p, v in doc["platforms"].items()),
        "served as": f"{r['launch']['served_model_name']} on port {r['launch']['port']}",
    }
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


def register(sub: argparse._SubParsersAction) -> None:
    s = reports(sub.add_parser("show", help="one recipe resolved: input digest, tag, launch command"))
    s.add_argument("name")
    s.set_defaults(func=cmd_show)
