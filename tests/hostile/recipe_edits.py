"""The hostile-recipe corpus's vocabulary: a Case (what `kiln` must answer), the edits that
break a copy of the shipped recipes (put, sub, append, symlinks, special files, env entries)
and the YAML bombs."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

TINY = "tiny-moe"
GLM = "glm53-kindling"
OVERLAY = f"recipes/{GLM}/experimental/draft-trunc"
_SHIPPED = Path(__file__).resolve().parents[2] / "recipes"


def line_of(marker: str, name: str = TINY) -> int:
    """The 1-based line of the shipped recipe that starts with `marker`, so that cases
    follow edits to the recipe instead of hard-coding its line numbers."""
    for number, line in enumerate((_SHIPPED / name / "recipe.yaml").read_text().splitlines(), 1):
        if line.startswith(marker):
            return number
    raise LookupError(f"recipes/{name}/recipe.yaml has no line starting with {marker!r}")


@dataclass(frozen=True)
class Case:
    id: str
    setup: Callable[[Path], None]
    expect: str = ""  # regex the error output must contain (exit 2)
    code: int = 2
    argv: tuple[str, ...] = ("check", TINY)
    shape: str = "recipe"  # "name": an unknown/unusable recipe name
    line: int | None = None  # the line the first error must name


# -- editing helpers --------------------------------------------------------------------
def rfile(root: Path, name: str = TINY) -> Path:
    return root / "recipes" / name / "recipe.yaml"


def text(root: Path, name: str = TINY) -> str:
    return rfile(root, name).read_text()


def put(data: str | bytes, name: str = TINY, file: str = "recipe.yaml") -> Callable[[Path], None]:
    def setup(root: Path) -> None:
        path = root / "recipes" / name / file
        path.write_bytes(data if isinstance(data, bytes) else data.encode())

    return setup


def sub(old: str, new: str, name: str = TINY, file: str = "recipe.yaml") -> Callable[[Path], None]:
    """Replace the first `old` in a recipe file (which must hold it)."""

    def setup(root: Path) -> None:
        path = root / "recipes" / name / file
        body = path.read_bytes()
        old_b = old.encode() if isinstance(old, str) else old
        new_b = new.encode() if isinstance(new, str) else new
        assert old_b in body, (path, old)
        path.write_bytes(body.replace(old_b, new_b, 1))

    return setup


def append(extra: str | bytes, name: str = TINY, file: str = "recipe.yaml") -> Callable[[Path], None]:
    def setup(root: Path) -> None:
        path = root / "recipes" / name / file
        path.write_bytes(path.read_bytes() + (extra if isinstance(extra, bytes) else extra.encode()))

    return setup


def both(*steps: Callable[[Path], None]) -> Callable[[Path], None]:
    def setup(root: Path) -> None:
        for step in steps:
            step(root)

    return setup


def nothing(root: Path) -> None:
    pass


def symlink(rel: str, target: str | Callable[[Path], str]) -> Callable[[Path], None]:
    """Make `rel` (inside the tree) a symlink to `target` (a callable gets the root)."""

    def setup(root: Path) -> None:
        link = root / rel
        dest = target(root) if callable(target) else target
        if link.exists() or link.is_symlink():
            link.unlink()
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(dest)

    return setup


def outside_file(content: str = "secret\n", name: str = "outside-secret.json") -> Callable[[Path], str]:
    """A file next to recipes/, e.g. what ~/.docker/config.json is to a CI job."""

    def make(root: Path) -> str:
        path = root / name
        path.write_text(content)
        return str(path)

    return make


def outside_copy_of_recipe(root: Path) -> str:
    path = root / "elsewhere.yaml"
    path.write_text(text(root))
    return str(path)


def fifo(rel: str) -> Callable[[Path], None]:
    def setup(root: Path) -> None:
        path = root / rel
        if path.exists():
            path.unlink()
        os.mkfifo(path)

    return setup


def many_files(count: int) -> Callable[[Path], None]:
    def setup(root: Path) -> None:
        d = root / "recipes" / TINY / "junk"
        d.mkdir()
        for i in range(count):
            (d / f"f{i}").touch()

    return setup


def sparse(size: int) -> Callable[[Path], None]:
    def setup(root: Path) -> None:
        with open(rfile(root), "r+b") as fh:
            fh.truncate(size)

    return setup


def loop_links(root: Path) -> None:
    d = root / "recipes" / TINY
    (d / "recipe.yaml").unlink()
    (d / "recipe.yaml").symlink_to("loop-b")
    (d / "loop-b").symlink_to("recipe.yaml")


def outside_recipe_folder(root: Path) -> None:
    """A recipe folder outside recipes/, and recipes/evil linking to it."""
    elsewhere = root / "elsewhere" / "evil"
    elsewhere.mkdir(parents=True)
    (elsewhere / "recipe.yaml").write_text(text(root).replace("name: tiny-moe", "name: evil"))
    (elsewhere / "Dockerfile").write_text("FROM scratch\n")
    (root / "recipes" / "evil").symlink_to(elsewhere)


def recipe_outside_recipes(root: Path) -> None:
    d = root / "x"
    d.mkdir()
    (d / "recipe.yaml").write_text(text(root).replace("name: tiny-moe", "name: x"))
    (d / "Dockerfile").write_text("FROM scratch\n")


# -- launch.env and speculative_config of tiny-moe ------------------------------------------
OVERRIDE = "experimental/draft-trunc/override.yaml"
ENV_LINE = line_of('    VLLM_CPU_KVCACHE_SPACE: "1"')


def add_env(entry: str = "", allow: str = "", allow_raw: str = "") -> Callable[[Path], None]:
    """An entry (`NAME: value`, YAML) added under tiny-moe's launch.env, and an
    allow_unsafe_env mapping of `allow` (`NAME: reason`) after it (or `allow_raw` as is)."""
    tail = (
        '    VLLM_CPU_KVCACHE_SPACE: "1"\n'
        + (f"    {entry}\n" if entry else "")
        + (f"  allow_unsafe_env:\n    {allow}\n" if allow else "")
        + allow_raw
    )
    return sub('    VLLM_CPU_KVCACHE_SPACE: "1"\n', tail)


def spec_line(entry: str) -> Callable[[Path], None]:
    """A key added to tiny-moe's speculative_config, after num_speculative_tokens."""
    return sub("    num_speculative_tokens: 3\n", f"    num_speculative_tokens: 3\n    {entry}\n")


# -- YAML bombs and oversized input ----------------------------------------------------------
def alias_bomb(levels: int = 9, width: int = 9) -> str:
    rows = ['lol0: &l0 ["lol"]']
    for i in range(1, levels + 1):
        rows.append(f"lol{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]")
    return "\n".join(rows) + "\n"


def deep_flow(depth: int) -> str:
    return "[" * depth + "]" * depth


def deep_block(depth: int) -> str:
    return "".join("  " * i + f"k{i}:\n" for i in range(depth)) + "  " * depth + "v\n"


BOMB_PREFIX = "# a billion laughs\n"
