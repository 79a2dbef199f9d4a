"""Module names in one style: lowercase words joined by `_` (`health_check.py`, not
`healthcheck.py`), as PEP 8 allows where it helps reading; a package's name is one word, as
PEP 8 prefers."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TREES = [REPO / "src" / "kiln", REPO / "engine" / "kiln_engine"]
# kiln-engine's public package: recipes' patches import kiln_engine.draft_trunc by name
PACKAGES_WITH_UNDERSCORES = {"draft_trunc"}

# The words module names are made of. A name part that is not here is either two words
# run together (split it with `_`) or a new word (add it here).
WORDS = frozenset(
    [
        "moe",
        "tuning",
        "accelerators",
        "adaptive",
        "applier",
        "archive",
        "arg",
        "attest",
        "auth",
        "av",
        "base",
        "binfmt",
        "bounds",
        "buffers",
        "build",
        "building",
        "bump",
        "bundle",
        "ca",
        "cache",
        "check",
        "checker",
        "checks",
        "cli",
        "clock",
        "command",
        "completion",
        "config",
        "container",
        "containers",
        "context",
        "copy",
        "cosign",
        "cost",
        "credentials",
        "cyclonedx",
        "daemon",
        "date",
        "declared",
        "definitions",
        "dependencies",
        "device",
        "diff",
        "disk",
        "doctor",
        "documents",
        "draft",
        "drafting",
        "edits",
        "engine",
        "entries",
        "env",
        "facts",
        "failure",
        "faults",
        "feature",
        "features",
        "fetch",
        "files",
        "format",
        "functions",
        "gate",
        "git",
        "hf",
        "host",
        "image",
        "in",
        "index",
        "inventory",
        "jit",
        "json",
        "k8s",
        "kernel",
        "key",
        "keys",
        "launch",
        "layer",
        "licences",
        "listing",
        "lock",
        "log",
        "manifests",
        "metrics",
        "model",
        "models",
        "multi",
        "naming",
        "node",
        "normalise",
        "options",
        "outdated",
        "overlay",
        "overrides",
        "package",
        "parser",
        "password",
        "patch",
        "patches",
        "paths",
        "plan",
        "platforms",
        "plugin",
        "policy",
        "probe",
        "progress",
        "protocol",
        "provenance",
        "prune",
        "publish",
        "publishing",
        "purl",
        "push",
        "quilt",
        "reader",
        "readme",
        "rebase",
        "rebuild",
        "recipe",
        "recipes",
        "records",
        "ref",
        "registry",
        "render",
        "report",
        "reporting",
        "resolved",
        "resolver",
        "rules",
        "runs",
        "save",
        "sbom",
        "schema",
        "schemas",
        "sections",
        "series",
        "serve",
        "serving",
        "shape",
        "show",
        "signatures",
        "signing",
        "smoke",
        "source",
        "sourced",
        "space",
        "spdx",
        "stamp",
        "startup",
        "state",
        "stats",
        "streams",
        "subject",
        "summary",
        "surface",
        "table",
        "tenant",
        "text",
        "throwaway",
        "topology",
        "tree",
        "types",
        "usage",
        "validated",
        "verification",
        "verify",
        "vllm",
        "wheel",
        "wheelhouse",
        "yaml",
    ]
)


def _packages() -> set[str]:
    return {p.parent.name for tree in TREES for p in tree.rglob("__init__.py")}


def _modules() -> list[Path]:
    return sorted(p for tree in TREES for p in tree.rglob("*.py") if not p.name.startswith("__"))


def _wrong(paths: list[Path], packages: set[str]) -> list[str]:
    """`path: parts` for each module whose name has a part that is not a word."""
    wrong = []
    for path in paths:
        stem = path.stem.lstrip("_")
        if stem in packages:  # named after a package (an error family: errors/supplychain.py)
            continue
        unknown = [part for part in stem.split("_") if part not in WORDS]
        if unknown or stem != stem.lower():
            wrong.append(f"{path.relative_to(REPO)}: {', '.join(unknown) or stem}")
    return wrong


def test_module_names_are_words_joined_by_underscores():
    wrong = _wrong(_modules(), _packages())
    assert not wrong, (
        "module names with parts that are not words: two words run together are "
        "joined by `_`; a new word goes into WORDS here:\n" + "\n".join(wrong)
    )


def test_package_names_are_one_word():
    wrong = sorted(
        name
        for name in _packages()
        if "_" in name.lstrip("_") and name not in PACKAGES_WITH_UNDERSCORES | {"kiln_engine"}
    )
    assert not wrong, f"package names with `_` (PEP 8: one short word): {wrong}"


def test_the_check_can_fail():
    """Run-together words are caught; the same words joined by `_`, and a module named
    after a package, pass."""
    kiln = REPO / "src" / "kiln"
    paths = [
        kiln / "domain/imagecheck/enginecheck.py",
        kiln / "domain/imagecheck/engine_check.py",
        kiln / "basics/errors/supplychain.py",
        kiln / "inimage/_Probe.py",
    ]
    assert _wrong(paths, {"supplychain"}) == [
        "src/kiln/domain/imagecheck/enginecheck.py: enginecheck",
        "src/kiln/inimage/_Probe.py: Probe",
    ]
