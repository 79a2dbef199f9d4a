r"""What env a recipe (`launch.env`) or an override (`env:`) may set for the server.

That env reaches the container unchanged: baked into `_kiln/launch.json`, spelled out as
`docker run -e` by `kiln run`, and written into Kubernetes manifests by `kiln render`.
Two rules, both checked when the file is loaded (exit 2, no image needed):

- A value is one line of text: no control characters (C0 including tab and newline,
  DEL, C1) and no Unicode line or paragraph separator. `"x\nRUN touch /pwned"` is
  harmless today (env never goes into a Dockerfile), but it is never what an author
  meant, and any tool that writes env one variable a line (`--env-file`, `kiln run
  --print`, a Dockerfile ENV) would read a second line out of it.
- A variable that makes the image's programs load code from outside the image's own
  files (the dynamic loader's, Python's start-up, the shell's start-up, the executable
  search path) is set only together with `allow_unsafe_env: {NAME: why}` in the same
  file. An allowance for a name the file does not set, or one that is not such a
  variable, is an error too, so no allowance outlives its reason.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Mapping
from typing import Annotated

from pydantic import AfterValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

# The loader: every LD_* variable is ld.so's (ld.so(8)), read by every dynamically linked
# program in the image (tini, python, vllm's workers, the healthcheck). Some load code
# (LD_PRELOAD, LD_AUDIT), some move the library search (LD_LIBRARY_PATH), some stop the
# program from running at all (LD_TRACE_LOADED_OBJECTS lists the libraries and exits) or
# write files (LD_DEBUG_OUTPUT, LD_PROFILE_OUTPUT); none is something a server needs by
# default. kiln-serve (docker-images/common/kiln-serve) sets LD_PRELOAD itself for the
# CPU engine (tcmalloc, libiomp5) unless the container's env has one.
_UNSAFE_PREFIXES: dict[str, str] = {
    "LD_": "the dynamic loader (ld.so) reads it in every process of the image: LD_* variables load "
    "libraries, move the library search, write files or stop programs from running",
}
_UNSAFE: dict[str, str] = {
    "LD_PRELOAD": "ld.so loads those libraries into every process of the image before its own (and it "
    "replaces the tcmalloc/libiomp5 preload kiln-serve sets for the CPU engine)",
    "LD_LIBRARY_PATH": "ld.so searches those folders before the image's own: a library there replaces "
    "libc, libcuda or torch's",
    "LD_AUDIT": "ld.so loads those libraries into every process, and they see and can redirect every symbol binding",
    # glibc's tunables are parsed by ld.so before anything else (CVE-2023-4911 was there)
    # and change the allocator and CPU feature selection of every process
    "GLIBC_TUNABLES": "ld.so parses it before any program code runs and changes the allocator and CPU "
    "features of every process",
    # iconv loads its converters as shared objects from this folder (the pkexec exploit,
    # CVE-2021-4034, used exactly that)
    "GCONV_PATH": "iconv loads its converter modules (shared libraries) from this folder",
    "PYTHONPATH": "its folders come first on sys.path: a module there replaces vllm's, torch's or the "
    "standard library's (a mounted model folder or the HF cache would become code)",
    "PYTHONHOME": "python loads its whole standard library from there instead of the image's",
    "PYTHONUSERBASE": "python adds that folder's site-packages to sys.path and runs its .pth files at start",
    "PYTHONSTARTUP": "every interactive python in the container (docker exec ... python) runs that file first",
    "BASH_ENV": "every non-interactive bash (scripts, `bash -c`) runs that file first",
    "ENV": "sh (dash) and bash in POSIX mode run that file first in interactive shells (docker exec ... sh)",
    "SHELLOPTS": "bash takes its options from it at start; with xtrace it expands PS4, command "
    "substitutions included, before every command",
    # kiln-serve execs `vllm` through PATH (os.execvpe), and vLLM, torch and triton start
    # compilers and helpers through it; env values are not shell-expanded, so a recipe
    # cannot even extend the image's PATH, only replace it
    "PATH": "it decides which `vllm`, python and compiler programs run (kiln-serve execs vllm through it), "
    'and replaces the image\'s PATH whole (values are not expanded: "$PATH:/x" is literal)',
}
# Not listed, on purpose: PYTHONINSPECT (keeps a finished python at a prompt; a container
# has no stdin, so it exits all the same), PYTHONWARNINGS and PYTHONBREAKPOINT (import
# only modules already importable from the image), PERL5OPT / NODE_OPTIONS (no perl or
# node program runs in the serving path). Names of bash's exported functions
# (BASH_FUNC_x%%) cannot be written: env names must match ^[A-Za-z_][A-Za-z0-9_]*$.


def _why_unsafe(name: str) -> str | None:
    """Why `name` needs an allowance (None: it does not)."""
    if name in _UNSAFE:
        return _UNSAFE[name]
    return next((why for prefix, why in _UNSAFE_PREFIXES.items() if name.startswith(prefix)), None)


_SEPARATORS = {"\u2028": "line separator", "\u2029": "paragraph separator"}


def _first_control(value: str) -> str | None:
    """`U+000A at offset 1` for the first character that breaks a one-line value."""
    for i, ch in enumerate(value):
        if unicodedata.category(ch) == "Cc" or ch in _SEPARATORS:
            return f"U+{ord(ch):04X} at offset {i}"
    return None


def _one_line(value: str) -> str:
    bad = _first_control(value)
    if bad:
        raise PydanticCustomError("env_value", f"control character {bad}: an env value is one line of text")
    return value


def _reason(value: str) -> str:
    bad = _first_control(value)
    if bad:
        raise PydanticCustomError("reason", f"control character {bad}: a reason is one line of text")
    if not value.strip():
        raise PydanticCustomError("reason", "must say why the variable is needed (an empty reason allows nothing)")
    return value


# JSON Schema (editors) spells the same rules as patterns; the validators above give the
# messages kiln prints
_NO_CONTROL = "\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029"
EnvValue = Annotated[
    str, AfterValidator(_one_line), WithJsonSchema({"type": "string", "pattern": f"^[^{_NO_CONTROL}]*$"})
]
Reason = Annotated[
    str,
    AfterValidator(_reason),
    WithJsonSchema({"type": "string", "pattern": f"^[^{_NO_CONTROL}]*\\S[^{_NO_CONTROL}]*$"}),
]

ALLOW_DESCRIPTION = (
    "variables of env that make the image's programs load code from elsewhere (LD_*, PYTHONPATH, "
    "PYTHONHOME, PATH, BASH_ENV, ...), each with the reason it is needed: NAME: why"
)


def problems(
    env: Mapping[str, str],
    allowed: Mapping[str, str],
    where: Callable[..., str],
    env_loc: tuple[str, ...],
    allow_loc: tuple[str, ...],
) -> list[str]:
    """One `file:line: field: message` per unsafe variable set without an allowance and
    per allowance that allows nothing. `where(*loc)` gives `file:line`; env_loc and
    allow_loc are the paths of the env and allowance mappings in the file."""
    env_field, allow_field = ".".join(env_loc), ".".join(allow_loc)
    out = []
    for name in env:
        why = _why_unsafe(name)
        if why is not None and name not in allowed:
            out.append(
                f"{where(*env_loc, name)}: {env_field}.{name}: {why}; if it is needed, "
                f"say why under {allow_field}: {{{name}: REASON}}"
            )
    for name in allowed:
        if name not in env:
            out.append(
                f"{where(*allow_loc, name)}: {allow_field}.{name}: allows {name}, which {env_field} "
                "does not set: remove the allowance"
            )
        elif _why_unsafe(name) is None:
            out.append(
                f"{where(*allow_loc, name)}: {allow_field}.{name}: {name} needs no allowance "
                "(not a loader, Python or shell start-up variable): remove it"
            )
    return out
