"""Build a tiny random-weight Llama and a BPE tokenizer for tests and benchmarks.

Nothing is downloaded: the tokenizer is trained with ``tokenizers`` on local text (the
alpaca_eval instructions when present, generated text otherwise) and the weights are
random (seeded). Hidden size 128 with 2 heads of dim 64 (vLLM's CPU attention rejects
head dim 16). Idempotent: an existing, complete model directory is left alone.

Usage: python scripts/make_tiny_llama.py --out DIR [--force]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

STAMP = "headway-tiny-llama.json"
VERSION = 1
# the shared data folder as headway finds it: $HEADWAY_DATA_DIR, else ../shared/data beside the checkout
DEFAULT_TEXT = (
    Path(os.environ.get("HEADWAY_DATA_DIR") or Path(__file__).resolve().parents[2] / "shared" / "data")
    / "alpaca_eval"
    / "instructions.jsonl"
)
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def corpus(text_path: Path) -> list[str]:
    lines: list[str] = []
    if text_path.is_file():
        with text_path.open(encoding="utf-8") as fh:
            for line in fh:
                try:
                    lines.append(str(json.loads(line)["instruction"]))
                except (ValueError, KeyError):
                    continue
    if len(lines) < 100:  # generated fallback text
        print(f"[tiny-llama] {text_path} has no instructions: training the tokenizer on generated text")
        rng = random.Random(0)
        words = [
            "the",
            "a",
            "of",
            "to",
            "and",
            "in",
            "is",
            "for",
            "on",
            "with",
            "that",
            "as",
            "by",
            "this",
            "be",
            "are",
            "from",
            "at",
            "or",
            "an",
            "it",
            "model",
            "request",
            "token",
            "queue",
            "short",
            "long",
            "work",
            "schedule",
            "latency",
            "server",
            "write",
            "explain",
            "list",
            "summarize",
            "story",
            "poem",
            "code",
            "python",
            "function",
            "data",
            "answer",
            "question",
            "why",
            "how",
            "what",
        ]
        lines += [" ".join(rng.choice(words) for _ in range(rng.randint(5, 40))) for _ in range(3000)]
    return lines


def build(out: Path, text_path: Path, vocab_size: int, seed: int) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(text_path), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 4096

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    fast.save_pretrained(out)
    (out / STAMP).write_text(json.dumps({"version": VERSION, "seed": seed, "vocab_size": vocab_size}))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="output model directory")
    ap.add_argument("--text", type=Path, default=DEFAULT_TEXT, help="JSONL with an 'instruction' field")
    ap.add_argument("--vocab-size", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="rebuild even if the model exists")
    args = ap.parse_args(argv)
    stamp = args.out / STAMP
    if not args.force and stamp.is_file():
        try:
            if json.loads(stamp.read_text()).get("version") == VERSION:
                print(f"[tiny-llama] up to date: {args.out}")
                return 0
        except ValueError:
            pass
    build(args.out, args.text, args.vocab_size, args.seed)
    print(f"[tiny-llama] built {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
