#!/usr/bin/env python3
"""Generate a tiny random-weight MoE target and a draft model that agrees with it.

Writes, under OUT (default /models):
  tiny-qwen3moe     Qwen3MoeForCausalLM: 4 layers, hidden 128, 8 experts top-2
  tiny-qwen3-draft  Qwen3ForCausalLM: 1 layer, hidden 128 (draft model, same tokenizer)

How the draft comes to agree (the draft is a cheap, noisy copy of the target's first
layer, and the target is built so that its first layer decides most of the output):
- the target's layer-0 experts are one base expert plus small per-expert deviations
  (`--expert-spread`, x each matrix's std), so with normalized top-k weights layer 0's
  MoE is close to that base expert while routing still matters;
- layers 1.. write into the residual stream scaled by `--damp` (their attention output
  and expert down projections), so they nudge the logits instead of deciding them;
- the draft copies the target's embedding, layer-0 attention and norms, final norm and
  head, with the base expert as its dense MLP, then every matrix gets Gaussian noise of
  `--draft-noise` x its own std. More noise, less agreement.
At the end it prints the greedy next-token agreement of draft and target on random
token sequences, and replays greedy speculative decoding (`--spec-tokens` drafts per
window, short code prompts) the way vLLM runs it: the acceptance per draft position and
overall (accepted / proposed draft tokens) match what a server's
vllm:spec_decode_* counters report for the same models (benchmarks/spec_acceptance.py).
The tokenizer is a byte-level BPE trained on the Python standard library sources that
ship with the image, so nothing is downloaded. Same arguments, same weights.
"""

from __future__ import annotations

import argparse
import glob
import os
import stat
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The same bytes on every build machine, not only on this one: reductions (std, matmul)
# are chunked by thread count, and ATen's AVX2/AVX-512 kernels sum in other orders than
# its baseline ones, so one thread and the baseline kernels; set before torch loads.
os.environ["ATEN_CPU_CAPABILITY"] = "default"
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["RAYON_NUM_THREADS"] = "1"  # the tokenizer's BPE trainer

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3MoeConfig,
)

SEED = 1234
VOCAB = 1024
HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 128, 4, 2, 32
EXPERT_DIM = 64
# short code and prose fragments like the e2e test's prompts (tests/twinserve.py)
PROMPT_HEADS = ["def ", "class ", "import ", "for ", "while ", "return ", "if ", "with "]
PROMPT_WORDS = [
    "fibonacci(n):",
    "parse buffer",
    "socket path",
    "the quick brown fox",
    "value = result",
    "config.token",
    "stream header",
    "count index",
]
PROMPTS = [h + w for i, h in enumerate(PROMPT_HEADS) for w in PROMPT_WORDS[i % 2 :: 2]]  # 32 prompts
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
    tok.train(
        corpus(),
        trainers.BpeTrainer(
            vocab_size=VOCAB,
            min_frequency=2,
            special_tokens=list(SPECIAL.values()),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=SPECIAL["eos"], pad_token=SPECIAL["pad"], model_max_length=2048
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def common(tok: PreTrainedTokenizerFast) -> dict[str, object]:
    return dict(
        vocab_size=VOCAB,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=None,
        hidden_size=HIDDEN,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        eos_token_id=tok.convert_tokens_to_ids(SPECIAL["eos"]),
        pad_token_id=tok.convert_tokens_to_ids(SPECIAL["pad"]),
    )


def jitter(weight: torch.Tensor, scale: float, gen: torch.Generator) -> torch.Tensor:
    """weight + N(0, (scale * std(weight))^2), elementwise."""
    if scale == 0 or weight.numel() < 2:
        return weight.clone()
    noise = torch.randn(weight.shape, generator=gen, dtype=weight.dtype)
    return weight + noise * (scale * weight.std())


@torch.no_grad()
def shape_target(target: PreTrainedModel, spread: float, damp: float, gen: torch.Generator) -> None:
    layers = target.model.layers
    experts = layers[0].mlp.experts
    for name in ("gate_up_proj", "down_proj"):
        stacked = getattr(experts, name)
        base = stacked[0].clone()
        for e in range(stacked.shape[0]):
            stacked[e] = jitter(base, spread, gen)
        stacked[0] = base  # the base expert itself stays exact: the draft's MLP
    for layer in layers[1:]:
        layer.self_attn.o_proj.weight.mul_(damp)
        layer.mlp.experts.down_proj.mul_(damp)


@torch.no_grad()
def draft_from(target: PreTrainedModel, draft: PreTrainedModel, noise: float, gen: torch.Generator) -> None:
    """Copy the target's layer 0 (base expert as the dense MLP) into the draft, + noise."""
    t0, d0 = target.model.layers[0], draft.model.layers[0]
    gate_up = t0.mlp.experts.gate_up_proj[0]  # [2 * EXPERT_DIM, HIDDEN]: gate rows, then up rows
    pairs = [
        (draft.model.embed_tokens.weight, target.model.embed_tokens.weight),
        (draft.model.norm.weight, target.model.norm.weight),
        (draft.lm_head.weight, target.lm_head.weight),
        (d0.input_layernorm.weight, t0.input_layernorm.weight),
        (d0.post_attention_layernorm.weight, t0.post_attention_layernorm.weight),
        (d0.mlp.gate_proj.weight, gate_up[:EXPERT_DIM]),
        (d0.mlp.up_proj.weight, gate_up[EXPERT_DIM:]),
        (d0.mlp.down_proj.weight, t0.mlp.experts.down_proj[0]),
    ]
    for name in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"):
        pairs.append((getattr(d0.self_attn, name).weight, getattr(t0.self_attn, name).weight))
    for dst, src in pairs:
        assert dst.shape == src.shape, (dst.shape, src.shape)  # a copy of a wrong shape is a bug here  # noqa: S101
        # norms (vectors) stay exact: noise there rescales everything after them
        dst.copy_(jitter(src, noise, gen) if src.dim() > 1 else src)


@torch.no_grad()
def agreement(
    target: PreTrainedModel, draft: PreTrainedModel, gen: torch.Generator, seqs: int = 32, length: int = 24
) -> float:
    """Teacher-forced greedy next-token agreement on random token sequences."""
    ids = torch.randint(3, VOCAB, (seqs, length), generator=gen)
    t = target(input_ids=ids).logits.argmax(-1)
    d = draft(input_ids=ids).logits.argmax(-1)
    return float((t == d).float().mean().item())


@torch.no_grad()
def speculate(
    target: PreTrainedModel, draft: PreTrainedModel, tok: PreTrainedTokenizerFast, k: int, tokens: int = 32
) -> list[float]:
    """Greedy draft-model speculative decoding, replayed as a server runs it: after the
    prompt's first token, the draft proposes k tokens, the target keeps the agreeing
    prefix plus its own next token. Greedy, the output is the target's own greedy text,
    and draft i only counts when drafts < i matched it, so the draft's inputs are that
    text too: one teacher-forced draft pass over it decides every window. Returns, per
    draft position, the share of windows accepting it (vLLM's
    spec_decode_num_accepted_tokens_per_pos / num_drafts); their mean is vLLM's
    acceptance rate (accepted / proposed draft tokens)."""
    accepted, windows = [0] * k, 0
    for prompt in PROMPTS:
        ids = tok(prompt, return_tensors="pt").input_ids
        start, end = ids.shape[1] + 1, ids.shape[1] + tokens
        text = target.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
        )
        guess = draft(input_ids=text).logits[0].argmax(-1)
        hit = (guess[:-1] == text[0, 1:]).tolist()  # hit[j]: the draft predicts token j + 1
        t = start
        while t < end:
            n = min(k, end - t - 1)
            agree = 0
            while agree < n and hit[t + agree - 1]:
                agree += 1
            if n == k:  # vLLM counts full windows; a shorter last one hardly matters
                windows += 1
                for i in range(agree):
                    accepted[i] += 1
            t += agree + 1
    return [a / windows for a in accepted]


def save(model: PreTrainedModel, tok: PreTrainedTokenizerFast, path: str, dtype: torch.dtype) -> None:
    model = model.to(dtype)
    cfg = model.config
    model.generation_config = GenerationConfig(
        eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id, do_sample=False
    )
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    # transformers may write 0600 files; the serving user is not root
    for root, _, names in os.walk(path):
        for name in names:
            os.chmod(os.path.join(root, name), stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IROTH)
    params = sum(p.numel() for p in model.parameters())
    print(f"{path}: {type(model).__name__}, {params / 1e6:.2f}M params, {dtype}, vocab {len(tok)}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", default="/models")
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    p.add_argument("--draft-noise", type=float, default=0.05, help="x each draft matrix's std")
    p.add_argument("--expert-spread", type=float, default=0.05, help="x each layer-0 expert matrix's std")
    p.add_argument("--damp", type=float, default=0.02, help="scale of layers 1..'s residual writes")
    p.add_argument("--spec-tokens", type=int, default=4, help="draft tokens per window, for the report")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    tok = tokenizer()
    base = common(tok)
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    target = AutoModelForCausalLM.from_config(
        Qwen3MoeConfig(
            intermediate_size=256,
            num_hidden_layers=4,
            moe_intermediate_size=EXPERT_DIM,
            num_experts=8,
            num_experts_per_tok=2,
            decoder_sparse_step=1,
            norm_topk_prob=True,
            mlp_only_layers=[],
            **base,
        )
    )
    draft = AutoModelForCausalLM.from_config(Qwen3Config(intermediate_size=EXPERT_DIM, num_hidden_layers=1, **base))
    shape_target(target, args.expert_spread, args.damp, gen)
    draft_from(target, draft, args.draft_noise, gen)
    dtype = getattr(torch, args.dtype)
    target, draft = target.to(dtype).eval(), draft.to(dtype).eval()
    rate = agreement(target, draft, gen)
    per_pos = speculate(target, draft, tok, args.spec_tokens)
    save(target, tok, f"{args.out}/tiny-qwen3moe", dtype)
    save(draft, tok, f"{args.out}/tiny-qwen3-draft", dtype)
    print(
        f"greedy next-token agreement draft vs target: {rate:.2f} "
        f"(draft noise {args.draft_noise}, expert spread {args.expert_spread}, damp {args.damp})"
    )
    print(
        f"greedy speculative decoding, {args.spec_tokens} draft tokens: acceptance "
        f"{sum(per_pos) / len(per_pos):.2f} (accepted / proposed), per position "
        f"{' '.join(f'{x:.2f}' for x in per_pos)}"
    )


if __name__ == "__main__":
    main()
