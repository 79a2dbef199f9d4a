"""`kiln` command line. Each subcommand is a small function; errors are KilnError
subclasses turned into one-line messages and their exit codes here, and only here."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import traceback
from importlib.metadata import PackageNotFoundError, version

import shtab
from rich.markup import escape

from kiln import __version__
from kiln.basics import log
from kiln.basics.errors import KilnError, UsageError
from kiln.basics.paths import recipes_dir
from kiln.commands import fetch as fetchcmd
from kiln.commands import keys as keyscmd
from kiln.commands import patches as patchcmd
from kiln.commands import plan as plancmd
from kiln.commands import publish
from kiln.commands import render as k8s
from kiln.commands import sbom as sbomcmd
from kiln.commands import verify as verifycmd
from kiln.commands.base import build_base
from kiln.commands.build import build_recipe
from kiln.commands.check import check
from kiln.commands.doctor import doctor
from kiln.commands.prune import prune
from kiln.commands.serve import logs, ps, run, stop
from kiln.commands.smoke import smoke_cli
from kiln.domain.images import resolve
from kiln.domain.launch import launch_document
from kiln.domain.recipe import json_schema, load_recipe, recipe_names
from kiln.infra.docker import DockerDaemon


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would exit 2, which means "recipe invalid" here
        # the CLI adds the one `kiln: error:` prefix; the hint names the right --help
        raise UsageError(message, hint=f"see `{self.prog} --help`")


def _version() -> str:
    try:
        return version("kiln")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return __version__


# -- commands -------------------------------------------------------------------------
def cmd_list(args) -> int:
    rows = []
    for name in recipe_names():
        try:
            r = load_recipe(recipes_dir() / name).recipe
            rows.append({"name": r.name, "valid": True, "engine": {"name": r.engine.name, "version": r.engine.version,
                         "flavour": r.engine.flavour}, "served_model_name": r.launch.served_model_name})
        except KilnError as exc:
            rows.append({"name": name, "valid": False, "problem": exc.lines()[0]})
    if args.json:
        log.emit_json({"recipes": rows})
        return 0
    for row in rows:
        if row["valid"]:
            e = row["engine"]
            log.out.print(f"{row['name']:24} {e['name']}=={e['version']} {e['flavour']:5} {row['served_model_name']}", markup=False)
        else:
            log.out.print(f"{row['name']:24} INVALID (kiln check {row['name']})", markup=False)
    return 0


def show_document(name: str) -> dict:
    loaded, engine_image, recipe_image = resolve(name)
    return {
        "recipe": loaded.recipe.model_dump(mode="json", by_alias=True),
        "file": str(loaded.file),
        "input_digest": recipe_image.digest,
        "tag": recipe_image.tag,
        "engine_image": {"tag": engine_image.tag, "input_digest": engine_image.digest},
        "launch": launch_document(loaded),
    }


def cmd_show(args) -> int:
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


def cmd_check(args) -> int:
    return check(args.name, all_recipes=args.all, as_json=args.json)


def cmd_schema(args) -> int:
    print(json.dumps(json_schema(), indent=2))
    return 0


def cmd_build(args) -> int:
    outcome = build_recipe(args.name, force=args.force or args.no_cache, force_engine=args.force_engine,
                           ca_flag=args.ca_bundle, nocache=args.no_cache)
    if args.json:
        log.emit_json(outcome.document(args.name))
    return 0


def cmd_base_build(args) -> int:
    build_base(DockerDaemon(), tag=args.tag, force=args.force)
    return 0


def cmd_doctor(args) -> int:
    return doctor(as_json=args.json)


def cmd_run(args) -> int:
    return run(args)


def cmd_ps(args) -> int:
    return ps(args)


def cmd_logs(args) -> int:
    return logs(args)


def cmd_stop(args) -> int:
    return stop(args)


def cmd_prune(args) -> int:
    return prune(args.names, dry_run=args.dry_run)


def cmd_smoke(args) -> int:
    return smoke_cli(args)


def cmd_completion(args) -> int:
    print(shtab.complete(build_parser(), shell=args.shell))
    return 0


# -- parser ---------------------------------------------------------------------------
def _node_count(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 64:
        raise argparse.ArgumentTypeError(f"{text!r} is not a node count in 1..64")
    return int(text)


def _reports(s: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """A command that reports something: --json prints one document on stdout
    (schema: src/kiln/schemas/<command>.json, docs/cli-json.md)."""
    s.add_argument("--json", action="store_true", help="print one JSON document on stdout (docs/cli-json.md)")
    return s


def _global_flags(p: argparse.ArgumentParser, default) -> None:
    # on every (sub)parser, so `kiln build x -q` works as well as `kiln -q build x`;
    # SUPPRESS in subparsers keeps them from resetting a flag given before the command
    p.add_argument("--debug", action="store_true", default=default, help="show tracebacks and build output")
    p.add_argument("-q", "--quiet", action="store_true", default=default,
                   help="no progress or summaries on stderr (errors and warnings still print)")


class _SubParser(_Parser):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _global_flags(self, argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kiln", description="Build, serve, smoke-test and publish per-model vLLM images.")
    p.add_argument("--version", action="version", version=f"kiln {_version()}")
    _global_flags(p, False)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_SubParser)

    s = _reports(sub.add_parser("list", help="list recipes"))
    s.set_defaults(func=cmd_list)
    s = _reports(sub.add_parser("show", help="one recipe resolved: input digest, tag, launch command"))
    s.add_argument("name")
    s.set_defaults(func=cmd_show)
    s = _reports(sub.add_parser("check", help="validate recipes without building"))
    s.add_argument("name", nargs="?")
    s.add_argument("--all", action="store_true")
    s.set_defaults(func=cmd_check)
    s = sub.add_parser("schema", help="print the recipe JSON Schema")
    s.set_defaults(func=cmd_schema)
    s = _reports(sub.add_parser("build", help="build a recipe's image (engine image first if needed)"))
    s.add_argument("name")
    s.add_argument("--force", action="store_true", help="rebuild even if an image with this input digest exists")
    s.add_argument("--force-engine", action="store_true", help="rebuild the engine image too")
    s.add_argument("--no-cache", action="store_true", help="ignore the daemon's layer cache (with --force-engine: for the engine too)")
    s.add_argument("--ca-bundle", help="PEM bundle builds trust (default: $KILN_CA_BUNDLE, else pip's cert)")
    s.set_defaults(func=cmd_build)
    base = sub.add_parser("base", help="the air-gapped Debian base image")
    bsub = base.add_subparsers(dest="base_command", required=True, parser_class=_SubParser)
    s = bsub.add_parser("build", help="debootstrap + import kiln/base:bookworm")
    s.add_argument("--tag", default=None)
    s.add_argument("--force", action="store_true")
    s.set_defaults(func=cmd_base_build)
    s = sub.add_parser("prune", help="remove kiln images no current recipe input produces")
    s.add_argument("names", nargs="*", help="only these recipes' images (default: all recipes and engines)")
    s.add_argument("--dry-run", action="store_true", help="only list them")
    s.set_defaults(func=cmd_prune)
    s = _reports(sub.add_parser("doctor", help="check this machine"))
    s.set_defaults(func=cmd_doctor)
    s = sub.add_parser("run", help="serve a recipe's image (extra vLLM args after --)",
                       usage="kiln run NAME [--print] [--port P] [--detach] [-e VAR=VALUE ...] [-- VLLM ARGS ...]")
    s.add_argument("name")
    s.add_argument("-e", "--env", action="append", metavar="VAR=VALUE", help="set a container env var (wins over the recipe's)")
    s.add_argument("--print", action="store_true", help="only print the docker run command")
    s.add_argument("--port", type=int, default=None, help="host port (default: the recipe's port)")
    s.add_argument("--detach", action="store_true", help="return once healthy, leave it running")
    s.set_defaults(func=cmd_run)
    s = sub.add_parser("ps", help="containers kiln started")
    s.add_argument("-a", "--all", action="store_true", help="stopped ones too")
    s.set_defaults(func=cmd_ps)
    s = sub.add_parser("logs", help="a kiln container's log")
    s.add_argument("name", help="a container name from `kiln ps`, or a recipe with one running container")
    s.add_argument("-f", "--follow", action="store_true")
    s.add_argument("--tail", type=int, default=None, metavar="N", help="only the last N lines")
    s.set_defaults(func=cmd_logs)
    s = sub.add_parser("stop", help="stop and remove kiln containers")
    s.add_argument("names", nargs="*", metavar="NAME", help="container names, or recipes (all their containers)")
    s.add_argument("--all", action="store_true", help="every container kiln started")
    s.add_argument("--timeout", type=int, default=30, help="seconds before SIGKILL")
    s.set_defaults(func=cmd_stop)
    s = _reports(sub.add_parser("smoke", help="smoke-test a built image with the OpenAI client"))
    s.add_argument("name")
    s.add_argument("--build", action="store_true", help="build first if needed")
    s.add_argument("--nodes", type=_node_count, default=None, metavar="N",
                   help="serve across N containers on a private docker network, one tensor-parallel rank each "
                        "(proves the multi-node wiring on one host; writes no smoke record)")
    s.set_defaults(func=cmd_smoke)
    patchcmd.register(sub)
    publish.register(sub)
    keyscmd.register(sub)
    verifycmd.register(sub)
    k8s.register(sub)
    sbomcmd.register(sub)
    plancmd.register(sub)
    fetchcmd.register(sub)
    s = sub.add_parser("completion", help="print a shell completion script (bash, zsh, tcsh)")
    s.add_argument("shell", choices=("bash", "zsh", "tcsh"))
    s.set_defaults(func=cmd_completion)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # before parsing, so a usage error or a crash in parsing honours them too
    log.set_debug("--debug" in argv or log.DEBUG)
    as_json = "--json" in (argv[:argv.index("--")] if "--" in argv else argv)
    try:
        # everything after a bare `--` goes to vLLM untouched (argparse mangles it in subparsers)
        passthrough: list[str] = []
        if "--" in argv:
            cut = argv.index("--")
            argv, passthrough = argv[:cut], argv[cut + 1:]
        args = build_parser().parse_args(argv)
        args.vllm_args = passthrough
        args.json = getattr(args, "json", False)
        log.set_quiet(args.quiet)
        return int(args.func(args) or 0)
    except KilnError as exc:
        if log.DEBUG:
            traceback.print_exc()
        _print_error(exc, as_json)
        return exc.exit_code
    except KeyboardInterrupt:
        log.errors.print("kiln: interrupted")
        return 130
    except BrokenPipeError:  # `kiln list | head`: the reader left; not an error of ours
        sys.stderr.close()
        return 141
    except Exception as exc:  # a bug in kiln, not a user error: say so, keep it short
        if log.DEBUG:
            raise
        log.errors.print(f"kiln: internal error: {type(exc).__name__}: {exc}", markup=False)
        log.errors.print("  hint: rerun with --debug for the traceback and report it", markup=False)
        return 1


def _print_error(exc: KilnError, as_json: bool) -> None:
    lines = exc.lines()
    err = log.errors
    err.print(f"[bold red]kiln: error:[/] {escape(lines[0])}", markup=True, highlight=False)
    for line in lines[1:]:
        if line.startswith("hint: "):
            err.print(f"  [dim]{escape(line)}[/]", markup=True, highlight=False)
        else:
            err.print(f"[bold red]kiln: error:[/] {escape(line)}", markup=True, highlight=False)
    if as_json and not log.JSON_EMITTED:  # a script reading stdout still gets one document
        problems = [ln for ln in lines if not ln.startswith("hint: ")]
        log.emit_json({"error": {"type": type(exc).__name__, "exit_code": exc.exit_code,
                                 "message": "\n".join(problems), "problems": problems,
                                 "hint": exc.hint or ""}})


if __name__ == "__main__":
    sys.exit(main())
