"""vLLM's own request validation for ``/v1/completions`` and ``/v1/chat/completions``, with no model.

Runs in the vLLM virtualenv; ``test_vllm_protocol.py`` (main virtualenv) starts it once and sends
it request bodies over a pipe, one JSON object a line each way::

    python _vllm_protocol.py        # then: {"chat": bool, "raw": "<the body, latin-1>"} per line

The reply: ``{"status": int, "body": <vLLM's JSON answer>}``; 200 with ``{"ok": true, "read": {...}}``
when vLLM takes the request to its engine, ``read`` holding what vLLM read of the fields the gateway
reads too (``stream``, ``stream_options.include_usage``, the ``max_tokens`` asked for, ``n``,
``priority``, the number of prompts).

A FastAPI app declares the two routes as vLLM 0.32's own routers do (the request model as the
body, ``validate_json_request``) with vLLM's exception handlers (``init_exception_handler``), so
the JSON decoding, pydantic's validation (lax mode, vLLM's ``model_validator`` s) and the turning of
each error into a status and an ``ErrorResponse`` are vLLM's own code. The route then runs what
vLLM's serving code checks of a request before it reaches the engine and needs no model:
``stream`` with ``use_beam_search`` (completions), ``build_tok_params`` (``TokenizeParams``'s
checks), ``get_max_tokens`` and ``to_sampling_params`` / ``to_beam_search_params``
(``SamplingParams._verify_args``), each error answered by vLLM's ``create_error_response``.
The stand-in model has a context of :data:`MAX_MODEL_LEN` tokens and each prompt counts one.

Not run (they need the model, its tokenizer or a running engine): the served model's name
(``_check_model``, 404), rendering (the chat template, tokenization, token ids past the
vocabulary, prompt length, multimodal inputs, ``--enable-prompt-embeds``) and admission control.
A body accepted here may still be refused by a real server for one of those; one refused here is
refused by every vLLM 0.32.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from argparse import Namespace
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
warnings.simplefilter("ignore")  # (the deprecated max_tokens of chat, read here as vLLM reads it)

from fastapi import Depends, FastAPI, Request  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest  # noqa: E402
from vllm.entrypoints.openai.completion.protocol import CompletionRequest  # noqa: E402
from vllm.entrypoints.serve.exception_handling.error_response import create_error_response  # noqa: E402
from vllm.entrypoints.serve.exception_handling.register import init_exception_handler  # noqa: E402
from vllm.entrypoints.serve.utils.api_utils import get_max_tokens, validate_json_request  # noqa: E402
from vllm.renderers.inputs.preprocess import prompt_to_seq  # noqa: E402

MAX_MODEL_LEN = 1 << 20
"""The stand-in model's context: a 1M-token model, so that no realistic ``max_tokens`` is refused
for the model's sake."""


class _ModelConfig:
    max_model_len = MAX_MODEL_LEN


def _error(exc: Exception) -> JSONResponse:
    err = create_error_response(exc)
    return JSONResponse(err.model_dump(), status_code=err.error.code)


def _read(request: CompletionRequest | ChatCompletionRequest, requested: int | None) -> dict[str, Any]:
    """What vLLM read of the fields the gateway reads too."""
    opts = request.stream_options
    prompts = 1
    if isinstance(request, CompletionRequest):  # as OnlineRenderer.preprocess_completion lists them
        prompts = sum(len(prompt_to_seq(p)) for p in (request.prompt_embeds, request.prompt) if p is not None)
    return {
        "stream": bool(request.stream),
        "include_usage": bool(opts and opts.include_usage),
        "max_tokens": requested,
        "n": request.n,
        "priority": request.priority,
        "prompts": prompts,
    }


def _admit(request: CompletionRequest | ChatCompletionRequest, requested: int | None) -> JSONResponse:
    try:
        if isinstance(request, CompletionRequest) and request.stream and request.use_beam_search:
            # vLLM's OpenAIServingCompletion._create_completion, before rendering
            raise ValueError("Streaming is not currently supported with beam search")
        request.build_tok_params(_ModelConfig())  # type: ignore[arg-type]
        max_tokens = get_max_tokens(MAX_MODEL_LEN, requested, 1, {}, None, request.truncate_prompt_tokens)
        if request.use_beam_search:
            request.to_beam_search_params(max_tokens, {})
        else:
            request.to_sampling_params(max_tokens, {})
    except Exception as exc:  # vLLM's serving code answers each with create_error_response
        return _error(exc)
    return JSONResponse({"ok": True, "read": _read(request, requested)})


def make_app() -> FastAPI:
    app = FastAPI()
    app.state.args = Namespace(log_error_stack=False)
    init_exception_handler(app)

    @app.post("/v1/completions", dependencies=[Depends(validate_json_request)])
    async def completions(request: CompletionRequest, raw_request: Request) -> JSONResponse:
        return _admit(request, request.max_tokens)  # (16 when none is given: normalize_null_max_tokens)

    @app.post("/v1/chat/completions", dependencies=[Depends(validate_json_request)])
    async def chat(request: ChatCompletionRequest, raw_request: Request) -> JSONResponse:
        requested = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
        return _admit(request, requested)

    return app


def main() -> None:
    client = TestClient(make_app(), raise_server_exceptions=False)
    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        msg: dict[str, Any] = json.loads(line)
        path = "/v1/chat/completions" if msg["chat"] else "/v1/completions"
        r = client.post(path, content=msg["raw"].encode("latin-1"), headers={"Content-Type": "application/json"})
        try:
            body = r.json()
        except ValueError:
            body = {"raw": r.text}
        out.write(json.dumps({"status": r.status_code, "body": body}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
