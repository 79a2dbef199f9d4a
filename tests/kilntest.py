"""Helpers of kiln's tests (importable as `kilntest`: pytest's pythonpath). What the
benchmarks use too lives in kiln_testkit (testkit/): the checkout, trees, the CLI."""

from __future__ import annotations

import fcntl
import json
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from kiln_testkit.tree import FIXTURES, REPO, link_served_records, make_tree, renamed_mini, run_kiln, write_recipe

__all__ = [
    "DAEMON_GROUP",
    "FIRST_GROUPS",
    "FIXTURES",
    "REPO",
    "SavedImage",
    "assign_xdist_groups",
    "kiln_containers_on",
    "link_served_records",
    "machine_share",
    "make_tree",
    "passing_smoke_record",
    "remove_images",
    "renamed_mini",
    "run_kiln",
    "saved_image",
    "write_recipe",
]


# Under pytest-xdist's `--dist loadgroup` (nox -s integration and e2e) a group runs whole, in
# order, on one worker. Daemon and registry tests share named state on the one Docker
# daemon (the stand-in engine tag kiln/engine-cpu:vllm-0.0.1.dev0, which test_lock_build
# removes and rebuilds; kiln/kiln-test-mini's images, which several modules remove before
# building), so by default they form one serial group, DAEMON_GROUP: a new daemon test is
# safe without a thought. A module that touches only names of its own says so with
# `pytest.mark.xdist_group("<its own name>")` and runs beside that group. Any other test
# module is its own group, so that its module-scoped fixtures are set up once.
# In e2e, tiny-kindling's modules (group tiny-kindling) and the hub-cache module
# (tiny-moe-hf) run beside the daemon group, which keeps every test that runs tiny-moe
# by recipe name (`kiln run/logs/stop tiny-moe` would find another module's server);
# while tiny-kindling's four-server module runs, no other e2e test does (machine_share).
DAEMON_GROUP = "daemon"
# The order the groups start in under `nox -s e2e` (--no-loadscope-reorder): the daemon
# group, the longest, first on one worker; tiny-kindling's and the hub-cache modules on the
# other, then every other group (the kernels tier's modules) on whichever is free
FIRST_GROUPS = (DAEMON_GROUP, "tiny-kindling", "tiny-moe-hf")


def assign_xdist_groups(rootpath: Path, items) -> None:
    """Give every collected item its xdist group (tests/conftest.py calls this first)."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        if item.get_closest_marker("docker") or item.get_closest_marker("registry"):
            group = DAEMON_GROUP
        else:
            group = item.path.relative_to(rootpath).as_posix()
        item.add_marker(pytest.mark.xdist_group(group))
    # xdist schedules groups in the order their first test appears; a stable sort keeps
    # every group's own tests in collection order
    items.sort(key=lambda item: _rank(item.get_closest_marker("xdist_group").args[0]))


def _rank(group: str) -> int:
    return FIRST_GROUPS.index(group) if group in FIRST_GROUPS else len(FIRST_GROUPS)


@contextmanager
def machine_share(lock_dir: Path, *, alone: bool) -> Iterator[None]:
    """The machine, shared with the other xdist workers' serving tests (`alone=False`:
    any number at once) or alone among them (`alone=True`: waits for every shared holder
    to finish, and holds off new ones). A flock(2) on one file in `lock_dir`, which
    every worker of one pytest run must name alike (tests/e2e/conftest.py: the parent of
    the workers' basetemp). Why e2e needs it: tests/e2e/conftest.py."""
    with open(lock_dir / "kiln-e2e-machine.lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def kiln_containers_on(engine, port: int) -> list:
    """Containers kiln started (any state) whose run URL names host port `port`: what one
    test's `kiln run --port PORT` made, whatever else runs beside it."""
    from kiln.domain.serving.launch_command import LABEL_RECIPE, LABEL_URL

    return [
        c
        for c in engine.client.containers.list(all=True, filters={"label": LABEL_RECIPE})
        if c.labels.get(LABEL_URL, "").endswith(f":{port}")
    ]


def remove_images(engine, repository: str) -> None:
    for img in engine.client.images.list(name=repository):
        for tag in img.tags:
            engine.remove_image(tag)


class SavedImage:
    """`docker save` of one image, read through its manifest.json: the layer files are
    named differently by daemon versions (`<id>/layer.tar`, `blobs/sha256/<digest>`), so
    matching file names can silently find none."""

    def __init__(self, outer: tarfile.TarFile, ref: str):
        self._outer = outer
        manifest = json.load(outer.extractfile("manifest.json"))
        self.config: bytes = outer.extractfile(manifest[0]["Config"]).read()
        self.layers: list[str] = list(manifest[0]["Layers"])
        assert self.layers, f"docker save {ref}: manifest.json lists no layer"

    def members(self) -> Iterator[tuple[str, tarfile.TarInfo, tarfile.TarFile]]:
        """(layer, member, that layer's tar) for every member of every layer; read a
        file with `tar.extractfile(member)` before the next one (the tar is streamed)."""
        scanned = 0
        for layer in self.layers:
            with tarfile.open(fileobj=self._outer.extractfile(layer), mode="r|*") as tar:
                for member in tar:
                    yield layer, member, tar
            scanned += 1
        assert scanned == len(self.layers) > 0, f"scanned {scanned} of {len(self.layers)} layers"


@contextmanager
def saved_image(engine, ref: str) -> Iterator[SavedImage]:
    """The image as `docker save` writes it, spooled to a temporary file (multi-GB images)."""
    with tempfile.TemporaryFile() as fh:
        for chunk in engine.client.images.get(ref).save(named=False):
            fh.write(chunk)
        fh.seek(0)
        with tarfile.open(fileobj=fh, mode="r:") as outer:
            yield SavedImage(outer, ref)


def passing_smoke_record(image_id: str, recipe: str, *, platform: str = "linux/amd64", **extra: object) -> dict:
    """A whole passing smoke record (kiln.infra.records.SmokeRecord) for `image_id`, as a
    test writes one instead of running `kiln smoke`: publish reads records through that
    TypedDict and refuses one with a field missing (RecordInvalid). `extra`: keys of the
    test's own (a note), which kiln ignores."""
    return {
        "recipe": recipe,
        "image_id": image_id,
        "tag": f"kiln/{recipe}:test",
        "input_digest": "sha256:" + "0" * 64,
        "platform": platform,
        "emulation_factor": None,
        "level": "served",
        "passed": True,
        "started_at": "2026-01-01T00:00:00+00:00",
        "checks": [{"name": "written-by-a-test", "ok": True, "detail": "", "seconds": 0.0}],
        "timings": {"startup_s": None, "total_s": 0.0},
        **extra,
    }
