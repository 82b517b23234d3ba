"""The gateway's ``--tokenizer``: a completions prompt of token ids is scored on its text, the text the
vLLM plugin decodes from the same ids, and still goes upstream byte for byte."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from harness.vllm import default_vllm_paths
from headway.serve import BackendConfig, GatewayConfig
from headway.serve._config import ConfigError
from headway.serve._intake import Intake
from headway.serve._wire import validate_body

from .conftest import REPO, wait_until

pytest.importorskip("transformers")

_STUB_SCORER = "headway.serve._stub:prompt_length_scores"


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small byte-level BPE tokenizer with a BOS token, saved as ``transformers`` saves one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(["Write a poem about the sea.", "Name a color, then another one."] * 20, trainer=trainer)
    out = tmp_path_factory.mktemp("tokenizer")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>").save_pretrained(out)
    return out


def _encode(tokenizer_dir: Path, text: str) -> list[int]:
    """``text``'s ids after a BOS token (a special token: not decoded)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    return [tok.bos_token_id, *tok(text, add_special_tokens=False)["input_ids"]]


def _intake(tokenizer: str, **kw: object) -> Intake:
    kw.setdefault("scorer", "m:f")  # (Intake loads no scorer)
    return Intake(GatewayConfig(backends=(BackendConfig("http://b"),), tokenizer=tokenizer, **kw), hash_prefixes=False)  # type: ignore[arg-type]


def test_a_prompt_of_token_ids_is_decoded_to_its_text_without_special_tokens(tokenizer_dir: Path) -> None:
    intake = _intake(str(tokenizer_dir))
    poem, color = _encode(tokenizer_dir, "Write a poem about the sea."), _encode(tokenizer_dir, "Name a color.")
    assert intake.token_text(validate_body({"prompt": poem}, chat=False)) == "Write a poem about the sea."
    # a list of prompts: joined by newlines, as a list of text prompts is
    both = validate_body({"prompt": [poem, color]}, chat=False)
    assert intake.token_text(both) == "Write a poem about the sea.\nName a color."
    assert intake.token_text(validate_body({"prompt": "text"}, chat=False)) is None  # (read as text already)
    assert intake.token_text(validate_body({"prompt": []}, chat=False)) is None  # no prompt at all
    # what the scorer reads of a long prompt: its first scorer_max_length * 32 characters, from a
    # bounded window of its ids
    short = _intake(str(tokenizer_dir), scorer="default", scorer_max_length=8)
    long = validate_body({"prompt": poem * 5000}, chat=False)
    assert short.token_text(long) == ("Write a poem about the sea." * 10)[:256]


def test_a_tokenizer_needs_a_scorer_and_must_be_local(tokenizer_dir: Path, tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(ConfigError, match="tokenizer decodes prompts of token ids for the scorer"):
        GatewayConfig(backends=(BackendConfig("http://b"),), tokenizer=str(tokenizer_dir))
    nowhere = r"is neither a directory nor a model in the local Hugging Face cache \(nothing is downloaded\)"
    with pytest.raises(ValueError, match=nowhere):
        _intake(str(tmp_path / "none"))
    with pytest.raises(ValueError, match=nowhere):
        _intake("an-org/a-model-never-downloaded")  # (a hub name: looked up in the local cache only)
    with pytest.raises(ValueError, match="the directory holds no tokenizer that transformers loads"):
        _intake(str(tmp_path))
    monkeypatch.setitem(sys.modules, "transformers", None)  # (not installed)
    with pytest.raises(ValueError, match=r"transformers, which is not installed: pip install 'headway\[predict\]'"):
        _intake(str(tokenizer_dir))


def test_serve_names_the_flag_of_a_tokenizer_it_cannot_load(tmp_path: Path, capsys) -> None:
    from headway.serve._cli import main

    args = ["serve", "--backend", "http://127.0.0.1:9", "--port", "0", "--scorer", _STUB_SCORER]
    assert main([*args, "--tokenizer", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err.startswith(f"headway: error: --tokenizer '{tmp_path / 'none'}' is neither a dir")
    assert main([args[0], *args[1:5], "--tokenizer", str(tmp_path)]) == 2
    assert "headway: error: --tokenizer decodes prompts of token ids for the scorer" in capsys.readouterr().err


@pytest.fixture
def recording_scorer(monkeypatch) -> list[str]:
    """Scorer ``hw_ids_scorer:score``: records each text it scores."""
    seen: list[str] = []

    def score(prompts: list[str]) -> list[float]:
        seen.extend(prompts)
        return [float(len(p)) for p in prompts]

    mod = types.ModuleType("hw_ids_scorer")
    mod.score = score  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "hw_ids_scorer", mod)
    return seen


def test_the_gateway_scores_token_ids_on_their_text_and_forwards_them_as_sent(
    servers, make_gateway, tokenizer_dir: Path, recording_scorer: list[str]
) -> None:
    from headway.serve import serve_in_thread

    from .test_vllm_requests import Recorder

    rec = Recorder()
    backend = servers.enter_context(serve_in_thread(rec.app()))
    ids = _encode(tokenizer_dir, "Name a color.")
    bodies = [
        {"model": "m", "prompt": ids, "max_tokens": 2},
        {"model": "m", "prompt": [ids, [1.0, "2"]]},
        {"model": "m", "prompt": [2**40]},  # no 32-bit id: nothing decoded
    ]
    scored = make_gateway([backend], policy="pars", scorer="hw_ids_scorer:score", tokenizer=str(tokenizer_dir))
    plain = make_gateway([backend], policy="pars", scorer="hw_ids_scorer:score")
    for gw in (scored, plain):
        with gw.client() as c:
            for body in bodies:
                raw = json.dumps(body).encode()
                r = c.post("/v1/completions", content=raw, headers={"Content-Type": "application/json"})
                assert r.status_code == 200, r.text
                assert rec.seen[-1] == raw  # byte for byte
    # (scored in the background: dispatched at once on the fast path)
    wait_until(lambda: len(recording_scorer) == 2 and scored.gateway.num_score_fallbacks == 1, what="the scores")
    assert recording_scorer == ["Name a color.", "Name a color.\n" + _decoded(tokenizer_dir, [1, 2])]
    assert scored.gateway.num_score_fallbacks == 1  # the undecodable one
    assert plain.gateway.num_score_fallbacks == 3  # no tokenizer: nothing to read, as before


def _decoded(tokenizer_dir: Path, ids: list[int]) -> str:
    from transformers import AutoTokenizer

    return str(AutoTokenizer.from_pretrained(tokenizer_dir).decode(ids, skip_special_tokens=True))


# Runs in the vLLM venv: the plugin's scoring of completions prompts of token ids (the tiny Llama's ids
# of each text, as vLLM's completions path tokenizes it), the text each was scored on.
_PLUGIN = """
import json, sys, time, types
sys.path.insert(0, {tests!r})
from transformers import AutoTokenizer
from headway.core import make_policy
from headway.integrations.vllm import HeadwayScheduler, PolicyAdapter
from integrations._fake import FakeRequest
texts = json.load(sys.stdin)
tok = AutoTokenizer.from_pretrained({model!r})
me = types.SimpleNamespace(_hw_tokenizer=None, _hw_tokenizer_path={model!r}, _hw_chat=None)
seen = {{}}
def score(batch):
    return [float(len(t)) for t in batch]
a = PolicyAdapter(make_policy("pars"), score_batch=score, decode=lambda b: HeadwayScheduler._hw_decode(me, b),
                  clock=time.monotonic, epoch=0.0)
q = a.make_queue()
ids = [tok(t)["input_ids"] for t in texts]
for i, x in enumerate(ids):
    q.add_request(FakeRequest(str(i), 0.0, len(x), 16, prompt_token_ids=list(x)))
a.flush()
print(json.dumps({{"ids": ids, "scored": [a.reqs[r].prompt for r in sorted(a.reqs, key=int)]}}))
"""


def test_token_ids_score_as_the_vllm_plugin_scores_them(
    make_stub, make_gateway, vllm_python: Path, recording_scorer: list[str]
) -> None:
    """The same ids (the tiny Llama's, through its tokenizer) give the gateway with ``--tokenizer`` the
    text the plugin scores, so the same score; the plugin's text is the prompt itself here."""
    model = default_vllm_paths(REPO)[1]
    texts = ["Write a poem about the sea.", "  two leading spaces", "\u8bf7\u5199\u4e00\u9996\u8bd7 \U0001f642",
             "NUL\x00 characters", "word " * 20_000]  # fmt: skip
    code = _PLUGIN.format(tests=str(REPO / "tests"), model=str(model))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    out = subprocess.run([str(vllm_python), "-c", textwrap.dedent(code)], input=json.dumps(texts), env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    plugin = json.loads(out.stdout.strip().splitlines()[-1])
    gw = make_gateway([make_stub().url], policy="pars", scorer="hw_ids_scorer:score", tokenizer=str(model))
    with gw.client() as c:
        for ids in plugin["ids"]:  # one at a time: the scorer's record keeps their order
            n = len(recording_scorer)
            assert c.post("/v1/completions", json={"model": "m", "prompt": ids, "max_tokens": 1}).status_code == 200
            wait_until(lambda n=n: len(recording_scorer) > n, what="the prompt scored")
    assert recording_scorer == plugin["scored"]
    assert recording_scorer[:4] == texts[:4] and recording_scorer[4] == texts[4][: 512 * 32]
