"""The text a length predictor reads of a prompt (:func:`scoring_text`): shared by every scorer and
front end (the simulator's, the gateway's and the vLLM plugin's), so that one prompt gets one score."""

from __future__ import annotations

import re

__all__ = ["MAX_CHARS_PER_TOKEN", "scoring_text"]

MAX_CHARS_PER_TOKEN = 32
"""The scorer reads at most ``max_length * MAX_CHARS_PER_TOKEN`` characters of a prompt: the
tokenizer keeps ``max_length`` tokens anyway, but tokenizes the whole text first, so the cost would
grow with the prompt (a megabyte-long prompt took over a second). A WordPiece token spans a few characters (a word
over 100 characters is one ``[UNK]``), so the prefix holds the tokens kept unless the prompt is
mostly whitespace."""

_SURROGATE = re.compile("[\ud800-\udfff]")


def scoring_text(prompt: str, max_length: int) -> str:
    """The part of ``prompt`` the scorer reads: its first ``max_length * MAX_CHARS_PER_TOKEN``
    characters, each lone surrogate (JSON ``"\\ud800"``, which the tokenizer refuses: no UTF-8
    text holds one) replaced by U+FFFD, as a UTF-8 decoder replaces an invalid sequence."""
    return _SURROGATE.sub("\ufffd", prompt[: max_length * MAX_CHARS_PER_TOKEN])
