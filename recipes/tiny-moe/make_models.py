#!/usr/bin/env python3
"""Generate tiny random-weight models for the tiny-moe recipe, offline and seeded.

Writes, under OUT (default /models):
  tiny-qwen3moe     Qwen3MoeForCausalLM: 4 layers, hidden 128, 8 experts top-2
  tiny-qwen3-draft  Qwen3ForCausalLM: 1 layer, hidden 64 (draft model, same tokenizer)

The tokenizer is a byte-level BPE trained on the Python standard library sources that
ship with the image, so nothing is downloaded. Same seed, same weights.
"""

from __future__ import annotations

import glob
import os
import stat
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3MoeConfig,
)

SEED = 1234
VOCAB = 1024
SPECIAL = {"pad": "<|endoftext|>", "bos": "<|im_start|>", "eos": "<|im_end|>"}
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def corpus() -> list[str]:
    files = sorted(glob.glob("/usr/lib/python3*/[a-z]*.py"))[:150]
    if not files:
        sys.exit("make_models: no training text found under /usr/lib/python3*")
    return files


def tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train(corpus(), trainers.BpeTrainer(
        vocab_size=VOCAB, min_frequency=2, special_tokens=list(SPECIAL.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=SPECIAL["eos"], pad_token=SPECIAL["pad"],
        model_max_length=2048)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def common(tok) -> dict:
    return dict(
        vocab_size=VOCAB, max_position_embeddings=2048, rms_norm_eps=1e-6,
        tie_word_embeddings=False, bos_token_id=None,
        eos_token_id=tok.convert_tokens_to_ids(SPECIAL["eos"]),
        pad_token_id=tok.convert_tokens_to_ids(SPECIAL["pad"]),
    )


def save(config, tok, path: str) -> None:
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, do_sample=False)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    # transformers may write 0600 files; the serving user is not root
    for root, _, names in os.walk(path):
        for name in names:
            os.chmod(os.path.join(root, name), stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IROTH)
    params = sum(p.numel() for p in model.parameters())
    print(f"{path}: {type(model).__name__}, {params / 1e6:.2f}M params, vocab {len(tok)}")


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "/models"
    os.makedirs(out, exist_ok=True)
    tok = tokenizer()
    base = common(tok)
    moe = Qwen3MoeConfig(
        hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, moe_intermediate_size=64, num_experts=8,
        num_experts_per_tok=2, decoder_sparse_step=1, norm_topk_prob=True, mlp_only_layers=[],
        **base)
    draft = Qwen3Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, **base)
    save(moe, tok, f"{out}/tiny-qwen3moe")
    save(draft, tok, f"{out}/tiny-qwen3-draft")


if __name__ == "__main__":
    main()
