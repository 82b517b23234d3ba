"""The plugin's scorer text for a chat prompt: its last user message, found through the chat template."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from headway.integrations._server import headway_src_dir
from headway.integrations.vllm._chat import ChatMarkers, chat_markers

pytest.importorskip("transformers")

SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>"]
LLAMA3 = (
    "{{ '<|begin_of_text|>' }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
ZEPHYR = (  # the tiny test Llama's (scripts/make_tiny_llama.py): markers in plain text
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
NO_SYSTEM = (  # refuses a system message, as some templates do: the probes use none
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
    "[{{ m['role'] }}] {{ m['content'] }} [/{{ m['role'] }}]{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)
CONVERSATION = [
    {"role": "system", "content": "You are the shop's assistant. Follow every rule below. " * 20},
    {"role": "user", "content": "Write an essay on rivers."},
    {"role": "assistant", "content": "Rivers shape the land they cross ..."},
    {"role": "user", "content": "Now a haiku,\nplease: about the sea."},
]


def tokenizer(template: str | None) -> Any:
    """A byte-level BPE tokenizer (trained here on a few lines) with the special tokens above."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([m["content"] for m in CONVERSATION] * 3, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, additional_special_tokens=SPECIAL)
    fast.chat_template = template
    return fast


@pytest.mark.parametrize(
    ("template", "opening", "closing"),
    [
        (
            LLAMA3,
            "<|start_header_id|>user<|end_header_id|>\n\n",
            "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
        ),
        (CHATML, "<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"),
        (ZEPHYR, "<|user|>\n", "\n<|assistant|>\n"),
    ],
    ids=["llama3", "chatml", "zephyr"],
)
def test_markers_find_the_last_user_message_of_a_rendered_chat(template: str, opening: str, closing: str) -> None:
    tok = tokenizer(template)
    markers = chat_markers(tok)
    # the opening is what every user message's header ends with (Llama 3's also takes the "|>" that
    # ends whatever comes before a header)
    assert markers is not None and markers.opening.endswith(opening) and markers.closing == closing
    rendered = tok.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    # the plugin decodes the engine's token ids keeping the special tokens (the markers may be some)
    ids = tok(rendered, add_special_tokens=False)["input_ids"]
    kept = tok.backend_tokenizer.decode(ids, skip_special_tokens=False)
    assert kept == rendered
    assert markers.query(kept) == CONVERSATION[-1]["content"]
    assert (
        markers.query(tok.apply_chat_template(CONVERSATION[:2], tokenize=False, add_generation_prompt=True))
        == (CONVERSATION[1]["content"])
    )
    # not a chat prompt awaiting an answer: no query (the plugin scores the whole prompt, as before)
    assert markers.query("Once upon a time") is None
    assert markers.query(tok.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=False)) is None


@pytest.mark.parametrize("template", [LLAMA3, CHATML, ZEPHYR], ids=["llama3", "chatml", "zephyr"])
def test_a_blank_last_user_message_is_scored_blank_as_the_gateway_scores_it(template: str) -> None:
    """The gateway scores a chat request's last user message as it is, blank or not; the plugin fell
    back to the whole rendered prompt when the message was blank, which scored the template's text and
    the system prompt instead (-1.99 with the tiny Llama's template against the gateway's -2.06, the
    shipped predictor on a system prompt and an empty message)."""
    tok = tokenizer(template)
    markers = chat_markers(tok)
    assert markers is not None
    for blank in ("", "  \n "):
        chat = [*CONVERSATION[:-1], {"role": "user", "content": blank}]
        rendered = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        assert markers.query(rendered) == blank


def test_special_token_markers_are_lost_when_decoding_skips_them() -> None:
    """Why the plugin decodes with the special tokens kept when the template has markers."""
    tok = tokenizer(LLAMA3)
    markers = chat_markers(tok)
    assert markers is not None
    ids = tok.apply_chat_template(CONVERSATION, tokenize=True, add_generation_prompt=True, return_dict=False)
    assert markers.query(tok.backend_tokenizer.decode(list(ids), skip_special_tokens=True)) is None


def test_no_template_or_one_without_clear_markers_scores_whole_prompts() -> None:
    assert chat_markers(tokenizer(None)) is None
    # a user message that renders nothing around its content: no opening to find
    assert chat_markers(tokenizer("{% for m in messages %}{{ m['content'] }}{% endfor %}")) is None
    broken = tokenizer("{{ raise_exception('this template takes no messages') }}")
    assert chat_markers(broken) is None
    markers = chat_markers(tokenizer(NO_SYSTEM))
    assert markers == ChatMarkers("[user] ", " [/user][assistant] ")


def test_the_plugin_decodes_a_chat_prompt_to_its_last_user_message(vllm_paths: tuple[Path, Path]) -> None:
    """``HeadwayScheduler._hw_decode`` in vLLM's venv on the tiny Llama's tokenizer and template: a chat
    prompt with a long system prompt scores its last user message; a plain prompt scores whole."""
    python, model = vllm_paths
    code = textwrap.dedent(f"""
        import types
        from transformers import AutoTokenizer
        from headway.integrations.vllm import HeadwayScheduler
        tok = AutoTokenizer.from_pretrained({str(model)!r})
        chat = [{{"role": "system", "content": "Rules. " * 200}}, {{"role": "user", "content": "Name a color."}}]
        ids = tok.apply_chat_template(chat, tokenize=True, add_generation_prompt=True, return_dict=False)
        plain = tok("Once upon a time", add_special_tokens=False)["input_ids"]
        me = types.SimpleNamespace(_hw_tokenizer=None, _hw_tokenizer_path={str(model)!r}, _hw_chat=None)
        print(repr(HeadwayScheduler._hw_decode(me, [list(ids), plain])))
    """)
    env = {**os.environ, "PYTHONPATH": str(headway_src_dir())}
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=env, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == repr(["Name a color.", "Once upon a time"])
