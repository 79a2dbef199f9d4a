"""No Dockerfile fetches anything itself (one way in for every wheel): every
wheel an image installs comes from a lock, is fetched and hash-checked on the host, and
travels in the build context; a RUN that downloads (urllib, curl, wget, git, pip or uv
from an index, a Hugging Face download) or an ADD of a URL would escape the lock, the
wheelhouse and the SBOM's provenance, and could not build air-gapped.

Read here: every Dockerfile under recipes/ and docker-images/, and each recipe's
Dockerfile as its build context ships it (with the tail kiln appends). Debian packages
come in one way too: `kiln-apt-install` with the lock's pins; apt itself in a RUN is a
finding. The detector is tested on bad samples first, so that a scan which finds nothing
is a scan that could have found something."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
from kilntest import REPO

from kiln.domain.recipes.resolved import ResolvedRecipe


@dataclass(frozen=True)
class Finding:
    line: int  # where the instruction starts
    what: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.what}"


# Patterns that fetch whatever the command around them is (the command's text, quotes kept)
_FETCHES = [
    (re.compile(r"\b(urllib|urlopen|http\.client|httpx|requests\.(get|post|Session))\b"), "opens a URL from Python"),
    (re.compile(r"(^|[\s;&|(`])(curl|wget|aria2c)\s"), "downloads with curl/wget"),
    (
        re.compile(r"\bgit\s+(clone|fetch|pull|submodule|ls-remote)\b|\b(svn|hg)\s+(checkout|co|clone|pull)\b"),
        "fetches a repository",
    ),
    (re.compile(r"\bpip3?\s+(download|wheel)\b"), "pip download"),
    (re.compile(r"\b(https?|ftp|s3|gs|git)://"), "names a remote URL"),
    (
        re.compile(r"\b(apt-get|apt|aptitude)\s+(-\S+\s+)*(install|update|upgrade|dist-upgrade|download|source)\b"),
        "apt outside kiln-apt-install (the lock's pins)",
    ),
    (
        re.compile(
            r"\b(conda|mamba|micromamba|npm|yarn|pnpm|gem|cargo)\s+(install|add|create)\b|\bgo\s+(get|install)\b"
        ),
        "another package manager's install",
    ),
    (
        re.compile(r"\b(snapshot_download|hf_hub_download)\b|\b(huggingface-cli|hf)\s+download\b"),
        "a Hugging Face download",
    ),
]
_PIP_INSTALL = re.compile(r"\bpip3?\s+install\b")
_UV_INSTALL = re.compile(r"(^|[\s/])uv\s+(pip\s+(install|sync)|sync|add|tool\s+install)\b|(^|[\s/])uvx\s")
_INDEX_FLAGS = ("-i", "--index-url", "--extra-index-url", "--index", "--default-index")
_SEGMENTS = re.compile(r"&&|\|\||[;|\n]")


def instructions(text: str) -> list[tuple[int, str, str]]:
    """(line, KEYWORD, arguments) per instruction, continuation lines joined and comment
    lines dropped, as Docker's parser reads them."""
    out: list[tuple[int, str, str]] = []
    start, parts = 0, []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue  # Docker drops comment and blank lines, inside a continuation too
        if not parts:
            start = number
        parts.append(line.removesuffix("\\"))
        if not line.endswith("\\"):
            keyword, _, args = " ".join(parts).partition(" ")
            out.append((start, keyword.upper(), args.strip()))
            parts = []
    return out


def _shell(args: str) -> str:
    """A RUN's command: the exec form's words, or the shell form's text."""
    if args.startswith("["):
        try:
            return " ".join(str(w) for w in json.loads(args))
        except ValueError:
            pass
    return args


def _installer_problem(segment: str) -> str | None:
    """pip or uv installing from anything but local wheels."""
    try:
        words = shlex.split(segment)
    except ValueError:
        words = segment.split()
    links = [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("--find-links", "-f")]
    links += [w.split("=", 1)[1] for w in words if w.startswith("--find-links=")]
    if any(w in _INDEX_FLAGS or w.split("=", 1)[0] in _INDEX_FLAGS for w in words):
        return "installs from a package index"
    if "--no-index" not in words:
        return "installs without --no-index (from the index)"
    if _UV_INSTALL.search(segment) and "--offline" not in words:
        return "uv installs without --offline"
    if any(not link.startswith("/") for link in links):
        return "--find-links is not a local folder"
    return None


def fetches(text: str) -> list[Finding]:
    """Every instruction of a Dockerfile that would fetch something over the network."""
    found: list[Finding] = []
    for line, keyword, args in instructions(text):
        if keyword == "ADD" and re.search(r"(^|\s)((https?|ftp|git)://|git@)", args):
            found.append(Finding(line, "ADD of a URL"))
        if keyword != "RUN":
            continue
        command = _shell(args)
        found += [Finding(line, what) for pattern, what in _FETCHES if pattern.search(command)]
        for segment in _SEGMENTS.split(command):
            if _PIP_INSTALL.search(segment) or _UV_INSTALL.search(segment):
                problem = _installer_problem(segment)
                if problem:
                    found.append(Finding(line, problem))
    return found


# The one fetch kept, and why: engine-cuda's size anchor is no kiln image; it installs the
# lock's own wheels, by hash and with --no-index, from its wheels stage served on the build
# network by benchmarks/build_cuda.py (so no second copy of them lands in a layer)
ALLOWED = {"docker-images/engine-cuda/plain.Dockerfile": {"--find-links is not a local folder"}}


def dockerfiles() -> list[Path]:
    found = [*REPO.glob("recipes/*/Dockerfile"), *REPO.glob("docker-images/**/*Dockerfile")]
    return sorted(p for p in found if p.is_file())


# -- the detector, on samples it must catch and samples it must pass --------------------
# what tiny-kindling's Dockerfile did before its wheel came through its lock
OLD_TINY_KINDLING = """\
FROM ${KILN_ENGINE_IMAGE} AS triton
# the wheel is fetched by URL (a comment saying curl is no finding)
RUN if [ -s /tmp/kiln-ca.crt ]; then export SSL_CERT_FILE=/tmp/kiln-ca.crt; fi \\
 && python -c "import hashlib, io, os, urllib.request, zipfile; \\
url = 'https://files.pythonhosted.org/packages/05/73/triton-3.9.0-cp311-cp311-manylinux_2_28_x86_64.whl'; \\
data = urllib.request.urlopen(url, timeout=900).read()"
"""

BAD = [
    ("RUN curl -fsSL https://example.org/x.whl -o /tmp/x.whl", "downloads with curl/wget"),
    ("RUN wget -q -O- http://example.org/x.tar | tar x", "downloads with curl/wget"),
    ("RUN pip install torch==2.13.0", "installs without --no-index (from the index)"),
    ("RUN python -m pip install --no-index -i https://mirror/simple x", "installs from a package index"),
    ("RUN pip download --no-deps triton==3.9.0 -d /w", "pip download"),
    ("RUN uv pip install --python /v/bin/python -r /r.txt", "installs without --no-index (from the index)"),
    ("RUN /tmp/uv pip install --no-index --find-links /w -r /r.txt", "uv installs without --offline"),
    ("RUN uv pip install --offline --no-index --find-links ${WHEELS} x", "--find-links is not a local folder"),
    ("RUN git clone https://github.com/triton-lang/triton /src", "fetches a repository"),
    ("ADD https://example.org/model.bin /models/", "ADD of a URL"),
    ("RUN apt-get -y install gcc", "apt outside kiln-apt-install (the lock's pins)"),
    (
        'RUN ["python", "-c", "from huggingface_hub import snapshot_download; snapshot_download(\'x\')"]',
        "a Hugging Face download",
    ),
    ("RUN npm install left-pad", "another package manager's install"),
]


@pytest.mark.parametrize("instruction,what", BAD, ids=[b[1] + f" {i}" for i, b in enumerate(BAD)])
def test_the_detector_finds_each_kind_of_fetch(instruction, what):
    text = f"FROM scratch\n# {instruction}\n{instruction}\n"
    assert Finding(3, what) in fetches(text), fetches(text)


def test_the_detector_finds_the_old_tiny_kindling_download_at_its_line():
    found = fetches(OLD_TINY_KINDLING)
    assert {f.line for f in found} == {3}, found
    assert {"opens a URL from Python", "names a remote URL"} <= {f.what for f in found}


def test_the_detector_passes_the_lock_s_way_in():
    """What the engine and the recipes do: the lock's tools and offline installs from the
    context's wheels; comments may name anything."""
    good = """\
FROM base AS builder
# never `curl https://...` or `pip install x` here
RUN kiln-with-ca kiln-apt-install /tmp/kiln-debian.txt python3 tini \\
 && useradd --uid 1000 kiln
RUN python /opt/kiln/lib/kiln-lock-tool verify /tmp/wheels /tmp/kiln-lock/wheels.txt \\
 && /tmp/uv pip install --python /opt/kiln/venv/bin/python --prefix /opt/x --offline --no-index \\
      --find-links /tmp/wheels --require-hashes --no-deps --no-build -r /tmp/kiln-lock/python.txt
RUN ["/opt/kiln/venv/bin/python", "/opt/kiln/lib/kiln_patching.py", "apply-overlays"]
"""
    assert fetches(good) == []


# -- the repository ----------------------------------------------------------------------
def test_every_dockerfile_is_read():
    names = {p.relative_to(REPO).as_posix() for p in dockerfiles()}
    assert {
        "recipes/tiny-kindling/Dockerfile",
        "docker-images/engine-cpu/Dockerfile",
        "docker-images/engine-cuda/Dockerfile",
        *ALLOWED,
    } <= names, names
    for path in dockerfiles():  # a file the parser reads as nothing would pass unread
        assert any(k == "FROM" for _, k, _ in instructions(path.read_text())), path


@pytest.mark.parametrize("path", dockerfiles(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_dockerfile_fetches_anything(path):
    rel = path.relative_to(REPO).as_posix()
    found = fetches(path.read_text())
    allowed = ALLOWED.get(rel, set())
    assert [str(f) for f in found if f.what not in allowed] == [], f"{rel} fetches over the network"
    # an exemption the file no longer needs is stale: drop it from ALLOWED
    assert allowed <= {f.what for f in found}, f"{rel}: ALLOWED names {allowed - {f.what for f in found}}"


@pytest.mark.parametrize("name", sorted(p.parent.name for p in REPO.glob("recipes/*/recipe.yaml")))
def test_the_dockerfile_a_recipe_build_ships_fetches_nothing(name):
    """The recipe's Dockerfile with the tail kiln appends, as its build context has it."""
    from kiln.domain.images.definitions import RecipeImage
    from kiln.domain.images.engine_image import EngineImage
    from kiln.domain.recipes.recipe import load_recipe

    loaded = load_recipe(REPO / "recipes" / name)
    context = RecipeImage(ResolvedRecipe(loaded), EngineImage(loaded.recipe.engine, None)).context
    shipped = next(e for e in context.entries if e.arcname == "Dockerfile").content().decode()
    assert "kiln tail" in shipped
    assert [str(f) for f in fetches(shipped)] == []
