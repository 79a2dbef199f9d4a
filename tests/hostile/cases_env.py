"""The hostile-recipe corpus, part two: env a recipe or override hands the server,
speculative decoding's draft count, and the same refusals through show and build."""

from __future__ import annotations

from recipe_edits import (
    BOMB_PREFIX,
    ENV_LINE,
    GLM,
    OVERRIDE,
    TINY,
    Case,
    add_env,
    alias_bomb,
    append,
    both,
    line_of,
    outside_file,
    put,
    spec_line,
    sub,
    symlink,
)

ENV_CASES: list[Case] = [
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
