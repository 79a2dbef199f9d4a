"""``triton.jit``, typed for mypy: Triton ships no type information, so every
kernel of draft_trunc is decorated through ``jit`` here and mypy sees a
``JitFunction``; inside kernels ``tl.*`` stays unchecked.

Imported lazily by the package: it needs triton, which a CPU vLLM image may lack.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol, cast, overload

import triton


class JitFunction(Protocol):
    """What kiln uses of a ``@triton.jit`` function: a launch (``fn[grid](...)``) and,
    inside other kernels, a call. Triton ships no type information, so mypy sees
    its decorator through ``jit`` below; inside kernels ``tl.*`` stays unchecked."""

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]: ...

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


@overload
def jit(fn: Callable[..., Any]) -> JitFunction: ...


@overload
def jit(*, do_not_specialize: Iterable[str]) -> Callable[[Callable[..., Any]], JitFunction]: ...


def jit(
    fn: Callable[..., Any] | None = None, *, do_not_specialize: Iterable[str] | None = None
) -> JitFunction | Callable[[Callable[..., Any]], JitFunction]:
    """``triton.jit`` (with ``do_not_specialize`` when given), typed for mypy: used
    bare it returns a ``JitFunction``, with keywords the decorator."""

    def decorate(kernel: Callable[..., Any]) -> JitFunction:
        if do_not_specialize is None:
            return cast("JitFunction", triton.jit(kernel))
        return cast("JitFunction", triton.jit(kernel, do_not_specialize=list(do_not_specialize)))

    return decorate if fn is None else decorate(fn)
