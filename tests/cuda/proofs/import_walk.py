#!/usr/bin/env python3
"""Import every module of the given packages, as pkgutil finds them, and report failures.

Runs inside the built image on CPU (stdlib only). Modules are found the way pkgutil
finds them (a directory is walked only if it is a package), from the files, without
importing a parent first, so a broken parent does not hide its children. Each module is
imported in this one process, parents first; a module that hangs is stopped after
--timeout seconds. `__main__` modules are programs (importing one runs it) and are
listed, not imported. The verdict (which failures are acceptable, and why) is the
caller's: see testkit/kiln_testkit/import_allowlist.py.

usage: import_walk.py [--json] [--timeout S] [--only M1,M2,...] PACKAGE...
(--only: import just these modules of the packages, e.g. to ask a reference image how
the modules that failed elsewhere fail there)
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import pkgutil
import signal
import sys
import time
import traceback


class ImportTimeout(Exception):
    pass


def module_names(package: str) -> list[str]:
    """Every module under `package` that pkgutil would list, found on disk only."""
    spec = importlib.util.find_spec(package)
    if spec is None:
        raise SystemExit(f"import_walk: package {package!r} is not installed")
    names = [package]
    if not spec.submodule_search_locations:
        return names
    stack = [(package, list(spec.submodule_search_locations))]
    while stack:
        prefix, paths = stack.pop()
        for info in pkgutil.iter_modules(paths):
            name = f"{prefix}.{info.name}"
            names.append(name)
            if info.ispkg:
                stack.append(
                    (name, [os.path.join(p, info.name) for p in paths if os.path.isdir(os.path.join(p, info.name))])
                )
    return sorted(set(names), key=lambda n: (n.count("."), n))


def _alarm(signum, frame):
    raise ImportTimeout("import took longer than the timeout")


def import_all(names: list[str], timeout: int) -> dict:
    ok, failed, programs = 0, {}, []
    signal.signal(signal.SIGALRM, _alarm)
    for name in names:
        if name.rsplit(".", 1)[-1] == "__main__":
            programs.append(name)
            continue
        if name in sys.modules:
            ok += 1
            continue
        signal.alarm(timeout)
        try:
            importlib.import_module(name)
            ok += 1
        except BaseException as exc:  # SystemExit and KeyboardInterrupt-like exits too
            failed[name] = _describe(exc)
        finally:
            signal.alarm(0)
    return {"modules": len(names), "imported": ok, "failed": failed, "programs": programs}


def _describe(exc: BaseException) -> dict:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return {
        "type": type(exc).__name__,
        "message": str(exc).splitlines()[0][:300] if str(exc) else "",
        "missing": getattr(exc, "name", None) if isinstance(exc, ImportError) else None,
        "where": where,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one KILN-PROOF line of JSON")
    ap.add_argument("--timeout", type=int, default=120)
    ap.add_argument("--only", default="", help="comma-separated module names")
    ap.add_argument("packages", nargs="+")
    args = ap.parse_args(argv)
    only = {m for m in args.only.split(",") if m}
    result = {}
    for package in args.packages:
        t0 = time.monotonic()
        names = module_names(package)
        if only:
            names = [n for n in names if n in only]
        result[package] = import_all(names, args.timeout)
        result[package]["seconds"] = round(time.monotonic() - t0, 1)
        r = result[package]
        print(
            f"import_walk: {package}: {r['imported']}/{r['modules']} imported, "
            f"{len(r['failed'])} failed, {len(r['programs'])} __main__ skipped "
            f"[{r['seconds']} s]",
            file=sys.stderr,
            flush=True,
        )
    if args.json:
        print("KILN-PROOF " + json.dumps(result), flush=True)
    else:
        for r in result.values():
            for name, why in sorted(r["failed"].items()):
                print(f"{name}: {why['type']}: {why['message']}")
    sys.stdout.flush()
    # hard exit: some imported modules start non-daemon threads that would keep us alive
    os._exit(0)


if __name__ == "__main__":
    main()
