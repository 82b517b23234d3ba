"""The last user message of a chat prompt, found through the model's own chat template.

Inside vLLM the scheduler sees a chat request as one prompt: the chat template has already joined
the system prompt, the earlier turns and the last user message. The length predictors are trained on
single user prompts and read the first tokens of their text, so a shared system prompt or an earlier
exchange ahead of the message being answered would fill their window (the gateway scores the last user
message for the same reason: ``benchmarks/results/predictor_chat_input.md``). :func:`chat_markers`
renders the tokenizer's chat template around placeholder messages once, to learn the text that opens
a user message and the text that follows the last one (its end and the generation prompt);
:meth:`ChatMarkers.query` cuts that message out of a rendered prompt, or says it cannot.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

__all__ = ["ChatMarkers", "chat_markers"]

log = logging.getLogger("headway.integrations.vllm")

_MARK = "\u2063HEADWAY-QUERY-{}\u2063"  # placeholder contents no real message holds


@dataclass(frozen=True)
class ChatMarkers:
    """``opening``: the text just before a user message's content, wherever the message is;
    ``closing``: the text after the last user message's content when the prompt asks for the
    assistant's answer (the message's end and the generation prompt)."""

    opening: str
    closing: str

    def query(self, prompt: str) -> str | None:
        """The last user message of a prompt rendered by this template, or None when ``prompt`` does
        not end as such a prompt does (a plain completion prompt, or another template). A blank
        message is returned blank, and scored as a blank prompt, as the gateway scores it: the
        whole prompt in its place would be the template's text around the other messages, which
        the gateway never sees (it scored a system prompt and an empty message -1.99 here, -2.06
        through the gateway)."""
        if not prompt.endswith(self.closing):
            return None
        end = len(prompt) - len(self.closing)
        start = prompt.rfind(self.opening, 0, end)
        if start < 0:
            return None
        return prompt[start + len(self.opening) : end]


def _render(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))


def _common_suffix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return a[len(a) - n :]


def chat_markers(tokenizer: Any) -> ChatMarkers | None:
    """The markers of ``tokenizer``'s chat template, or None when it has none, refuses the placeholder
    conversations (logged), or renders them in a way that gives no unambiguous markers."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    q, a, u = (_MARK.format(i) for i in range(3))
    try:
        alone = _render(tokenizer, [{"role": "user", "content": q}])
        later = _render(
            tokenizer,
            [{"role": "user", "content": u}, {"role": "assistant", "content": a}, {"role": "user", "content": q}],
        )
    except Exception as exc:  # a template may refuse these roles: score the whole prompt, as before
        log.warning("headway: the chat template did not render a test conversation (%s); scoring whole prompts", exc)
        return None
    if alone.count(q) != 1 or later.count(q) != 1 or later.count(a) != 1:
        return None
    closing = alone[alone.index(q) + len(q) :]
    if later[later.index(q) + len(q) :] != closing:
        return None
    # what opens a user message: the text before it both as the first message and after an answer
    opening = _common_suffix(alone[: alone.index(q)], later[later.index(a) + len(a) : later.index(q)])
    if not opening.strip() or not closing:
        return None
    return ChatMarkers(opening, closing)
