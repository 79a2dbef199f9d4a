"""The hostile-recipe corpus: each case breaks a copy of the shipped recipes in one way
and says what `kiln` must answer (exit code, the error it must name, its line)."""

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

CASES: list[Case] = [
    # aliases, merge keys, anchors
    Case("alias-bomb-9x9", put(BOMB_PREFIX + alias_bomb()), r"\(yaml\): YAML alias \*l0 is not supported", line=3),
    Case("alias-bomb-appended", append(alias_bomb()), r"YAML alias \*l0 is not supported"),
    Case(
        "alias-bomb-under-args",
        sub("    max-num-seqs: 8\n", "    max-num-seqs: 8\n    x: &x [1, 2]\n    y: [*x, *x]\n"),
        r"alias \*x is not supported",
    ),
    Case(
        "alias-simple",
        both(
            sub("  served_model_name: tiny-moe\n", "  served_model_name: &n tiny-moe\n"),
            sub("smoke:\n", "smoke:\n  served_model_name: *n\n"),
        ),
        r"alias \*n is not supported",
    ),
    Case("alias-recursive", append("loop: &a [*a]\n"), r"alias \*a is not supported"),
    Case("merge-key", append("extra:\n  <<: {a: 1}\n"), r"merge keys \(<<\) are not supported"),
    Case(
        "merge-key-with-alias",
        both(sub("launch:\n", "launch: &l\n"), append("copy:\n  <<: *l\n")),
        r"merge keys|alias \*l",
    ),
    Case("anchor-without-alias-is-fine", sub("launch:\n", "launch: &l\n"), code=0),
    # nesting, size, value count
    Case(
        "deep-flow-nesting-10000",
        sub("    max-num-seqs: 8\n", f"    x: {deep_flow(10000)}\n"),
        r"nested more than 32 levels deep",
    ),
    Case("deep-block-nesting-200", append(deep_block(200)), r"nested more than 32 levels deep"),
    Case(
        "nesting-20-levels-is-fine",
        sub("    max-num-seqs: 8\n", "    max-num-seqs: 8\n    x: " + "{a: " * 20 + "1" + "}" * 20 + "\n"),
        code=0,
    ),
    Case("huge-file-10mb", append("#" + "x" * (10 << 20) + "\n"), r"\(yaml\): larger than 64 KiB", line=1),
    Case("sparse-file-4gb", sparse(4 << 30), r"larger than 64 KiB"),
    Case(
        "many-values",
        sub('    - "The quick brown fox"\n', '    - "The quick brown fox"\n' + "    - a\n" * 6000),
        r"more than 5000 values",
    ),
    Case(
        "long-description-is-fine",
        sub("description: >-\n", f"description: {'word ' * 10000}\nx_description: >-\n"),
        r"x_description: unknown key",
    ),
    Case(
        "huge-integer",
        sub("  port: 8000\n", f"  port: {'9' * 5000}\n"),
        r"\(yaml\): invalid !!int value: Exceeds the limit \(4300 digits\) for integer string conversion\n",
    ),
    Case("float-infinity-port", sub("  port: 8000\n", "  port: 1e9999\n"), r"launch.port: must be an integer"),
    # encodings and characters
    Case(
        "non-utf8-byte",
        sub("  max_tokens: 16\n", b"  max_tokens: 16 # \xff\n"),
        r"not UTF-8: byte 0xff",
        line=line_of("  max_tokens: 16"),
    ),
    Case(
        "latin1-comment", sub("# The embedded default", b"# The embedded d\xe9fault"), r"not UTF-8: byte 0xe9", line=1
    ),
    Case("utf16-file", lambda r: rfile(r).write_bytes(text(r).encode("utf-16")), r"not UTF-8"),
    Case(
        "nul-byte",
        sub("  port: 8000\n", b"  port: 80\x0000\n"),
        r"control character U\+0000 is not allowed",
        line=line_of("  port: 8000"),
    ),
    Case(
        "nul-escape-in-value",
        sub("  served_model_name: tiny-moe\n", '  served_model_name: "tiny\\0moe"\n'),
        r"control character U\+0000 is not allowed",
    ),
    Case(
        "ansi-escape-in-value",
        sub('  VLLM_CPU_KVCACHE_SPACE: "1"\n', '  VLLM_CPU_KVCACHE_SPACE: "\\e[2J1"\n'),
        r"control character U\+001B",
    ),
    Case(
        "surrogate-escape-in-value",
        sub("  served_model_name: tiny-moe\n", '  served_model_name: "tiny\\ud800"\n'),
        r"lone surrogate U\+D800 is not allowed",
    ),
    Case("bell-byte-in-comment", sub("# The embedded", b"# The \x07embedded"), r"control character U\+0007", line=1),
    Case(
        "c1-control-char",
        sub("  port: 8000\n", "  port: 8000 # \x80\n"),
        r"character U\+0080 is not allowed",
        line=line_of("  port: 8000"),
    ),
    Case("bom-is-accepted", lambda r: rfile(r).write_bytes(b"\xef\xbb\xbf" + rfile(r).read_bytes()), code=0),
    Case(
        "double-bom-is-harmless",
        lambda r: rfile(r).write_bytes(b"\xef\xbb\xbf\xef\xbb\xbf" + rfile(r).read_bytes()),
        code=0,
    ),
    Case("crlf-line-endings", lambda r: rfile(r).write_bytes(rfile(r).read_bytes().replace(b"\n", b"\r\n")), code=0),
    Case("tab-indentation", sub("  port: 8000\n", "\tport: 8000\n"), r"tabs", line=line_of("  port: 8000")),
    Case("bidi-override-in-key", sub("  port: 8000\n", '  "\\u202eport": 8000\n'), r"\\u202eport"),
    Case(
        "newline-in-key", sub("  port: 8000\n", '  port: 8000\n  "a\\nb: c": 1\n'), r"launch\['a\\nb: c'\]: unknown key"
    ),
    Case(
        "very-long-key",
        sub("  port: 8000\n", f"  port: 8000\n  {'k' * 20000}: 1\n"),
        r"invalid YAML: could not find expected ':'",
        line=line_of("  port: 8000") + 1,
    ),
    # keys that are not text
    Case("int-key", append("1: one\n"), r"key '1' is read as int, not text: quote it"),
    Case(
        "bool-key-on",
        sub("    enforce-eager: true\n", "    enforce-eager: true\n    on: true\n"),
        r"key 'on' is read as bool",
    ),
    Case("null-key", append("~: nothing\n"), r"key '~' is read as NoneType"),
    Case("float-key", append("1.5: x\n"), r"read as float"),
    Case("complex-key", append("? [a, b]\n: c\n"), r"a key must be plain text, not a list or mapping"),
    Case("mapping-key", append("? {a: 1}\n: c\n"), r"a key must be plain text"),
    Case("duplicate-key", sub("  port: 8000\n", "  port: 8000\n  port: 8001\n"), r"duplicate key 'port'"),
    # tags
    Case(
        "python-object-apply",
        append('x: !!python/object/apply:os.system ["echo pwned"]\n'),
        r"YAML tag !!python/object/apply:os.system is not supported",
    ),
    Case("python-name", append("x: !!python/name:os.system\n"), r"YAML tag !!python/name:os.system is not supported"),
    Case("local-tag", sub("  port: 8000\n", "  port: !port 8000\n"), r"YAML tag !port is not supported"),
    Case("binary-tag", append("x: !!binary aGVsbG8=\n"), r"YAML tag !!binary"),
    Case("set-tag", append("x: !!set {a, b}\n"), r"YAML tag !!set"),
    Case(
        "timestamp-version",
        sub("  version: 0.32.0\n", "  version: 2024-01-01\n"),
        r"engine.version: must be a valid string",
    ),
    # document structure
    Case("two-documents", append("---\nname: other\n"), r"invalid YAML: but found another document"),
    Case("empty-file", put(""), r"\(top level\): must be a mapping"),
    Case("only-comments", put("# nothing here\n"), r"\(top level\): must be a mapping"),
    Case("top-level-list", put("- a\n- b\n"), r"\(top level\): must be a mapping"),
    Case("top-level-scalar", put("just text\n"), r"\(top level\): must be a mapping"),
    Case("yaml-2-directive", lambda r: rfile(r).write_text("%YAML 2.0\n---\n" + text(r)), r"invalid YAML"),
    Case("unterminated-quote", sub("  port: 8000\n", '  port: "8000\n'), r"invalid YAML"),
    Case("unclosed-flow", sub("  port: 8000\n", "  port: [8000\n"), r"invalid YAML"),
    # recipe names on the command line
    Case(
        "check-unknown-name",
        nothing,
        r"no recipe named 'nosuch' in recipes/ \(known: .*glm53-kindling, .*tiny-moe.*\)",
        argv=("check", "nosuch"),
        shape="name",
    ),
    Case("build-unknown-name", nothing, r"no recipe named 'nosuch'", argv=("build", "nosuch"), shape="name"),
    Case("show-unknown-name", nothing, r"no recipe named 'nosuch'", argv=("show", "nosuch"), shape="name"),
    Case(
        "build-dotdot-name",
        recipe_outside_recipes,
        r"'\.\./x' is not a recipe name",
        argv=("build", "../x"),
        shape="name",
    ),
    Case("check-absolute-name", nothing, r"'/etc' is not a recipe name", argv=("check", "/etc"), shape="name"),
    Case(
        "show-path-name",
        nothing,
        r"'recipes/tiny-moe' is not a recipe name",
        argv=("show", "recipes/tiny-moe"),
        shape="name",
    ),
    Case("show-empty-name", nothing, r"'' is not a recipe name", argv=("show", ""), shape="name"),
    Case("check-uppercase-name", nothing, r"'TINY-MOE' is not a recipe name", argv=("check", "TINY-MOE"), shape="name"),
    Case(
        "check-newline-name", nothing, r"'tiny\\nmoe' is not a recipe name", argv=("check", "tiny\nmoe"), shape="name"
    ),
    Case(
        "check-all-bad-folder-name",
        both(lambda r: (r / "recipes" / "Bad_Name").mkdir(), put("name: x\n", "Bad_Name")),
        r"recipes/Bad_Name:1: \(file\): folder name must match",
        argv=("check", "--all"),
        shape="all",
    ),
    Case(
        "check-all-newline-folder-name",
        both(lambda r: (r / "recipes" / "a\nb").mkdir(), put("name: x\n", "a\nb")),
        r"recipes/a\\nb:1: \(file\): folder name must match",
        argv=("check", "--all"),
        shape="all",
    ),
    Case(
        "folder-without-recipe",
        lambda r: (r / "recipes" / "half").mkdir(),
        r"recipes/half/recipe.yaml:1: \(file\): not found",
        argv=("check", "half"),
    ),
    # symlinks and special files
    Case(
        "recipe-yaml-symlink-outside",
        symlink(f"recipes/{TINY}/recipe.yaml", outside_copy_of_recipe),
        r"recipes/tiny-moe/recipe.yaml:1: \(file\): symlink to .*elsewhere.yaml, outside the recipe folder",
    ),
    Case(
        "recipe-yaml-symlink-dev-zero",
        symlink(f"recipes/{TINY}/recipe.yaml", "/dev/zero"),
        r"symlink to /dev/zero, outside",
    ),
    Case("recipe-yaml-symlink-loop", loop_links, r"broken or looping symlink"),
    Case(
        "dangling-symlink", symlink(f"recipes/{TINY}/weights", "/nonexistent/weights"), r"weights:1: \(file\): broken"
    ),
    Case(
        "dockerfile-symlink-outside",
        symlink(f"recipes/{TINY}/Dockerfile", "/etc/hostname"),
        r"Dockerfile:1: \(file\): symlink to /etc/hostname",
    ),
    Case(
        "credentials-symlink",
        symlink(f"recipes/{TINY}/config.json", outside_file()),
        r"config.json:1: \(file\): symlink to .*outside-secret.json",
    ),
    Case(
        "dir-symlink-outside",
        symlink(f"recipes/{TINY}/etc", "/etc"),
        r"recipes/tiny-moe/etc:1: \(file\): symlink to /etc, outside",
    ),
    Case("symlink-inside-is-fine", symlink(f"recipes/{TINY}/Dockerfile.copy", "Dockerfile"), code=0),
    Case("fifo-in-folder", fifo(f"recipes/{TINY}/pipe"), r"pipe:1: \(file\): not a regular file or folder"),
    Case(
        "recipe-yaml-is-fifo",
        fifo(f"recipes/{TINY}/recipe.yaml"),
        r"recipe.yaml:1: \(file\): not a regular file or folder",
    ),
    Case(
        "recipe-yaml-is-folder", lambda r: (rfile(r).unlink(), rfile(r).mkdir()), r"recipe.yaml:1: \(file\): not found"
    ),
    Case(
        "recipe-folder-symlink-outside",
        outside_recipe_folder,
        r"recipes/evil:1: \(file\): symlink to .*/elsewhere/evil, outside recipes/",
        argv=("check", "evil"),
    ),
    Case("too-many-files", many_files(2100), r"more than 2000 files and folders"),
    # overlays (experimental/<feature>/override.yaml) and the paths they name
    Case(
        "overlay-patches-dotdot",
        sub(
            "patches: patches\n", "patches: ../../../../../etc/passwd\n", GLM, "experimental/draft-trunc/override.yaml"
        ),
        r"override.yaml:\d+: patches: '../../../../../etc/passwd' is outside",
        argv=("check", GLM),
    ),
    Case(
        "overlay-patches-absolute",
        sub("patches: patches\n", "patches: /etc/passwd\n", GLM, "experimental/draft-trunc/override.yaml"),
        r"patches: '/etc/passwd' is outside",
        argv=("check", GLM),
    ),
    Case(
        "overlay-replacement-escapes",
        append(
            "replacements:\n  - target: vllm/x.py\n    file: ../../recipe.yaml\n    upstream_sha256: '"
            + "0" * 64
            + "'\n",
            GLM,
            "experimental/draft-trunc/override.yaml",
        ),
        r"replacements\[0\].file: '../../recipe.yaml' is outside",
        argv=("check", GLM),
    ),
    Case(
        "overlay-yaml-symlink-outside",
        symlink(f"{OVERLAY}/override.yaml", outside_file("name: x\n", "ov.yaml")),
        r"override.yaml:1: \(file\): symlink to",
        argv=("check", GLM),
    ),
    Case(
        "overlay-series-symlink-outside",
        symlink(f"{OVERLAY}/patches/0.33.0/series", "/etc/passwd"),
        r"series:1: \(file\): symlink to /etc/passwd",
        argv=("check", GLM),
    ),
    Case(
        "overlay-patch-symlink-outside",
        symlink(f"{OVERLAY}/patches/0.33.0/0001-draft-trunc-runner-import.patch", "/etc/passwd"),
        r"0001-draft-trunc-runner-import.patch:1: \(file\): symlink to /etc/passwd",
        argv=("check", GLM),
    ),
    Case(
        "overlay-alias-bomb",
        append(alias_bomb(), GLM, "experimental/draft-trunc/override.yaml"),
        r"override.yaml:\d+: \(yaml\): YAML alias",
        argv=("check", GLM),
    ),
    Case(
        "overlay-non-utf8",
        append(b"# \xc3\x28\n", GLM, "experimental/draft-trunc/override.yaml"),
        r"override.yaml:\d+: \(yaml\): not UTF-8",
        argv=("check", GLM),
    ),
    Case(
        "overlay-top-level-list",
        put("- a\n", GLM, "experimental/draft-trunc/override.yaml"),
        r"override.yaml:1: \(top level\): must be a mapping",
        argv=("check", GLM),
    ),
    Case(
        "overlay-nul-in-path",
        sub("patches: patches\n", 'patches: "patches\\0"\n', GLM, "experimental/draft-trunc/override.yaml"),
        r"control character U\+0000",
        argv=("check", GLM),
    ),
    Case(
        "experimental-dotdot",
        sub("experimental: [draft-trunc]", "experimental: [../../x]", GLM),
        r"experimental\[0\]: must match",
        argv=("check", GLM),
    ),
    # env a recipe or override hands the server: one-line values; variables that make the
    # image's programs load code from elsewhere only with a stated reason (env_policy.py)
    Case(
        "env-newline-in-value",
        add_env('X: "x\\nRUN touch /pwned"'),
        r"launch.env.X: control character U\+000A at offset 1: an env value is one line of text\n",
        line=ENV_LINE + 1,
    ),
    Case(
        "env-carriage-return-in-value",
        add_env('X: "1\\r"'),
        r"launch.env.X: control character U\+000D at offset 1",
        line=ENV_LINE + 1,
    ),
    Case("env-tab-in-value", add_env('X: "a\\tb"'), r"launch.env.X: control character U\+0009", line=ENV_LINE + 1),
    Case(
        "env-line-separator-in-value",
        add_env('X: "a\\u2028b"'),
        r"launch.env.X: control character U\+2028",
        line=ENV_LINE + 1,
    ),
    Case(
        "env-block-scalar-newline",
        add_env("X: |\n      one\n      two"),
        r"launch.env.X: control character U\+000A at offset 3",
        line=ENV_LINE + 1,
    ),
    Case("env-spaces-and-unicode-are-fine", add_env('X: "a b  ñ ✓ --flag=1"'), code=0),
    Case(
        "ld-preload-in-env",
        add_env("LD_PRELOAD: /tmp/evil.so"),
        r"launch.env.LD_PRELOAD: ld.so loads those libraries into every process .*; if it is needed, say why under "
        r"launch.allow_unsafe_env: \{LD_PRELOAD: REASON\}\n",
        line=ENV_LINE + 1,
    ),
    Case(
        "ld-library-path-in-env",
        add_env("LD_LIBRARY_PATH: /models"),
        r"launch.env.LD_LIBRARY_PATH: ld.so searches",
        line=ENV_LINE + 1,
    ),
    Case("ld-audit-in-env", add_env("LD_AUDIT: /tmp/a.so"), r"launch.env.LD_AUDIT: ld.so loads", line=ENV_LINE + 1),
    Case(
        "other-ld-variable-in-env",
        add_env('LD_TRACE_LOADED_OBJECTS: "1"'),
        r"launch.env.LD_TRACE_LOADED_OBJECTS: the dynamic loader \(ld.so\) reads it",
        line=ENV_LINE + 1,
    ),
    Case(
        "pythonpath-in-env",
        add_env("PYTHONPATH: /models/tiny-qwen3-moe"),
        r"launch.env.PYTHONPATH: its folders come first",
        line=ENV_LINE + 1,
    ),
    Case("pythonhome-in-env", add_env("PYTHONHOME: /tmp"), r"launch.env.PYTHONHOME: ", line=ENV_LINE + 1),
    Case("pythonstartup-in-env", add_env("PYTHONSTARTUP: /tmp/x.py"), r"launch.env.PYTHONSTARTUP: ", line=ENV_LINE + 1),
    Case(
        "bash-env-in-env",
        add_env("BASH_ENV: /tmp/x.sh"),
        r"launch.env.BASH_ENV: every non-interactive bash",
        line=ENV_LINE + 1,
    ),
    Case("path-in-env", add_env("PATH: /tmp:/usr/bin"), r"launch.env.PATH: it decides which `vllm`", line=ENV_LINE + 1),
    Case("lowercase-ld-preload-is-not-the-loaders", add_env("ld_preload: /tmp/x.so"), code=0),
    Case(
        "ld-preload-allowed-with-reason",
        add_env(
            "LD_PRELOAD: /usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
            allow="LD_PRELOAD: jemalloc instead of tcmalloc, measured in docs/x.md",
        ),
        code=0,
    ),
    Case(
        "allowance-without-reason",
        add_env("LD_PRELOAD: /tmp/x.so", allow='LD_PRELOAD: "  "'),
        r"launch.allow_unsafe_env.LD_PRELOAD: must say why the variable is needed",
        line=ENV_LINE + 3,
    ),
    Case(
        "allowance-with-newline-reason",
        add_env("LD_PRELOAD: /tmp/x.so", allow='LD_PRELOAD: "ok\\nRUN x"'),
        r"launch.allow_unsafe_env.LD_PRELOAD: control character U\+000A",
        line=ENV_LINE + 3,
    ),
    Case(
        "allowance-for-a-name-not-set",
        add_env(allow="PYTHONPATH: it used to be needed"),
        r"launch.allow_unsafe_env.PYTHONPATH: allows PYTHONPATH, which launch.env does not set: remove the allowance\n",
        line=ENV_LINE + 2,
    ),
    Case(
        "allowance-for-a-harmless-name",
        add_env(allow="VLLM_CPU_KVCACHE_SPACE: to be safe"),
        r"launch.allow_unsafe_env.VLLM_CPU_KVCACHE_SPACE: VLLM_CPU_KVCACHE_SPACE needs no allowance",
        line=ENV_LINE + 2,
    ),
    Case(
        "allowance-list-of-names",
        add_env("LD_PRELOAD: /tmp/x.so", allow_raw="  allow_unsafe_env: [LD_PRELOAD]\n"),
        r"launch.allow_unsafe_env: must be a valid dictionary",
        line=ENV_LINE + 2,
    ),
    Case(
        "override-env-newline",
        sub('  KILN_DRAFT_TRUNC: "1"\n', '  KILN_DRAFT_TRUNC: "1\\nRUN x"\n', GLM, OVERRIDE),
        r"override.yaml:\d+: env.KILN_DRAFT_TRUNC: control character U\+000A",
        argv=("check", GLM),
    ),
    Case(
        "override-env-bad-name",
        sub('  KILN_DRAFT_TRUNC: "1"\n', '  KILN_DRAFT_TRUNC: "1"\n  "A=B": x\n', GLM, OVERRIDE),
        r"override.yaml:\d+: env\['A=B'\]: must match",
        argv=("check", GLM),
    ),
    Case(
        "override-ld-preload",
        sub('  KILN_DRAFT_TRUNC: "1"\n', '  KILN_DRAFT_TRUNC: "1"\n  LD_PRELOAD: /tmp/x.so\n', GLM, OVERRIDE),
        r"override.yaml:\d+: env.LD_PRELOAD: ld.so loads .* say why under allow_unsafe_env: \{LD_PRELOAD: REASON\}\n",
        argv=("check", GLM),
    ),
    Case(
        "override-ld-preload-allowed",
        both(
            sub('  KILN_DRAFT_TRUNC: "1"\n', '  KILN_DRAFT_TRUNC: "1"\n  LD_PRELOAD: /tmp/x.so\n', GLM, OVERRIDE),
            append("allow_unsafe_env:\n  LD_PRELOAD: the feature's own allocator\n", GLM, OVERRIDE),
        ),
        code=0,
        argv=("check", GLM),
    ),
    # speculative decoding's draft count: vLLM's config classes bound it only with a model
    # (draft_bounds.py); vLLM's own checks of the other numbers run in the engine image
    Case(
        "num-speculative-tokens-100000",
        sub("    num_speculative_tokens: 3\n", "    num_speculative_tokens: 100000\n"),
        r"launch.speculative_config.num_speculative_tokens: 100000 draft tokens per step: vLLM's rejection sampler "
        r"takes at most 128 \(MAX_SPEC_LEN",
        line=line_of("    num_speculative_tokens"),
    ),
    Case(
        "num-speculative-tokens-129",
        sub("    num_speculative_tokens: 3\n", "    num_speculative_tokens: 129\n"),
        r"num_speculative_tokens: 129 draft tokens per step",
    ),
    Case(
        "num-speculative-tokens-128-is-fine",
        sub("    num_speculative_tokens: 3\n", "    num_speculative_tokens: 128\n"),
        code=0,
    ),
    Case(
        "num-speculative-tokens-past-max-model-len",
        both(
            sub("    max-model-len: 512\n", "    max-model-len: 16\n"),
            sub("    num_speculative_tokens: 3\n", "    num_speculative_tokens: 16\n"),
        ),
        r"num_speculative_tokens: 16 draft tokens per step, but launch.args.max-model-len is 16: .* at most 15 drafts",
        line=line_of("    num_speculative_tokens"),
    ),
    Case(
        "num-speculative-tokens-below-max-model-len-is-fine",
        both(
            sub("    max-model-len: 512\n", "    max-model-len: 16\n"),
            sub("    num_speculative_tokens: 3\n", "    num_speculative_tokens: 15\n"),
        ),
        code=0,
    ),
    Case(
        "dynamic-schedule-is-fine",
        spec_line("num_speculative_tokens_per_batch_size: [[1, 4, 3], [5, 8, 2], [9, 64, 1]]"),
        code=0,
    ),
    Case(
        "dynamic-schedule-block-lists-are-fine",
        spec_line("num_speculative_tokens_per_batch_size:\n      - [1, 4, 3]\n      - [5, 1024, 0]"),
        code=0,
    ),
    Case(
        "dynamic-schedule-entry-above-num-speculative-tokens",
        spec_line("num_speculative_tokens_per_batch_size:\n      - [1, 4, 3]\n      - [5, 8, 5]"),
        r"launch.speculative_config.num_speculative_tokens_per_batch_size\[1\]: asks for 5 drafts, more than "
        r"num_speculative_tokens \(3\): vLLM lowers each entry",
        line=line_of("    num_speculative_tokens") + 3,
    ),
    Case(
        "dynamic-schedule-entry-100000-without-count",
        both(
            sub("    num_speculative_tokens: 3\n", ""),
            sub(
                "    method: draft_model\n",
                "    method: draft_model\n    num_speculative_tokens_per_batch_size: [[1, 8, 100000]]\n",
            ),
        ),
        r"num_speculative_tokens_per_batch_size\[0\]: 100000 draft tokens per step",
    ),
    # the same refusals through show and build (they load recipes the same way)
    Case("show-alias-bomb", put(BOMB_PREFIX + alias_bomb()), r"YAML alias \*l0", argv=("show", TINY), line=3),
    Case("build-alias-bomb", put(BOMB_PREFIX + alias_bomb()), r"YAML alias \*l0", argv=("build", TINY), line=3),
    Case(
        "build-symlink-outside",
        symlink(f"recipes/{TINY}/config.json", outside_file()),
        r"symlink to",
        argv=("build", TINY),
    ),
    Case("show-non-utf8", sub("  max_tokens: 16\n", b"  max_tokens: 16 # \xff\n"), r"not UTF-8", argv=("show", TINY)),
]
