"""The `kiln` command line: the parser root, the one place where a KilnError becomes
a one-line message and its exit code, and where the use-cases' progress records
(kiln.usecases.progress) become kiln's lines on stderr.

The root holds the global flags, the `--` passthrough to vLLM and the command modules
of kiln.commands and its sub-packages, each of which registers its own parsers."""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from importlib.metadata import PackageNotFoundError, version
from typing import Any, NoReturn

from rich.markup import escape

from kiln import __version__
from kiln.basics import log
from kiln.basics.errors import KilnError, UsageError
from kiln.commands import completion, doctor
from kiln.commands.images import base_image, build, prune, rebuild, sbom
from kiln.commands.publishing import keys, publish, verify
from kiln.commands.recipes import check, engine, listing, patches, plan, schema, show
from kiln.commands.serving import fetch, render, serve, smoke
from kiln.infra.docker import daemon_fault
from kiln.usecases import progress

# every command module, in the order `kiln --help` lists their commands; each one's
# register(sub) adds its parser(s) with set_defaults(func=...), func(args) -> exit code
COMMANDS = (
    listing,
    show,
    check,
    schema,
    build,
    base_image,
    prune,
    doctor,
    serve,
    smoke,
    patches,
    engine,
    publish,
    keys,
    verify,
    render,
    plan,
    fetch,
    sbom,
    rebuild,
    completion,
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse would exit 2, which means "recipe invalid" here
        # the CLI adds the one `kiln: error:` prefix; the hint names the right --help
        raise UsageError(message, hint=f"see `{self.prog} --help`")


def _version() -> str:
    try:
        return version("kiln")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return __version__


def _global_flags(p: argparse.ArgumentParser, default: Any) -> None:
    # on every (sub)parser, so `kiln build x -q` works as well as `kiln -q build x`;
    # SUPPRESS in subparsers keeps them from resetting a flag given before the command
    p.add_argument("--debug", action="store_true", default=default, help="show tracebacks and build output")
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=default,
        help="no progress or summaries on stderr (errors and warnings still print)",
    )


class _SubParser(_Parser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _global_flags(self, argparse.SUPPRESS)


def _build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kiln", description="Build, serve, smoke-test and publish per-model vLLM images.")
    p.add_argument("--version", action="version", version=f"kiln {_version()}")
    _global_flags(p, False)
    # `kiln completion` describes the whole parser, and commands may not import cli
    p.set_defaults(root_parser=p)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_SubParser)
    for command in COMMANDS:
        command.register(sub)
    return p


class _ProgressLines(logging.Handler):
    """The use-cases' progress records, each shown as the kiln.basics.log line of its kind."""

    def emit(self, record: logging.LogRecord) -> None:
        # no handleError: a failing stderr (a closed pipe) reaches main as it would from log
        kind, message = getattr(record, progress.KIND, "info"), record.getMessage()
        if kind == "summary":
            log.summary(message, getattr(record, progress.ROWS))
        elif kind == "verdict":
            mark = "[green]pass[/]" if getattr(record, progress.PASSED) else "[red]FAIL[/]"
            log.console.print(f"  {mark} {message}: ", end="", markup=True)
            log.console.print(getattr(record, progress.DETAIL), markup=False, highlight=False)
        elif kind == "output":
            log.console.print(message, markup=False)
        else:
            {"step": log.step, "ok": log.ok, "warn": log.warn, "debug": log.debug}.get(kind, log.info)(message)


def _show_progress() -> None:
    """The use-cases' progress on stderr, once however often main runs (tests run it in-process)."""
    if not any(isinstance(handler, _ProgressLines) for handler in progress.LOGGER.handlers):
        progress.LOGGER.addHandler(_ProgressLines())


def main(argv: list[str] | None = None) -> int:
    """Run one `kiln` command line; its exit code."""
    argv = sys.argv[1:] if argv is None else argv
    _show_progress()
    # before parsing, so a usage error or a crash in parsing honours them too
    log.set_debug("--debug" in argv or log.DEBUG)
    as_json = "--json" in (argv[: argv.index("--")] if "--" in argv else argv)
    try:
        # everything after a bare `--` goes to vLLM untouched (argparse mangles it in subparsers)
        passthrough: list[str] = []
        if "--" in argv:
            cut = argv.index("--")
            argv, passthrough = argv[:cut], argv[cut + 1 :]
        args = _build_parser().parse_args(argv)
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
        fault = daemon_fault(exc)
        if fault is not None:  # a daemon call kiln forgot to name: still the daemon's fault, not a bug
            if log.DEBUG:
                traceback.print_exc()
            _print_error(fault, as_json)
            return fault.exit_code
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
        log.emit_json(exc.document())


if __name__ == "__main__":
    sys.exit(main())
