#!/usr/bin/env python3
"""Rename kiln's modules by the table below and rewrite every reference to them.

    python scripts/rename_modules.py           move the files (`git mv`), rewrite references
    python scripts/rename_modules.py --check   change nothing; exit 1 when something would change
    python scripts/rename_modules.py --table   print the table as Markdown

Re-runnable: a moved module is not moved again and a rewritten reference no longer
matches, so a second run changes nothing; run it again after merging a branch that still
uses an old name. Module names join their words with `_` (PEP 8: "short, all-lowercase
names; underscores can be used if it improves readability"); package names stay one
word (PEP 8 discourages underscores there). tests/test_module_names.py keeps it so.

What it rewrites, in every tracked text file outside IMAGE_INPUTS:
- the files themselves (`git mv`; a module of a renamed package moves with it);
- dotted names (`kiln.domain.images.specs`, in imports, mock paths, `python -m`, TOML)
  and their tails from the parent package on (`images.specs`);
- paths (`src/kiln/domain/images/specs.py`, `images/specs.py`; a package's `views/`), and
  a bare `specs.py` when no other file has that name;
- `from PACKAGE import module` (relative ones too), and then the module's name wherever
  the file uses it (`lockrecords.EngineLock`), comments and strings included;
- for a run-together name (`words=True`: nothing else is spelled so), the bare word in
  prose, comments and strings (`inimage.source("hfcache")`, "the `sourcedate` of ..."),
  unless a file or folder has that name too (then it is data: tests/fixtures/bumpreport/);
- in a package's `__init__.py`, its renamed modules as its docstring lists them
  (`` `throwaway` ``, ``- diff:``).
A use it cannot rename safely (the file binds the name otherwise) keeps the old name as
an alias (`import new as old`) and is reported: fix those by hand. Afterwards ruff sorts
the imports of the Python files it changed.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import subprocess
import sys
import tokenize
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Rename:
    old: str  # dotted, e.g. kiln.domain.images.specs (a module or a package)
    new: str
    why: str
    words: bool = False  # the old last name is a run-together word: rewrite it bare in prose too


# fmt: off
RENAMES = [
    # -- names that did not say what the module is --------------------------------------
    Rename("kiln.domain.locks.relock", "kiln.domain.locks.lock_resolver",
           "makes a new lock (uv, index hashes, Debian closure) and re-asks the index about one; it does not re-lock"),
    Rename("kiln.domain.images.specs", "kiln.domain.images.definitions",
           "the definitions of the images kiln builds (EngineImage, RecipeImage); "
           "'spec' also means speculative decoding"),
    Rename("kiln.domain.recipes.sections", "kiln.domain.recipes.recipe_sections",
           "the sections of recipe.yaml, as pydantic models"),
    Rename("kiln.domain.views", "kiln.domain.catalogue",
           "the package holds the recipe catalogue (kiln list/show) and the README's recipe table"),
    Rename("kiln.domain.views.catalogue", "kiln.domain.catalogue.entries",
           "each recipe's catalogue entry: the `kiln list` rows and the `kiln show` document"),
    Rename("kiln.domain.patching.diff", "kiln.domain.patching.text_diff",
           "unified diffs and 3-way merges of source text (beside reproducible/image_diff)"),
    Rename("kiln.domain.supplychain.subject", "kiln.domain.supplychain.image_subject",
           "the image a supply-chain document is about (ImageSubject)"),
    Rename("kiln.infra.docker.throwaway", "kiln.infra.docker.throwaway_runs",
           "scripts and commands run in throwaway containers (run_script, run_command)"),
    Rename("kiln.commands.publishing.signstep", "kiln.commands.publishing.publish_signing", words=True,
           why="the signing steps of `kiln publish --sign` and `kiln promote`"),
    Rename("kiln_engine.draft_trunc._kernels.device", "kiln_engine.draft_trunc._kernels.device_functions",
           "Triton device functions (@triton.jit helpers the kernels call), not a device"),
    # -- clusters that read alike ----------------------------------------------------------
    Rename("kiln.domain.imagecheck.engineverify", "kiln.domain.imagecheck.declared_engine", words=True,
           why="the engine a recipe declares, checked in its built image (one of three *verify.py)"),
    Rename("kiln.domain.signing.signverify", "kiln.domain.signing.signatures", words=True,
           why="signing a pushed image and verifying its signatures (one of three *verify.py)"),
    Rename("kiln.inimage.engineproof", "kiln.inimage.engine_facts", words=True,
           why="gathers an engine image's facts inside it (EngineFacts); engineproof/inimageproof read alike"),
    Rename("kiln.domain.imagecheck.inimageproof", "kiln.domain.imagecheck.in_image_smoke", words=True,
           why="`kiln smoke --in-image`: the facts of engine_facts judged against the recipe"),
    Rename("kiln.domain.serving.launch", "kiln.domain.serving.launch_command",
           "the vLLM command line and the `docker run` of it (launch/launchargs/launchprobe read alike)"),
    Rename("kiln.domain.imagecheck.launchargs", "kiln.domain.imagecheck.launch_arg_check", words=True,
           why="launch args checked by the built engine's own parser, host side"),
    Rename("kiln.inimage.launchprobe", "kiln.inimage.launch_arg_probe", words=True,
           why="the in-image half of launch_arg_check"),
    Rename("kiln.inimage.probeprotocol", "kiln.inimage.launch_arg_protocol", words=True,
           why="the launch-argument probe's request and answer"),
    Rename("kiln.basics.yamlsrc", "kiln.basics.sourced_yaml", words=True,
           why="YAML that remembers each value's line (SourcedYaml); yamlsrc/yamlfile/yamledit read alike"),
    Rename("kiln.domain.recipes.yamlfile", "kiln.domain.recipes.validated_yaml", words=True,
           why="YAML validated against a strict model (Validated, Strict)"),
    Rename("kiln.domain.patching.yamledit", "kiln.domain.patching.yaml_edits", words=True,
           why="round-trip edits of recipe and override YAML"),
    Rename("kiln.domain.serving.container", "kiln.domain.serving.serving_container",
           "ServingContainer; serving/container.py and docker/containers.py read alike"),
    Rename("kiln.domain.recipes.engine_features", "kiln.domain.recipes.feature_registry",
           "the engine's feature registry loaded for the harness, beside the engine's own features.py"),
    Rename("kiln.domain.publishing", "kiln.domain.publishing.rules",
           "the only loose module at domain's root: a package for publishing, its rules one module"),
    Rename("kiln.commands.recipes.lock", "kiln.commands.recipes.engine",
           "the one module of `kiln engine` (lock; bump and outdated join it by hand)"),
    # -- run-together words, split with `_` -------------------------------------------------
    Rename("kiln.basics.imageref", "kiln.basics.image_ref", "underscores", words=True),
    Rename("kiln.basics.jsontypes", "kiln.basics.json_types", "underscores", words=True),
    Rename("kiln.commands.jsonschemas", "kiln.commands.json_schemas", "underscores", words=True),
    Rename("kiln.commands.images.baseimage", "kiln.commands.images.base_image", "underscores", words=True),
    Rename("kiln.commands.recipes.bumpreport", "kiln.commands.recipes.bump_report", "underscores", words=True),
    Rename("kiln.commands.serving.smokechecks", "kiln.commands.serving.smoke_checks", "underscores", words=True),
    Rename("kiln.domain.imagecheck.enginestamp", "kiln.domain.imagecheck.engine_stamp", "underscores", words=True),
    Rename("kiln.domain.images.buildcontext", "kiln.domain.images.build_context", "underscores", words=True),
    Rename("kiln.domain.images.buildspace", "kiln.domain.images.disk_space", words=True,
           why="underscores; the disk space a build needs (DiskSpaceShort)"),
    Rename("kiln.domain.images.cabundle", "kiln.domain.images.ca_bundle", "underscores", words=True),
    Rename("kiln.domain.images.imagefiles", "kiln.domain.images.image_files", "underscores", words=True),
    Rename("kiln.domain.locks.baselock", "kiln.domain.locks.base_lock", "underscores", words=True),
    Rename("kiln.domain.locks.enginelock", "kiln.domain.locks.engine_lock", "underscores", words=True),
    Rename("kiln.domain.locks.lockfailure", "kiln.domain.locks.lock_failure", "underscores", words=True),
    Rename("kiln.domain.locks.lockpolicy", "kiln.domain.locks.lock_policy", "underscores", words=True),
    Rename("kiln.domain.locks.lockrecords", "kiln.domain.locks.lock_records", "underscores", words=True),
    Rename("kiln.domain.locks.recipelock", "kiln.domain.locks.recipe_lock", "underscores", words=True),
    Rename("kiln.domain.patching.bumpreport", "kiln.domain.patching.bump_report", "underscores", words=True),
    Rename("kiln.domain.patching.engineargs", "kiln.domain.patching.arg_surface", words=True,
           why="underscores; an engine version's argument surface (Surface), not launch_arg_check's EngineArgs"),
    Rename("kiln.domain.planning.modelconfig", "kiln.domain.planning.model_config", "underscores", words=True),
    Rename("kiln.domain.planning.modelshape", "kiln.domain.planning.model_shape", "underscores", words=True),
    Rename("kiln.domain.recipes.envpolicy", "kiln.domain.recipes.env_policy", "underscores", words=True),
    Rename("kiln.domain.recipes.specbounds", "kiln.domain.recipes.draft_bounds", words=True,
           why="underscores; bounds on the draft count ('spec' read as specs.py)"),
    Rename("kiln.domain.reproducible.imagediff", "kiln.domain.reproducible.image_diff", "underscores", words=True),
    Rename("kiln.domain.reproducible.savearchive", "kiln.domain.reproducible.save_archive", "underscores", words=True),
    Rename("kiln.domain.reproducible.sourcedate", "kiln.domain.reproducible.source_date", "underscores", words=True),
    Rename("kiln.domain.serving.hffetch", "kiln.domain.serving.hf_fetch", "underscores", words=True),
    Rename("kiln.domain.serving.multinode", "kiln.domain.serving.multi_node", "underscores", words=True),
    Rename("kiln.infra.keypassword", "kiln.infra.key_password", "underscores", words=True),
    Rename("kiln.infra.pyindex", "kiln.infra.package_index", "underscores; the Python package index", words=True),
    Rename("kiln.infra.registryauth", "kiln.infra.registry_auth", "underscores", words=True),
    Rename("kiln.infra.wheelcache", "kiln.infra.wheel_cache", "underscores", words=True),
    Rename("kiln.inimage.hfcache", "kiln.inimage.hf_cache", "underscores", words=True),
    Rename("kiln.inimage.patchformat", "kiln.inimage.patch_format", "underscores", words=True),
    Rename("kiln.inimage.sbomreader", "kiln.inimage.sbom_reader", "underscores", words=True),
    Rename("kiln_engine.draft_trunc._avstats", "kiln_engine.draft_trunc._av_stats", "underscores", words=True),
]
# fmt: on

# the docstring of each package the table creates (its __init__.py)
NEW_PACKAGES = {
    "kiln.domain.publishing": (
        '"""Publishing: the rules of publishing (`rules`: registry and repository, channels,\n'
        "tags, the smoke evidence, a multi-platform set's input digest). Uses recipes and images.\n"
        '"""\n'
    ),
}

# where each top-level package's files live
ROOTS = {"kiln": "src/kiln", "kiln_engine": "engine/kiln_engine", "kiln_testkit": "testkit/kiln_testkit"}
# files whose bytes are inputs of images or locks: never rewritten (none names a kiln module)
IMAGE_INPUTS = ("recipes/", "patches/", "docker-images/", "requirements/")
SELF = ("scripts/rename_modules.py",)
# what a word after a module's name is when it is a file name, not an attribute
_EXTENSIONS = r"(?:py|json|yaml|yml|md|txt|lock|sh|toml|tar|whl)\b"


# -- the table, as paths -----------------------------------------------------------------
def _dir_of(dotted: str) -> Path:
    top, *rest = dotted.split(".")
    return Path(ROOTS[top], *rest)


def _is_package(r: Rename) -> bool:
    """Whether `r` renames a package (a folder), before or after its move."""
    old, new = _dir_of(r.old), _dir_of(r.new)
    if (REPO / old.with_suffix(".py")).is_file() or r.new.startswith(r.old + "."):
        return False  # a module (publishing.py became the package publishing/ holding it)
    return (REPO / old).is_dir() or ((REPO / new).is_dir() and not (REPO / new.with_suffix(".py")).is_file())


def _into_itself(r: Rename, dotted: str) -> bool:
    """A module moved into a package of its own name: its new names are not old ones."""
    return r.new.startswith(r.old + ".") and (dotted == r.new or dotted.startswith(r.new + "."))


def mapped(dotted: str) -> str | None:
    """The new name of `dotted` (a module, a package, or anything inside one), or None."""
    best = None
    for r in RENAMES:
        # the inner condition keeps its own comment
        if (  # noqa: SIM102
            dotted == r.old or dotted.startswith(r.old + ".")
        ) and not _into_itself(r, dotted):
            if best is None or len(r.old) > len(best.old):
                best = r
    if best is None:
        return None
    new = best.new + dotted[len(best.old) :]
    return new if new != dotted else None


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True, text=True).stdout


def _tracked() -> list[str]:
    return [p for p in _git("ls-files", "-z").split("\0") if p]


def moves(tracked: Iterable[str]) -> list[tuple[str, str]]:
    """(old file, new file) for every tracked file the table moves."""
    out: dict[str, str] = {}
    packages = [r for r in RENAMES if _is_package(r)]
    for path in tracked:
        where = _module_of(path)
        if where is None:
            continue
        dotted, init = where
        target = None
        module = next((r for r in RENAMES if r.old == dotted and not _is_package(r)), None)
        if module is not None and not init:
            target = _dir_of(module.new).with_suffix(".py")
        else:
            inside = [r for r in packages if dotted == r.old or dotted.startswith(r.old + ".")]
            if inside:
                r = max(inside, key=lambda r: len(r.old))
                new = _dir_of(r.new + dotted[len(r.old) :])
                target = new / "__init__.py" if init else new.with_suffix(".py")
        if target is not None and target.as_posix() != path:
            out[path] = target.as_posix()
    return sorted(out.items())


# -- text rules ----------------------------------------------------------------------------
@dataclass
class Rules:
    dotted: re.Pattern[str]
    dotted_map: dict[str, str]
    paths: re.Pattern[str]
    path_map: dict[str, str]
    words: re.Pattern[str] | None
    word_map: dict[str, str]

    def text(self, text: str, *, words: bool = True) -> str:
        text = self.paths.sub(lambda m: self.path_map[m.group(0)], text)
        text = self.dotted.sub(lambda m: self.dotted_map[m.group(0)], text)
        if words and self.words is not None:
            text = self.words.sub(lambda m: self.word_map[m.group(0)], text)
        return text


def _alternation(pairs: dict[str, str], left: str, right: str, guard: dict[str, str]) -> re.Pattern[str]:
    parts = []
    for old in sorted(pairs, key=len, reverse=True):
        parts.append(re.escape(old) + guard.get(old, ""))
    return re.compile(f"{left}(?:{'|'.join(parts)}){right}")


def build_rules(tracked: list[str]) -> Rules:
    basenames: dict[str, int] = {}
    components: set[str] = set()  # every folder's name, and every file's without its suffix
    for path in tracked:
        name = path.rsplit("/", 1)[-1]
        basenames[name] = basenames.get(name, 0) + 1
        components.update(path.split("/")[:-1])
        components.add(name.split(".", 1)[0])
    dotted: dict[str, str] = {}
    dotted_guard: dict[str, str] = {}
    paths: dict[str, str] = {}
    path_guard: dict[str, str] = {}
    words: dict[str, str] = {}
    for r in RENAMES:
        old_parts, new_parts = r.old.split("."), r.new.split(".")
        # dotted: the whole name and its tails from the parent package on
        for k in range(2, len(old_parts) + 1):
            old_tail = ".".join(old_parts[-k:])
            keep = len(old_parts) - k  # the unchanged head, if it is unchanged
            if old_parts[:keep] != new_parts[:keep]:
                continue
            new_tail = ".".join(new_parts[keep:])
            dotted[old_tail] = new_tail
            if new_tail.startswith(old_tail + "."):  # a module moved into a package of its name
                inner = re.escape(new_tail[len(old_tail) + 1 :])
                dotted_guard[old_tail] = rf"(?!\.{inner}\b)(?!\s+import\s+\(?\s*{inner}\b)"
        # paths: src/kiln/x/y.py, kiln/x/y.py, x/y.py; a package's folder with its slash
        package = _is_package(r)
        old_file = _dir_of(r.old) if package else _dir_of(r.old).with_suffix(".py")
        new_file = _dir_of(r.new) if package else _dir_of(r.new).with_suffix(".py")
        o, n = old_file.parts, new_file.parts
        for k in range(2 if package else 1, len(o) + 1):
            keep = len(o) - k
            if o[:keep] != n[:keep]:
                continue
            old_tail, new_tail = "/".join(o[-k:]), "/".join(n[keep:])
            if package:  # a folder: `views/`, and what is in it
                old_tail, new_tail = old_tail + "/", new_tail + "/"
            elif k == 1 and basenames.get(o[-1], 0) - (old_file.as_posix() in tracked) > 0:
                continue  # another file has this name: only a path names this one
            else:
                path_guard[old_tail] = r"(?![\w-])"
            paths[old_tail] = new_tail
        if r.words and old_parts[-1] not in components:  # a word that names a file too is data
            words[old_parts[-1]] = new_parts[-1]
    word_re = None
    if words:
        word_re = _alternation(words, r"(?<![\w/.-])", rf"(?![\w/-])(?!\.{_EXTENSIONS})", {})
    return Rules(
        dotted=_alternation(dotted, r"(?<![\w.])", r"(?!\w)", dotted_guard),
        dotted_map=dotted,
        paths=_alternation(paths, r"(?<![\w.-])", "", path_guard),
        path_map=paths,
        words=word_re,
        word_map=words,
    )


# -- Python: imports and the names they bind -----------------------------------------------
def _module_of(path: str) -> tuple[str, bool] | None:
    """The dotted name of a file under ROOTS, and whether it is a package's __init__."""
    p = Path(path)
    for top, root in ROOTS.items():
        if p.is_relative_to(root):
            parts = [top, *p.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                return ".".join(parts[:-1]), True
            return ".".join(parts), False
    return None


class _Source:
    """Offsets into a file's text, from ast's (line, byte column) and tokenize's (line, column)."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def of_ast(self, line: int, col: int) -> int:
        text = self.lines[line - 1] if line - 1 < len(self.lines) else ""
        return self.starts[line - 1] + len(text.encode()[:col].decode())

    def of_token(self, pos: tuple[int, int]) -> int:
        return self.starts[pos[0] - 1] + pos[1]


def _binders(tree: ast.AST, name: str) -> tuple[bool, bool]:
    """(whether `name` is bound here other than by an import, or passed as a keyword;
    whether it is used as a name at all)."""
    other, used = False, False
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == name:
            used = True
            other = other or not isinstance(node.ctx, ast.Load)
        elif isinstance(node, ast.keyword) and node.arg == name:
            other = True  # `f(name=...)`: not a use of the module, but renaming it would break the call
        elif (
            (isinstance(node, ast.arg) and node.arg == name)
            or (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name)
            or (isinstance(node, ast.Global | ast.Nonlocal) and name in node.names)
        ):
            other = used = True
        elif isinstance(node, ast.alias) and (node.asname or node.name.split(".")[0]) == name:
            used = True
    return other, used


def _tokens(text: str) -> list[tokenize.TokenInfo]:
    try:
        return list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return []


def _import_base(where: tuple[str, bool] | None, node: ast.ImportFrom) -> str | None:
    """The absolute name of an ImportFrom's module (relative ones resolved), or None."""
    if not node.level:
        return node.module or ""
    if where is None:
        return None
    parts = where[0].split(".") if where[1] else where[0].split(".")[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join([*parts, *([node.module] if node.module else [])])


def _imports(path: str, text: str, tree: ast.Module, warnings: list[str]) -> str:
    """`from PACKAGE import module` statements renamed, then the names they bind."""
    src = _Source(text)
    where = _module_of(path)
    edits: list[tuple[int, int, str]] = []
    renamed: dict[str, str] = {}  # a module bound by its bare name, old -> new
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        module = _import_base(where, node)
        if module is None:
            continue
        start = src.of_ast(node.lineno, node.col_offset)
        end = src.of_ast(node.end_lineno or node.lineno, node.end_col_offset or 0)
        stmt = text[start:end]
        head = re.match(r"from\s+(\.*)([\w.]*)\s+import\s+", stmt)
        if head is None:
            continue
        new_module = mapped(module) or module
        new_head = head.group(0)
        if node.level and new_module != module:  # a relative import: keep it relative
            base = module[: len(module) - len(node.module or "")].rstrip(".")
            if not new_module.startswith(base + "."):
                warnings.append(f"{path}:{node.lineno}: relative import of {module} leaves its package; fix by hand")
                continue
            new_head = f"from {head.group(1)}{new_module[len(base) + 1 :]} import "
        body = stmt[head.end() :]
        moved_out: list[str] = []
        for alias in node.names:
            new_full = mapped(f"{module}.{alias.name}")
            if new_full is None:
                continue
            new_parent, new_name = new_full.rsplit(".", 1)
            if alias.asname is not None:
                bound_as = f"{new_name} as {alias.asname}"
            elif new_name == alias.name:
                bound_as = new_name
            elif _binders(tree, alias.name)[0] or _binders(tree, new_name)[1]:
                warnings.append(
                    f"{path}:{node.lineno}: `{alias.name}` is bound otherwise here (or `{new_name}` is "
                    f"used): imported as `{new_name} as {alias.name}`; rename by hand"
                )
                bound_as = f"{new_name} as {alias.name}"
            else:
                renamed[alias.name] = new_name
                bound_as = new_name
            name = re.escape(alias.name)
            pattern = (
                re.compile(rf"(?<![\w.]){name}\s+as\s+{re.escape(alias.asname)}(?!\w)")
                if alias.asname
                else re.compile(rf"(?<![\w.]){name}(?!\w)(?!\s+as\b)")
            )
            if new_parent == new_module:
                body = pattern.sub(bound_as, body, count=1)
            elif node.level:
                warnings.append(f"{path}:{node.lineno}: {module}.{alias.name} moves to another package; fix by hand")
            else:
                body = pattern.sub("", body, count=1)
                moved_out.append(f"from {new_parent} import {bound_as}")
        if moved_out:  # some names now live in another package: a statement each
            body = re.sub(r",(\s*,)+", ",", body)
            body = re.sub(r"^(\(?)\s*,\s*", r"\1", body)
            body = re.sub(r",?\s*(\)?)$", r"\1", body)
            line_end = text.find("\n", end)
            line_end = len(text) if line_end < 0 else line_end
            comment = text[end:line_end]
            kept = [new_head + body + comment] if body.strip(" ()\n,") else []
            new_stmt = ("\n" + " " * node.col_offset).join(kept + [m + comment for m in moved_out])
            end = line_end
        else:
            new_stmt = new_head + body
        if new_stmt != text[start:end]:
            edits.append((start, end, new_stmt))

    if renamed:  # every use of a renamed binding; `name.attr` in comments and strings too
        spans = [(s, e) for s, e, _ in edits]
        mention = re.compile(rf"(?<![\w.])({'|'.join(map(re.escape, renamed))})(?=\.(?!{_EXTENSIONS})[A-Za-z_])")
        previous = None
        for tok in _tokens(text):
            s, e = src.of_token(tok.start), src.of_token(tok.end)
            if not any(a <= s < b for a, b in spans):
                if tok.type == tokenize.NAME and tok.string in renamed:
                    if previous is None or previous.string != ".":
                        edits.append((s, e, renamed[tok.string]))
                elif tok.type in (tokenize.COMMENT, tokenize.STRING):
                    new = mention.sub(lambda m: renamed[m.group(1)], tok.string)
                    if new != tok.string:
                        edits.append((s, e, new))
            if tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
                previous = tok
    for s, e, new in sorted(edits, reverse=True):
        text = text[:s] + new + text[e:]
    return text


def rewrite_python(path: str, text: str, rules: Rules, warnings: list[str]) -> str:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        warnings.append(f"{path}: not Python that parses; only its dotted names and paths were rewritten")
        return rules.text(text, words=False)
    text = _imports(path, text, tree, warnings)
    # dotted names and paths everywhere; bare words only in comments and strings
    text = rules.text(text, words=False)
    listed = _listed_children(path)
    if rules.words is None and listed is None:
        return text
    src, out, last = _Source(text), [], 0
    for tok in _tokens(text):
        if tok.type in (tokenize.COMMENT, tokenize.STRING):
            s, e = src.of_token(tok.start), src.of_token(tok.end)
            piece = text[s:e]
            if rules.words is not None:
                piece = rules.words.sub(lambda m: rules.word_map[m.group(0)], piece)
            if listed is not None:
                piece = listed[0].sub(lambda m: m.group(1) + listed[1][m.group(2)] + m.group(3), piece)
            out += [text[last:s], piece]
            last = e
    return "".join(out) + text[last:]


def _listed_children(path: str) -> tuple[re.Pattern[str], dict[str, str]] | None:
    """In a package's __init__.py, its renamed modules as its docstring lists them:
    `name`, ``name`` or a `- name:` line."""
    where = _module_of(path)
    if where is None or not where[1]:
        return None
    names = {
        r.old.rsplit(".", 1)[1]: r.new.rsplit(".", 1)[1]
        for r in RENAMES
        if r.old.rsplit(".", 1)[0] == where[0] and r.new.rsplit(".", 1)[0] == where[0]
    }
    if not names:
        return None
    alternation = "|".join(map(re.escape, sorted(names, key=len, reverse=True)))
    return re.compile(rf"(``?|^\s*- )({alternation})(``?|:)", re.MULTILINE), names


# -- the run -------------------------------------------------------------------------------
def _text_files(tracked: list[str], source: dict[str, str]) -> list[str]:
    return [
        p for p in tracked if not p.startswith(IMAGE_INPUTS) and p not in SELF and (REPO / source.get(p, p)).is_file()
    ]


def run(check: bool) -> int:
    warnings: list[str] = []
    tracked = _tracked()
    todo = moves(tracked)
    changed: list[str] = []
    for old, new in todo:
        if (REPO / new).exists():
            warnings.append(f"{old}: {new} exists already; not moved (merge them by hand)")
            continue
        changed.append(f"moved {old} -> {new}")
        if not check:
            (REPO / new).parent.mkdir(parents=True, exist_ok=True)
            _git("mv", old, new)
    for package, doc in NEW_PACKAGES.items():
        init = _dir_of(package) / "__init__.py"
        will_exist = (REPO / init.parent).is_dir() or any(Path(n).parent == init.parent for _, n in todo)
        if will_exist and not (REPO / init).exists():
            changed.append(f"created {init}")
            if not check:
                (REPO / init).write_text(doc)
                _git("add", init.as_posix())
    if not check:
        for old, _ in todo:  # the folders the moves emptied
            folder = (REPO / old).parent
            if folder.is_dir() and not any(p.name != "__pycache__" for p in folder.iterdir()):
                for cache in folder.glob("__pycache__"):
                    for f in cache.iterdir():
                        f.unlink()
                    cache.rmdir()
                folder.rmdir()
    # where each file is once moved, and where its text is read from now
    source = {new: old for old, new in todo} if check else {}
    tracked = [dict(todo).get(p, p) for p in tracked] if check else _tracked()

    rules = build_rules(tracked)
    python_changed = []
    for path in _text_files(tracked, source):
        file = REPO / source.get(path, path)
        try:
            text = file.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        if "\0" in text:
            continue
        new = rewrite_python(path, text, rules, warnings) if path.endswith(".py") else rules.text(text)
        if new != text:
            changed.append(f"rewrote {path}")
            if not check:
                file.write_text(new, encoding="utf-8")
                if path.endswith(".py"):
                    python_changed.append(path)
    if python_changed:  # the renamed imports, sorted as the project's isort rules want
        subprocess.run(
            ["ruff", "check", "--quiet", "--fix", "--select", "I", "--exit-zero", *python_changed], cwd=REPO, check=True
        )
    for line in changed:
        print(line)
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    print(f"{len(changed)} change(s){' to make' if check else ''}, {len(warnings)} warning(s)", file=sys.stderr)
    return 1 if check and changed else 0


def table() -> str:
    lines = ["| old | new | why |", "|---|---|---|"]
    lines += [f"| `{r.old}` | `{r.new}` | {r.why} |" for r in RENAMES]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 when something would change")
    p.add_argument("--table", action="store_true", help="print the table as Markdown")
    args = p.parse_args(argv)
    if args.table:
        print(table())
        return 0
    return run(args.check)


if __name__ == "__main__":
    sys.exit(main())
