"""Progress of long work (builds, pulls, pushes, health waits), drawn for who reads it.

On a terminal an `Activity` is one live line that rewrites itself (rich), with a bar
when the size of the work is known. In CI, or whenever stderr is not a terminal, live
redraws would turn into thousands of log lines, so the same activity prints a plain
heartbeat line at most every `_HEARTBEAT_S` seconds instead: the log shows the work is
alive and how far it got, without a line per chunk. `--quiet` silences both.
"""

from __future__ import annotations

import os
import time
from typing import Self

from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from kiln.basics import log

_HEARTBEAT_S = 10.0


def _live() -> bool:
    """True when progress may redraw in place: stderr is a terminal, not CI, not --quiet."""
    console = log.console
    return console.is_terminal and not os.environ.get("CI") and not console.quiet


class Activity:
    """One long-running piece of work, as a context manager:

    with Activity("pulling debian") as act:
        act.update("layer 3/7", done=1.2e8, total=3.4e8)
    """

    def __init__(
        self,
        title: str,
        *,
        unit_bytes: bool = False,
        heartbeat_s: float = _HEARTBEAT_S,
        silent: bool = False,
    ) -> None:
        self.title = title
        self.silent = silent  # shows nothing at all (a caller's own quiet mode)
        self.unit_bytes = unit_bytes  # done/total are byte counts (shown as sizes)
        self.heartbeat_s = heartbeat_s
        self.t0 = time.monotonic()
        self._last_beat = self.t0
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    @property
    def elapsed(self) -> float:
        """Seconds since the activity started."""
        return time.monotonic() - self.t0

    def __enter__(self) -> Self:
        self.t0 = self._last_beat = time.monotonic()
        if _live() and not self.silent:
            columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=24)]
            if self.unit_bytes:
                columns.append(DownloadColumn())
            columns += [TimeElapsedColumn(), TextColumn("{task.fields[detail]}")]
            # stderr written meanwhile (warnings, errors) prints above the live line; stdout
            # stays where it is, it may carry a --json document
            self._progress = Progress(
                *columns,
                console=log.console,
                transient=True,
                redirect_stdout=False,
                redirect_stderr=True,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.title, total=None, detail="")
        return self

    def restart(self, title: str) -> None:
        """The same display, now for the next part of the work (e.g. the next build step)."""
        self.title = title
        self.t0 = self._last_beat = time.monotonic()
        if self._progress is not None and self._task is not None:
            self._progress.reset(self._task, total=None, description=title, detail="")

    def update(self, detail: str = "", *, done: float | None = None, total: float | None = None) -> None:
        """The latest state; cheap to call for every chunk of a stream."""
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=done or 0, total=total or None, detail=detail[-110:])
            return
        now = time.monotonic()
        if self.silent or now - self._last_beat < self.heartbeat_s:
            return
        self._last_beat = now
        amount = ""
        if done is not None and total:
            amount = f"  {_amount(done, self.unit_bytes)} / {_amount(total, self.unit_bytes)}"
        log.info(f"... {now - self.t0:4.0f} s  {self.title}{amount}  {detail[:150]}".rstrip())

    def stop(self) -> None:
        """Remove the live line (idempotent), e.g. before printing a failure's details."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def __exit__(self, *exc: object) -> None:
        self.stop()


class BuildDisplay:
    """A build as the daemon streams it: a line per Dockerfile step and its timing, and
    a long step's own output as live progress (an `Activity`), not a flood of lines.
    `quiet` shows nothing; KILN_DEBUG shows every line of the builder's output."""

    def __init__(self, label: str, *, quiet: bool = False) -> None:
        self.label = label
        self.quiet = quiet
        self.activity = Activity(label, silent=quiet)

    def __enter__(self) -> Self:
        self.activity.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop the build's activity display."""
        self.activity.stop()

    def step_started(self, number: str, total: str, line: str) -> None:
        """Show that build step `number` of `total` started, and its line unless quiet."""
        self.activity.restart(f"{self.label} step {number}/{total}")
        if not self.quiet:
            log.console.print(f"[bold]{self.label}[/] {line[:160]}", markup=True, highlight=False)

    def step_finished(self, seconds: float, cached: bool) -> None:
        """Report the finished step's time, or that its result was cached, unless quiet."""
        if not self.quiet:
            log.info(f"  [{'cached' if cached else log.human_secs(seconds)}]")

    def pulling(self, status: str, progress: str) -> None:
        """A base image pulled during FROM."""
        if not self.quiet:
            self.activity.update(f"pull: {status} {progress}".rstrip())

    def output(self, line: str, *, chatter: bool) -> None:
        """A line the step printed; `chatter`: the builder's own bookkeeping (debug only)."""
        if self.quiet:
            return
        if log.DEBUG:
            log.info(f"    {line[:200]}")
        elif not chatter:
            # long RUN steps (pip installs) stay visibly alive without flooding the log
            self.activity.update(line)

    def failed(self, step: str, tail: list[str]) -> None:
        """The step a build failed at and the last lines it printed (even under quiet)."""
        self.stop()
        log.errors.print(f"[red]build failed at[/] {step}", markup=True, highlight=False)
        if tail:
            log.errors.print("\n".join(f"    | {line}" for line in tail), markup=False, highlight=False)


class PushDisplay:
    """A push as the daemon streams it: a line per finished layer, and the bytes sent."""

    def __init__(self, ref: str, *, quiet: bool = False) -> None:
        self.quiet = quiet
        self.activity = Activity(f"pushing {ref}", unit_bytes=True, silent=quiet)

    def __enter__(self) -> Self:
        self.activity.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.activity.stop()

    def sending(self, layers: int, done: int, total: int) -> None:
        """Show the upload's progress over its layers, unless quiet."""
        if not self.quiet:
            self.activity.update(f"{layers} layers", done=done, total=total)

    def layer_pushed(self, layer: str) -> None:
        """Report one layer pushed, unless quiet."""
        if not self.quiet:
            log.info(f"  {layer} pushed")

    def layer_present(self, layer: str, status: str) -> None:
        """Already in the registry, or mounted from another repository of it."""
        if not self.quiet:
            log.info(f"  {layer} {_lower_first(status)}")

    def layer_retrying(self, layer: str, status: str) -> None:
        """Warn that a layer's upload failed and is retried, unless quiet."""
        if not self.quiet:
            log.warn(f"{layer} upload failed; {_lower_first(status)}")


class PullDisplay:
    """A base image pull: a step line, live progress of the layers, and its time."""

    def __init__(self, ref: str) -> None:
        self.ref = ref
        self.activity = Activity(f"pulling {ref}", unit_bytes=True)

    def announce(self) -> None:
        """Print the step line that starts the pull."""
        log.step(f"pulling {self.ref}")

    def __enter__(self) -> Self:
        self.activity.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.activity.stop()

    def layer(self, layer: str, status: str, progress: str, *, done: int, total: int) -> None:
        """Show one layer's pull status and the pull's progress (each status line too under debug)."""
        if log.DEBUG:
            log.info(f"  pull {layer} {status} {progress}")
        self.activity.update(f"{layer} {status}", done=done, total=total)

    def pulled(self, seconds: float) -> None:
        """Report the pull done and its time."""
        log.ok(f"pulled {self.ref} in {log.human_secs(seconds)}")


def _lower_first(status: str) -> str:
    return f"{status[0].lower()}{status[1:]}"


def _amount(quantity: float, unit_bytes: bool) -> str:
    return log.human_size(quantity) if unit_bytes else f"{quantity:.0f}"
