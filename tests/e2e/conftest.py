"""What the e2e tests share: the machine.

`nox -s e2e` runs two xdist workers on 2 cores (noxfile.py). A tiny-moe server starts in
about 25 s on this machine alone, also beside a tiny-kindling smoke or a tiny-kindling
build (42 s and 23-29 s, measured 2026-12-06). But test_tiny_kindling.py's module boots
four tiny-kindling servers at once and keeps them busy with request sets under Triton's
interpreter: beside that, a tiny-moe server in the daemon group went past its recipe's
300 s start limit twice in CI (2026-12-06, stops 41 and 42: test_tiny_moe's smoke, then
test_plan_cpu's KV check; vLLM's own log advanced about ten times slower than alone).
So that module takes the machine alone (`MACHINE_ALONE = True` in it) and every other
e2e test that uses the daemon shares it (kilntest.machine_share). The kernels tier
starts no server and takes no share."""

from __future__ import annotations

import pytest
from kilntest import machine_share


@pytest.fixture(autouse=True)
def _a_share_of_the_machine(request, tmp_path_factory):
    if request.node.get_closest_marker("docker") is None or getattr(request.module, "MACHINE_ALONE", False):
        yield
        return
    # under xdist each worker's basetemp is popen-gwN inside one directory of this run
    with machine_share(tmp_path_factory.getbasetemp().parent, alone=False):
        yield
