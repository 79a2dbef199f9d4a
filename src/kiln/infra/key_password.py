"""Where the signing key's password comes from: the environment or stdin, never argv.

`KILN_SIGNING_PASSWORD`, else cosign's `COSIGN_PASSWORD` (so a CI job set up for cosign
works unchanged); a variable that is set but empty means the empty password, as for
cosign. Without either: typed at a terminal (not echoed), or the first line of stdin when
stdin is a pipe. No command-line flag takes a password: argv is readable by every user of
the machine (/proc/PID/cmdline) and lands in shell history.
"""

from __future__ import annotations

import getpass
import os
import sys

from kiln.basics.errors import SigningPasswordInvalid

_ENV_VARS = ("KILN_SIGNING_PASSWORD", "COSIGN_PASSWORD")
_MAX_PASSWORD = 4096


def _from_environment() -> bytes | None:
    for name in _ENV_VARS:
        if name in os.environ:
            return os.environ[name].encode()
    return None


def read(*, what: str, confirm: bool = False, stdin_taken: str | None = None) -> bytes:
    """The password for `what` (a key file, for the prompt). `stdin_taken` names the flag
    that already reads stdin (the registry's --password-stdin), so both cannot."""
    env = _from_environment()
    if env is not None:
        return env
    if stdin_taken:
        raise SigningPasswordInvalid(
            f"{stdin_taken} reads the registry password from stdin, so the password for "
            f"{what} cannot come from there too",
            hint="set KILN_SIGNING_PASSWORD (or COSIGN_PASSWORD) for the signing key",
        )
    if sys.stdin is not None and sys.stdin.isatty():
        first = getpass.getpass(f"Enter password for {what}: ", stream=sys.stderr)
        if confirm and getpass.getpass(f"Enter password for {what} again: ", stream=sys.stderr) != first:
            raise SigningPasswordInvalid(f"the two passwords typed for {what} differ; nothing was written")
        return first.encode()
    line = sys.stdin.readline(_MAX_PASSWORD + 1) if sys.stdin is not None else ""
    if not line:
        raise SigningPasswordInvalid(f"no password for {what}: KILN_SIGNING_PASSWORD is not set and stdin is empty")
    if len(line) > _MAX_PASSWORD:
        raise SigningPasswordInvalid(f"the password for {what} on stdin is longer than {_MAX_PASSWORD} characters")
    return line.removesuffix("\n").removesuffix("\r").encode()
