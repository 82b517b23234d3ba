"""Approximate prefix-cache keys of a prompt's text, for the ``prefix-aware`` router at the gateway.

The gateway has no tokenizer of the served model, so it cannot compute vLLM's block hashes
(chained hashes of 16-token blocks). As llm-d's approximate prefix-cache scorer does, it hashes
the prompt's *text* instead: chained hashes of consecutive blocks of :data:`BLOCK_CHARS`
characters, each hash covering the text up to the end of its block, so two prompts share their
first ``k`` hashes exactly when they share their first ``k`` full blocks of characters. A
trailing partial block is not hashed (vLLM caches full blocks only). For chat requests the text
is the messages' contents in order (the gateway's prompt text: roles and the chat template are
not part of it); prompts given as token ids have no text and get no hashes (``least-tokens``
routing for them).

:data:`BLOCK_CHARS` is 64 characters, which the gateway's length estimate
(:func:`~headway.serve._wire.estimate_tokens`, 4 characters per token) counts as 16 tokens: the
requests' ``hash_block_size``, so that the router's cached-prefix estimate and its load estimate
count the same tokens. The hashes are deterministic (BLAKE2b, 64 bits), the same in every
gateway process.
"""

from __future__ import annotations

import hashlib

__all__ = ["BLOCK_CHARS", "CHARS_PER_TOKEN", "HASH_BLOCK_TOKENS", "MAX_BLOCKS", "prefix_block_hashes"]

CHARS_PER_TOKEN = 4
"""Characters per token of the gateway's prompt-length estimate."""

BLOCK_CHARS = 64
"""Characters per hashed block (llm-d's approximate scorer's default block size)."""

HASH_BLOCK_TOKENS = BLOCK_CHARS // CHARS_PER_TOKEN
"""``hash_block_size`` of the requests given these hashes (16 tokens)."""

MAX_BLOCKS = 2048
"""Blocks hashed at most (128 Ki characters, about 32,000 tokens): a longer prompt's hashes cover its beginning, where
shared prefixes (system prompts, documents, earlier turns) are."""


def prefix_block_hashes(text: str, block_chars: int = BLOCK_CHARS, max_blocks: int = MAX_BLOCKS) -> tuple[int, ...]:
    """Chained 64-bit hashes of the full ``block_chars``-character blocks of ``text`` (at most
    ``max_blocks``): entry ``i`` hashes entry ``i - 1`` and block ``i``'s UTF-8 bytes."""
    if block_chars < 1:
        raise ValueError(f"block_chars must be >= 1, got {block_chars}")
    if max_blocks < 0:
        raise ValueError(f"max_blocks must be >= 0, got {max_blocks}")
    n = min(len(text) // block_chars, max_blocks)
    out: list[int] = []
    prev = b"\0" * 8
    for i in range(n):
        block = text[i * block_chars : (i + 1) * block_chars].encode("utf-8", "surrogatepass")
        prev = hashlib.blake2b(prev + block, digest_size=8).digest()
        out.append(int.from_bytes(prev, "big"))
    return tuple(out)
