"""The unit tier's guard, process level: refuse and record every attempt to reach the
Docker daemon, any TCP/UDP peer (loopback included: registries and vLLM servers listen
there), a DNS lookup, or to start a program that builds, serves, installs or downloads.

It is installed in the pytest process by tests/unitguard.py and in every Python child
process through this folder's sitecustomize.py (the plugin puts this folder first on
the children's PYTHONPATH, whatever `env=` a test passes). A refused call raises an
OSError (so the code under test takes its ordinary "cannot connect" or "cannot run"
path) AND appends one JSON line to the file named by KILN_UNIT_GUARD_LOG: that record,
not the exception, is what fails the test, so code that catches the error (the Docker
SDK, kiln's own "daemon gone" handling, a child process whose exit status the test
expects to be non-zero) cannot hide it.

Reach, stated plainly: Python code in the test process and in any Python process it
starts (directly or through other Python processes). Spawns are checked by program
name whatever the path (`/usr/bin/docker` too), through `sh -c "..."` strings and
`env`/`timeout`-style wrappers. A non-Python program that itself connects or spawns
(e.g. a shell script file calling `docker`) is beyond this reach; for those the plugin
also points DOCKER_HOST at a socket that does not exist, so they cannot reach the
daemon either.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

ENV_ON = "KILN_UNIT_GUARD"  # "1" in every guarded process
ENV_LOG = "KILN_UNIT_GUARD_LOG"  # the current test's violation log (JSON lines)
ENV_DAEMONS = "KILN_UNIT_GUARD_DAEMONS"  # the host's own DOCKER_HOST socket, if it named one
SITE_DIR = os.path.dirname(os.path.abspath(__file__))
# DOCKER_HOST in the unit tier: a socket that cannot exist (and that the guard refuses by name)
UNUSABLE_DOCKER_HOST = "unix:///nonexistent/kiln-unit-guard/docker.sock"

# programs that need the daemon, a registry, the Debian mirror or the package index
BLOCKED_PROGRAMS = frozenset(
    {
        "docker",
        "dockerd",
        "containerd",
        "docker-registry",
        "debootstrap",
        "apt-get",
        "apt",
    }
)
PIP_PROGRAMS = frozenset({"pip", "pip3", "uv"})  # blocked for install/download only
PIP_BLOCKED_COMMANDS = frozenset({"install", "download"})
# wrappers whose first non-option word is the real program
WRAPPERS = frozenset({"env", "sudo", "timeout", "nice", "nohup", "stdbuf", "exec", "command", "setsid"})
SHELLS = frozenset({"sh", "bash", "dash", "zsh"})
# AF_UNIX socket names that are a container daemon
DAEMON_SOCKET_SUFFIXES = ("docker.sock", "containerd.sock", "podman.sock")
KNOWN_DAEMON_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock")
LOCAL_HOSTNAMES = frozenset({"", "localhost", "localhost.localdomain", "ip6-localhost"})

_log_path: str | None = os.environ.get(ENV_LOG)
_installed = False


class UnitGuardRefused(PermissionError):
    """Raised where the unit tier refuses a connection or a program."""


# -- recording ------------------------------------------------------------------------
def set_log(path: str | None) -> None:
    """Where the current test's violations go (the plugin calls this before each test)."""
    global _log_path
    _log_path = path
    if path is None:
        os.environ.pop(ENV_LOG, None)
    else:
        os.environ[ENV_LOG] = path


def _refuse(kind: str, detail: str) -> UnitGuardRefused:
    record = {"kind": kind, "detail": detail, "pid": os.getpid(), "argv": sys.argv[:4]}
    line = json.dumps(record)
    if _log_path:
        try:
            with open(_log_path, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")
        except OSError:
            pass  # the message below still says it, and the plugin fails tests with no log
    try:  # the except line says why it passes  # noqa: SIM105
        sys.stderr.write(f"kiln unit guard: refused {kind}: {detail}\n")
    except (OSError, ValueError):  # stderr closed
        pass
    return UnitGuardRefused(f"kiln unit guard: {kind} refused in the unit tier: {detail}")


def read_log(path: str) -> list[dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except FileNotFoundError:
        return []


# -- what counts --------------------------------------------------------------------
def blocked_argv(argv: Sequence[str]) -> str | None:
    """Why running `argv` is refused, or None."""
    words = [str(w) for w in argv]
    while words:
        prog = os.path.basename(words[0])
        rest = words[1:]
        if prog in BLOCKED_PROGRAMS:
            return shlex.join(words)[:300]
        if prog in PIP_PROGRAMS:
            return shlex.join(words)[:300] if _pip_subcommand(rest) else None
        if _is_python(prog):
            if "-m" in rest:
                at = rest.index("-m")
                module = rest[at + 1] if at + 1 < len(rest) else ""
                if module in {"pip", "pip3"} and _pip_subcommand(rest[at + 2 :]):
                    return shlex.join(words)[:300]
            return None
        if prog in SHELLS:
            if "-c" in rest and rest.index("-c") + 1 < len(rest):
                return blocked_shell(rest[rest.index("-c") + 1])
            return None
        if prog in WRAPPERS:
            # skip options and VAR=value words; what follows is the program
            while rest and (
                rest[0].startswith("-")
                or ("=" in rest[0] and not rest[0].startswith("/"))
                or (prog == "timeout" and rest[0][:1].isdigit())
            ):
                rest = rest[1:]
            words = rest
            continue
        return None
    return None


def blocked_shell(command: str) -> str | None:
    """Why a shell command string is refused: any simple command in it that is refused."""
    command = command.replace("\n", " ; ")
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|()<>")
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError:
        tokens = command.split()
    current: list[str] = []
    for tok in [*tokens, ";"]:
        if tok and set(tok) <= set(";&|()<>"):
            if current and (why := blocked_argv(current)):
                return why
            current = []
        else:
            current.append(tok)
    return None


def _pip_subcommand(args: Sequence[str]) -> bool:
    for word in args:
        if word.startswith("-"):
            continue
        return word in PIP_BLOCKED_COMMANDS
    return False


def _is_python(prog: str) -> bool:
    return (prog.startswith("python") and prog[6:].replace(".", "").isdigit()) or prog == "python"


def blocked_address(family: int, address: Any) -> str | None:
    """Why connecting (or sending) to `address` is refused, or None."""
    if family == getattr(socket, "AF_UNIX", None):
        path = address.decode(errors="replace") if isinstance(address, bytes) else str(address)
        if path.startswith("\0"):
            return None  # abstract namespace: never a daemon socket here
        if path in _daemon_sockets() or (path.endswith(DAEMON_SOCKET_SUFFIXES) and os.path.exists(path)):
            return f"unix socket {path} (a container daemon)"
        # any other path: a socket a test made itself, or one that does not exist (a
        # test that points DOCKER_HOST at a missing socket asks for "no daemon" on purpose)
        return None
    if family in (socket.AF_INET, socket.AF_INET6):
        host, port = address[0], address[1]
        return f"{host}:{port}"
    return None


def _daemon_sockets() -> set[str]:
    """The unit tier's stand-in DOCKER_HOST (reaching it means reaching for the ambient
    daemon) and the daemon's usual sockets, also through symlinks."""
    given = [p for p in os.environ.get(ENV_DAEMONS, "").split(os.pathsep) if p]
    out = {UNUSABLE_DOCKER_HOST.removeprefix("unix://"), *KNOWN_DAEMON_SOCKETS, *given}
    out |= {os.path.realpath(p) for p in KNOWN_DAEMON_SOCKETS if os.path.exists(p)}
    return out


def blocked_lookup(host: Any) -> str | None:
    if host is None:
        return None
    name = host.decode() if isinstance(host, bytes) else str(host)
    if name.lower() in LOCAL_HOSTNAMES or _is_numeric(name):
        return None
    return name


def _is_numeric(name: str) -> bool:
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, name)
            return True
        except (OSError, ValueError):
            continue
    return False


# -- child environments ---------------------------------------------------------------
def child_env(env: dict[str, str] | None) -> dict[str, str]:
    """`env` (or os.environ) with the guard switched on for Python children."""
    out = dict(os.environ if env is None else env)
    out[ENV_ON] = "1"
    if os.environ.get(ENV_DAEMONS):
        out[ENV_DAEMONS] = os.environ[ENV_DAEMONS]
    if _log_path:
        out[ENV_LOG] = _log_path
    parts = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p and p != SITE_DIR]
    out["PYTHONPATH"] = os.pathsep.join([SITE_DIR, *parts])
    out.setdefault("DOCKER_HOST", UNUSABLE_DOCKER_HOST)
    return out


# -- installing -----------------------------------------------------------------------
def install(*, host_docker: str | None = None) -> None:
    """Patch socket, subprocess and os in this process (idempotent). `host_docker`: the
    host's own DOCKER_HOST (the plugin passes it), whose socket is refused too."""
    global _installed
    if host_docker and host_docker.startswith("unix://") and host_docker != UNUSABLE_DOCKER_HOST:
        os.environ[ENV_DAEMONS] = host_docker.removeprefix("unix://")
    if _installed:
        return
    _installed = True
    os.environ[ENV_ON] = "1"
    _patch_socket()
    _patch_spawns()


def _patch_socket() -> None:
    cls = socket.socket
    real_connect, real_connect_ex = cls.connect, cls.connect_ex
    real_sendto, real_sendmsg = cls.sendto, cls.sendmsg

    def connect(self: socket.socket, address: Any) -> None:
        if why := blocked_address(self.family, address):
            raise _refuse(_kind(self), why)
        return real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        if why := blocked_address(self.family, address):
            raise _refuse(_kind(self), why)
        return real_connect_ex(self, address)

    def sendto(self: socket.socket, data: Any, *args: Any) -> int:
        address = args[-1] if args else None
        if address is not None and (why := blocked_address(self.family, address)):
            raise _refuse(_kind(self), why)
        return real_sendto(self, data, *args)

    def sendmsg(self: socket.socket, buffers: Any, ancdata: Any = (), flags: int = 0, address: Any = None) -> int:
        if address is not None and (why := blocked_address(self.family, address)):
            raise _refuse(_kind(self), why)
        return real_sendmsg(self, buffers, ancdata, flags, *([address] if address is not None else []))

    # the guard is these patches
    cls.connect, cls.connect_ex, cls.sendto, cls.sendmsg = connect, connect_ex, sendto, sendmsg  # type: ignore[method-assign]

    real_getaddrinfo, real_gethostbyname = socket.getaddrinfo, socket.gethostbyname

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if why := blocked_lookup(host):
            raise _refuse("DNS lookup", why)
        return real_getaddrinfo(host, *args, **kwargs)

    def gethostbyname(host: str) -> str:
        if why := blocked_lookup(host):
            raise _refuse("DNS lookup", why)
        return real_gethostbyname(host)

    socket.getaddrinfo, socket.gethostbyname = getaddrinfo, gethostbyname  # type: ignore[assignment]  # the guard


def _kind(sock: socket.socket) -> str:
    if sock.family == getattr(socket, "AF_UNIX", None):
        return "Docker daemon connection"
    return "UDP connection" if sock.type == socket.SOCK_DGRAM else "TCP connection"


def _patch_spawns() -> None:
    popen_init = subprocess.Popen.__init__

    def init(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
        shell = kwargs.get("shell", False)
        if isinstance(args, (str, bytes)):
            text = args.decode() if isinstance(args, bytes) else args
            why = blocked_shell(text) if shell else blocked_argv([text])
        else:
            argv = [os.fsdecode(a) for a in args]
            if kwargs.get("executable"):
                argv[:1] = [os.fsdecode(kwargs["executable"])]
            why = blocked_shell(shlex.join(argv)) if shell else blocked_argv(argv)
        if why:
            raise _refuse("program", why)
        if len(rest) < 10:  # env passed by keyword (or not at all): give the child the guard
            kwargs["env"] = child_env(kwargs.get("env"))
        popen_init(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = init  # type: ignore[method-assign]  # the guard

    real_system = os.system

    def system(command: str) -> int:
        if why := blocked_shell(command):
            raise _refuse("program", why)
        return real_system(command)

    os.system = system

    def wrap_exec(name: str, argv_at: int) -> None:
        real: Callable[..., Any] | None = getattr(os, name, None)
        if real is None:
            return

        def guarded(*args: Any, **kwargs: Any) -> Any:
            argv = _exec_argv(name, args, argv_at)
            if argv and (why := blocked_argv(argv)):
                raise _refuse("program", why)
            return real(*args, **kwargs)  # type: ignore[misc]  # real is not None here

        setattr(os, name, guarded)

    # argv position: execv(path, argv), spawnv(mode, path, argv), posix_spawn(path, argv, env)
    for name in ("execv", "execve", "execvp", "execvpe", "posix_spawn", "posix_spawnp"):
        wrap_exec(name, 1)
    for name in ("execl", "execle", "execlp", "execlpe"):
        wrap_exec(name, -1)
    for name in ("spawnv", "spawnve", "spawnvp", "spawnvpe"):
        wrap_exec(name, 2)
    for name in ("spawnl", "spawnle", "spawnlp", "spawnlpe"):
        wrap_exec(name, -2)


def _exec_argv(name: str, args: Iterable[Any], argv_at: int) -> list[str]:
    args = list(args)
    if argv_at in (-1, -2):  # execl(path, arg0, arg1, ...), spawnl(mode, path, arg0, ...)
        at = -argv_at - 1  # where path is
        words = [os.fsdecode(a) for a in args[at + 2 :] if isinstance(a, (str, bytes))]
        return [os.fsdecode(args[at]), *words]
    if len(args) <= argv_at:
        return []
    argv = [os.fsdecode(a) for a in args[argv_at]]
    path = os.fsdecode(args[argv_at - 1])
    return [path, *argv[1:]] if argv else [path]
