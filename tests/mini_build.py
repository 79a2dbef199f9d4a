"""The stand-in recipe the real-daemon build tests build (kiln-test-mini), and its resolved
images."""

from __future__ import annotations

NAME = "kiln-test-mini"


def resolve(name=NAME):
    from kiln.domain.images.definitions import resolve as _resolve

    return _resolve(name)
