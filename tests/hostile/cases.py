"""The hostile-recipe corpus: each case breaks a copy of the shipped recipes in one way
and says what `kiln` must answer (exit code, the error it must name, its line). The
recipe edits are in recipe_edits.py; env, draft-count and show/build cases in cases_env.py."""

from __future__ import annotations

from cases_env import ENV_CASES
from recipe_edits import (
    BOMB_PREFIX,
    GLM,
    OVERLAY,
    TINY,
    Case,
    alias_bomb,
    append,
    both,
    deep_block,
    deep_flow,
    fifo,
    line_of,
    loop_links,
    many_files,
    nothing,
    outside_copy_of_recipe,
    outside_file,
    outside_recipe_folder,
    put,
    recipe_outside_recipes,
    rfile,
    sparse,
    sub,
    symlink,
    text,
)

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
    *ENV_CASES,
]
