"""The gateway's optional tokenizer (``--tokenizer``, vLLM's name for it): a completions prompt of token
ids decoded into the text the scorer reads, as the vLLM plugin decodes an engine request's ids.

Used for nothing else: the request still goes upstream byte for byte, and its token count is the
number of ids it holds. Loaded from a local directory or the local Hugging Face cache only, through
``transformers.AutoTokenizer`` (the ``predict`` extra); nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from headway.predict.score import MAX_CHARS_PER_TOKEN, scoring_text

__all__ = ["PromptDecoder", "load_tokenizer"]


def load_tokenizer(name: str) -> Any:
    """``transformers.AutoTokenizer.from_pretrained(name)`` from local files only (a directory, or a
    model already in the Hugging Face cache); :class:`ValueError` saying why not (its message starts
    with ``tokenizer``, the setting's name)."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ValueError(
            f"tokenizer {name!r} is loaded with transformers, which is not installed: pip install 'headway[predict]'"
        ) from None
    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=True)
    except Exception as exc:
        why = (
            ": the directory holds no tokenizer that transformers loads"
            if Path(name).is_dir()
            else " is neither a directory nor a model in the local Hugging Face cache (nothing is downloaded)"
        )
        raise ValueError(f"tokenizer {name!r}{why}: {type(exc).__name__}: {exc}") from None


class PromptDecoder:
    """Decodes a prompt of token ids (or the prompts of a list) into the text the scorer reads of it
    (``max_length`` tokens' worth: :func:`~headway.predict.score.scoring_text`), as the vLLM plugin
    decodes a completions prompt (``HeadwayScheduler._hw_decode``): each prompt's first
    ``max_length * MAX_CHARS_PER_TOKEN`` ids (a token is at least a character, but for byte pieces and
    special tokens), special tokens skipped, by the Rust tokenizer's batch decode when it has one. The
    prompts of a list are joined by newlines, as a list of text prompts is. A few milliseconds for a
    window of 16,384 ids: call it off the event loop."""

    def __init__(self, name: str, max_length: int) -> None:
        self.name = name
        self.max_length = max_length
        tok = load_tokenizer(name)
        self._tok = getattr(tok, "backend_tokenizer", None) or tok  # (the Rust tokenizer, as the plugin)

    def __call__(self, prompts: Sequence[Sequence[int]]) -> str:
        room = self.max_length * MAX_CHARS_PER_TOKEN
        heads: list[list[int]] = []
        for ids in prompts:
            if room <= 0:
                break
            heads.append(list(ids[:room]))
            room -= len(heads[-1])
        tok = self._tok
        decode = tok.decode_batch if hasattr(tok, "decode_batch") else tok.batch_decode
        texts = decode(heads, skip_special_tokens=True) if heads else []
        return scoring_text("\n".join(map(str, texts)), self.max_length)
