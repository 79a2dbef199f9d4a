#!/usr/bin/env python3
"""Move src/kiln's flat modules into the layered folders of docs/architecture.md, and
rewrite every reference to them (issue 13).

    python scripts/relayout.py            # from the checkout root, on a clean tree

What it does, in order (nothing is written before the first two checks pass):

1. refuses a dirty work tree (a half-done run is then undone with `git checkout .`);
2. STOPS, listing them, if src/kiln holds a module that MOVES does not place: extend
   MOVES (one line per module) and rerun;
3. turns relative imports inside src/kiln into absolute ones (`from .x import` ->
   `from kiln.x import`), so that moving a file changes no meaning;
4. `git mv`s each module (or package) to its layer, adding the layer packages;
5. rewrites references in src/, engine/, tests/, benchmarks/, scripts/, docker-images/,
   docs/, noxfile.py, pyproject.toml, README.md, Makefile: dotted names (`kiln.x`,
   `kiln.x.attr` in monkeypatch / mock strings), `from kiln import x` (split per layer),
   file paths (`src/kiln/x.py`), and renamed identifiers (RENAMES);
6. activates the import contract: [tool.importlinter] in pyproject.toml, `lint-imports`
   in `nox -s lint`, ruff's ban on relative imports;
7. re-sorts imports (ruff, rule I only) and runs `ruff check` and `lint-imports`.

It prints what it did; it commits nothing. Run the test suite next.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "kiln"

# Layers, top to bottom (docs/architecture.md): each may import only the ones below it.
LAYERS = ("cli", "commands", "domain", "infra", "basics")

# Flat module (or package) under src/kiln -> its place under src/kiln (dotted, no "kiln.").
# A name missing from src/kiln is skipped; a module present here but missing from MOVES
# stops the script before anything changes.
MOVES: dict[str, str] = {
    # commands: one module per CLI stage, wiring arguments to the domain
    "build": "commands.build",
    "base": "commands.base",
    "check": "commands.check",
    "doctor": "commands.doctor",
    "prune": "commands.prune",
    "runner": "commands.serve",  # kiln run / ps / logs / stop
    "smoke": "commands.smoke",
    "publish": "commands.publish",
    "patchcmd": "commands.patches",  # kiln patches / engine bump / override
    "k8s": "commands.render",  # kiln render k8s (issue 14)
    # domain: what kiln knows about recipes, images, engines and containers
    "recipe": "domain.recipe",
    "overrides": "domain.overrides",
    "launch": "domain.launch",
    "context": "domain.context",
    "images": "domain.images",
    "ca": "domain.ca",
    "wheelhouse": "domain.wheelhouse",
    "argcheck": "domain.argcheck",
    "enginecheck": "domain.enginecheck",
    "engineprobe": "domain.engineprobe",
    "container": "domain.container",
    "patching": "domain.patching",  # flat patching.py or the kiln.patching package (applier inside)
    "features": "domain.features",  # the engine's feature registry, harness side (issue 13)
    "topology": "domain.topology",  # issue 14
    "multinode": "domain.multinode",  # issue 14
    # infrastructure: the outside world (Docker daemon, registries, credentials, pip, disk)
    "dockerengine": "infra.docker",
    "registry": "infra.registry",
    "credentials": "infra.credentials",
    "wheelcache": "infra.wheelcache",
    "records": "infra.records",
    # basics: used by every layer, import nothing of kiln's above them
    "errors": "basics.errors",
    "log": "basics.log",
    "progress": "basics.progress",
    "paths": "basics.paths",
    "yamlsrc": "basics.yamlsrc",
}
STAY = {"__init__", "__main__", "cli", "schemas", *LAYERS}

# Identifiers renamed with the move: "engine" means vLLM only; the daemon is the daemon.
RENAMES = {"DockerEngine": "DockerDaemon", "docker_engine": "docker_daemon"}  # the class; the tests' fixture

# Where references are rewritten (text files only).
SCOPE = ("src", "engine", "tests", "benchmarks", "scripts", "docker-images", "docs",
         "noxfile.py", "pyproject.toml", "README.md", "Makefile")
TEXT_SUFFIXES = {".py", ".md", ".toml", ".cfg", ".ini", ".txt", ".sh", ".yaml", ".yml", ".json", ""}
SKIP_PARTS = {"__pycache__", ".git", "node_modules", ".nox", ".venv"}
SELF = Path(__file__).resolve()
NOT_REWRITTEN = {SELF, ROOT / "tests" / "test_relayout.py"}  # both spell old names on purpose


def main() -> int:
    dirty = git("status", "--porcelain", "--untracked-files=no").strip()
    if dirty:
        return fail("the work tree has uncommitted changes; commit or stash them first:\n" + dirty)
    untracked = [f for f in git("ls-files", "--others", "--exclude-standard", "src/kiln").split() if f.endswith(".py")]
    if untracked:
        return fail("untracked modules under src/kiln (git mv cannot move them); `git add` or remove them:\n"
                    + "\n".join(f"  {f}" for f in untracked))
    present = flat_modules()
    unplaced = sorted(set(present) - set(MOVES) - STAY)
    if unplaced:
        return fail("src/kiln holds modules MOVES does not place; add a line for each to MOVES in "
                    "scripts/relayout.py (see docs/architecture.md for the layers), then rerun:\n"
                    + "\n".join(f"  {name!r}: \"<layer>.{name}\",  # src/kiln/{present[name]}" for name in unplaced))
    moves = {old: new for old, new in MOVES.items() if old in present}
    skipped = sorted(set(MOVES) - set(present))

    say(f"absolute imports in {sum(absolutize(p) for p in PKG.rglob('*.py'))} file(s) under src/kiln")
    move_files(moves, present)
    dotted = {f"kiln.{old}": f"kiln.{new}" for old, new in moves.items()}
    changed = [p for p in files_in_scope() if rewrite_file(p, dotted, moves, present)]
    say(f"references rewritten in {len(changed)} file(s)")
    write_contract(moves)
    describe_in_readme()
    say("import contract written: [tool.importlinter] in pyproject.toml, lint-imports in nox -s lint")
    run_tool(["ruff", "check", "--select", "I", "--fix", "--quiet", *existing("src", "engine", "tests", "noxfile.py",
                                                                              "benchmarks", "scripts")])
    ok_ruff = run_tool(["ruff", "check", *existing("src", "engine", "tests", "noxfile.py", "benchmarks")])
    ok_lint = run_tool(["lint-imports"], cwd=ROOT)
    print()
    say(f"moved {len(moves)} module(s); not present here (skipped): {', '.join(skipped) or 'none'}")
    late = [f"  {p.relative_to(ROOT)}:{n}: {line.strip()}" for p in PKG.rglob("*.py")
            for n, line in enumerate(p.read_text().splitlines(), 1) if "__file__" in line]
    if STALE_COMMENTS:
        say("comments in image inputs left as they were (they name old module paths; edit them when "
            "that image is rebuilt anyway):\n" + "\n".join(STALE_COMMENTS))
    if late:
        say("module-relative paths (check they still point at the right file after the move):\n" + "\n".join(late))
    say("ruff: " + ("clean" if ok_ruff else "PROBLEMS above") + "; lint-imports: "
        + ("contracts kept" if ok_lint else "BROKEN contracts above (fix the imports, not the contract)"))
    say("next: python -m pytest -p no:cacheprovider -m 'not e2e and not gpu and not disruptive' (or nox), "
        "then commit")
    return 0 if ok_ruff and ok_lint else 1


# -- inventory ---------------------------------------------------------------------------
def flat_modules() -> dict[str, str]:
    """name -> file or folder of every module and package directly under src/kiln."""
    out = {}
    for path in sorted(PKG.iterdir()):
        if path.suffix == ".py":
            out[path.stem] = path.name
        elif path.is_dir() and (path / "__init__.py").is_file():
            out[path.name] = path.name + "/"
    return out


def files_in_scope() -> list[Path]:
    out = []
    for name in SCOPE:
        base = ROOT / name
        paths = [base] if base.is_file() else sorted(base.rglob("*")) if base.is_dir() else []
        for p in paths:
            if p.is_file() and p.suffix in TEXT_SUFFIXES and not SKIP_PARTS & set(p.parts) and p.resolve() not in NOT_REWRITTEN:
                out.append(p)
    return out


# -- step 3: relative -> absolute imports ------------------------------------------------
def absolutize(path: Path) -> bool:
    text = path.read_text()
    package = ".".join(path.relative_to(PKG.parent).with_suffix("").parts)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    lines = text.splitlines(keepends=True)
    changed = False
    for node in ast.walk(ast.parse(text)):
        if not (isinstance(node, ast.ImportFrom) and node.level):
            continue
        base = package.split(".")
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
        i = node.lineno - 1
        new, n = re.subn(r"\bfrom\s+\.+[\w.]*\s+import\b", f"from {target} import", lines[i], count=1)
        if n != 1:
            raise SystemExit(f"relayout: cannot rewrite the relative import at {path}:{node.lineno}")
        lines[i], changed = new, True
    if changed:
        path.write_text("".join(lines))
    return changed


# -- step 4: git mv ----------------------------------------------------------------------
def move_files(moves: dict[str, str], present: dict[str, str]) -> None:
    for layer in LAYERS[1:]:
        init = PKG / layer / "__init__.py"
        if not init.exists():
            init.parent.mkdir(exist_ok=True)
            init.write_text(f'"""kiln\'s {layer} layer (docs/architecture.md)."""\n')
            git("add", str(init))
    for old, new in sorted(moves.items()):
        src = PKG / present[old].rstrip("/")
        dest = PKG / Path(*new.split("."))
        dest = dest if present[old].endswith("/") else dest.with_suffix(".py")
        dest.parent.mkdir(parents=True, exist_ok=True)
        git("mv", str(src), str(dest))


# -- step 5: references ------------------------------------------------------------------
def rewrite_file(path: Path, dotted: dict[str, str], moves: dict[str, str], present: dict[str, str]) -> bool:
    original = path.read_text()
    text = split_from_kiln_imports(original, moves) if path.suffix == ".py" else original
    image_input = path.is_relative_to(ROOT / "docker-images")
    out = []
    for line in text.splitlines(keepends=True):
        new = rewrite_line(line, dotted, moves, present)
        if new != line and image_input and line.lstrip().startswith("#"):
            # a comment in an image input: editing it would change the input digest and
            # rebuild every engine image, for prose
            STALE_COMMENTS.append(f"  {path.relative_to(ROOT)}: {line.strip()}")
            new = line
        out.append(new)
    text = "".join(out)
    if text != original:
        path.write_text(text)
        return True
    return False


STALE_COMMENTS: list[str] = []


def rewrite_line(line: str, dotted: dict[str, str], moves: dict[str, str], present: dict[str, str]) -> str:
    if dotted:
        names = "|".join(re.escape(k) for k in sorted(dotted, key=len, reverse=True))
        line = re.sub(rf"(?<![\w.])({names})(?![\w])", lambda m: dotted[m.group(1)], line)
    line = rewrite_paths(line, moves, present)
    for old, new in RENAMES.items():
        line = re.sub(rf"\b{old}\b", new, line)
    return line


def split_from_kiln_imports(text: str, moves: dict[str, str]) -> str:
    """`from kiln import a, b` -> one `from kiln.<layer> import x` per layer (aliased
    where the module's own name changes, so the code below keeps working)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    lines = text.splitlines(keepends=True)
    edits = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ImportFrom) and node.module == "kiln" and node.level == 0):
            continue
        if not any(a.name in moves for a in node.names):
            continue
        groups: dict[str, list[str]] = {}
        for alias in node.names:
            new = moves.get(alias.name)
            parent, leaf = ("kiln", alias.name) if new is None else (f"kiln.{new.rpartition('.')[0]}",
                                                                        new.rpartition(".")[2])
            bound = alias.asname or alias.name
            groups.setdefault(parent, []).append(leaf if bound == leaf else f"{leaf} as {bound}")
        indent = re.match(r"\s*", lines[node.lineno - 1]).group(0)
        comment = lines[node.end_lineno - 1][node.end_col_offset:].rstrip("\n")  # a trailing comment (noqa) goes on every line
        stmts = [f"{indent}from {parent} import {', '.join(names)}{comment}" for parent, names in sorted(groups.items())]
        edits.append((node.lineno - 1, node.end_lineno - 1, "\n".join(stmts)))
    for start, end, new in sorted(edits, reverse=True):
        lines[start:end + 1] = [new if new.endswith("\n") else new + "\n"]
    return "".join(lines)


def rewrite_paths(text: str, moves: dict[str, str], present: dict[str, str]) -> str:
    """`src/kiln/x.py`, `kiln/x.py`, `kiln/pkg/...` -> their new file paths."""
    for old, new in moves.items():
        new_path = "/".join(new.split("."))
        if present[old].endswith("/"):
            text = re.sub(rf"(?<![\w.-])((?:src/)?kiln/){re.escape(old)}/", rf"\g<1>{new_path}/", text)
        else:
            text = re.sub(rf"(?<![\w.-])((?:src/)?kiln/){re.escape(old)}\.py\b", rf"\g<1>{new_path}.py", text)
    return text


README_ROW = ("| `src/kiln/` | the harness in layers (docs/architecture.md): `cli.py`, `commands/` (one module "
              "per stage), `domain/` (recipes, images, launch, engine checks, patches), `infra/` (Docker daemon, "
              "registry, credentials), `basics/` (errors, log, paths) |")


def describe_in_readme() -> None:
    readme = ROOT / "README.md"
    if readme.is_file():
        text = readme.read_text()
        new = re.sub(r"(?m)^\| `src/kiln/` \|.*\|$", lambda _: README_ROW, text, count=1)
        if new != text:
            readme.write_text(new)


# -- step 6: the contract ----------------------------------------------------------------
RUFF_TIDY = """[tool.ruff.lint.flake8-tidy-imports]
ban-relative-imports = "all"  # kiln's modules import absolutely: moving one changes no meaning

[tool.ruff.lint.per-file-ignores]
"engine/**" = ["TID252"]  # kiln_engine is its own package, not part of kiln's layers
"""
CONTRACT_HEADER = "# ---- import contract (scripts/relayout.py; docs/architecture.md) ----"


def write_contract(moves: dict[str, str]) -> None:
    pyproject = ROOT / "pyproject.toml"
    text = pyproject.read_text()
    if CONTRACT_HEADER not in text:
        text = text.rstrip("\n") + "\n\n" + contract_toml(moves)
    text = re.sub(r'(\[tool\.ruff\.lint\]\nselect = \[[^\]]*)"UP"\]', r'\1"UP", "TID"]', text, count=1)
    if "[tool.ruff.lint.flake8-tidy-imports]" not in text:
        text = text.rstrip("\n") + "\n\n" + RUFF_TIDY

    if '"import-linter' not in text:
        text = text.replace('    "ruff>=0.5",\n', '    "ruff>=0.5",\n    "import-linter>=2.1",\n', 1)
    pyproject.write_text(text)
    nox = ROOT / "noxfile.py"
    text = nox.read_text()
    if "lint-imports" not in text:
        old = '    session.run("ruff", "check", "src", "engine", "tests", "noxfile.py", "benchmarks")\n'
        if old not in text:
            raise SystemExit("relayout: noxfile.py's lint session changed; add `session.run(\"lint-imports\")` by hand")
        text = text.replace(old, old + '    session.run("lint-imports")  # the layers of docs/architecture.md\n', 1)
        text = text.replace('"""ruff over the harness, the engine package and the tests."""',
                            '"""ruff over the harness, the engine package and the tests; the import contract."""', 1)
        nox.write_text(text)


def contract_toml(moves: dict[str, str]) -> str:
    applier = PKG / "domain" / "patching" / "applier.py"
    out = [
        CONTRACT_HEADER,
        "[tool.importlinter]",
        'root_package = "kiln"',
        "include_external_packages = true",
        "",
        "[[tool.importlinter.contracts]]",
        'name = "layers: cli -> commands -> domain -> infra -> basics (every module in one)"',
        'type = "layers"',
        'containers = ["kiln"]',
        'layers = ["__main__", "cli", "commands", "domain", "infra", "basics"]',
        "exhaustive = true",
        "",
        "[[tool.importlinter.contracts]]",
        'name = "no import cycles between sibling modules or packages"',
        'type = "acyclic_siblings"',
        'ancestors = ["kiln"]',
        "",
        "[[tool.importlinter.contracts]]",
        'name = "the docker SDK only behind kiln.infra.docker"',
        'type = "forbidden"',
        'source_modules = ["kiln"]',
        'forbidden_modules = ["docker"]',
        'ignore_imports = ["kiln.infra.docker -> docker"]',
        "allow_indirect_imports = true",
    ]
    if applier.is_file():
        others = sorted({f"kiln.{layer}" for layer in ("cli", "commands", "infra", "basics")}
                        | {f"kiln.{new}" for new in moves.values() if new.startswith("domain.")
                           and new != "domain.patching"}
                        | {f"kiln.domain.patching.{p.stem}" for p in applier.parent.glob("*.py")
                           if p.stem not in ("applier", "__init__")})
        out += [
            "",
            "[[tool.importlinter.contracts]]",
            'name = "the in-image patch applier imports nothing of kiln (it runs alone inside images)"',
            'type = "forbidden"',
            'source_modules = ["kiln.domain.patching.applier"]',
            "forbidden_modules = [" + ", ".join(f'"{m}"' for m in others) + "]",
        ]
    return "\n".join(out) + "\n"


# -- helpers -----------------------------------------------------------------------------
def git(*args: str) -> str:
    proc = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"relayout: STOPPED: git {' '.join(args)}: {proc.stderr.strip()}\n"
                         "  undo everything this run did: git reset -q --hard HEAD && git clean -fdq src/kiln")
    return proc.stdout


def run_tool(cmd: list[str], cwd: Path = ROOT) -> bool:
    say("$ " + " ".join(cmd))
    try:
        return subprocess.run(cmd, cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT / "src")}).returncode == 0
    except FileNotFoundError:
        say(f"{cmd[0]} is not installed (pip install -e .[dev]); run it yourself")
        return False


def existing(*names: str) -> list[str]:
    return [n for n in names if (ROOT / n).exists()]


def say(msg: str) -> None:
    print(f"relayout: {msg}", flush=True)


def fail(msg: str) -> int:
    print(f"relayout: STOPPED: {msg}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
