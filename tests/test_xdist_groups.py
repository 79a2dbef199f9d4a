"""kilntest.assign_xdist_groups (tests/conftest.py's hook): what may run beside what under `nox -s integration`."""

from __future__ import annotations

from pathlib import Path

import pytest
from kilntest import DAEMON_GROUP, assign_xdist_groups


class _Item:
    def __init__(self, path: str, *marks: pytest.MarkDecorator):
        self.path = Path("/repo") / path
        self.marks = [m.mark for m in marks]

    def get_closest_marker(self, name):
        return next((m for m in self.marks if m.name == name), None)

    def add_marker(self, marker):
        self.marks.append(marker.mark)

    @property
    def group(self) -> str:
        (mark,) = [m for m in self.marks if m.name == "xdist_group"]
        return mark.args[0]


def test_daemon_tests_share_one_group_and_a_module_never_splits_or_loses_its_own():
    items = [_Item("tests/test_build_docker.py", pytest.mark.docker),
             _Item("tests/publish/test_publish.py", pytest.mark.docker, pytest.mark.registry),
             _Item("tests/publish/test_registry_faults.py", pytest.mark.registry),
             _Item("tests/test_docs.py", pytest.mark.network),
             _Item("tests/test_docs.py", pytest.mark.network),
             _Item("tests/cuda/test_argcheck_docker.py", pytest.mark.docker, pytest.mark.xdist_group("argcheck"))]
    assign_xdist_groups(Path("/repo"), items)
    assert [i.group for i in items] == [DAEMON_GROUP] * 3 + ["tests/test_docs.py"] * 2 + ["argcheck"]
