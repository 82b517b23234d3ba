"""The gateway takes every request body vLLM takes, differentially against vLLM 0.32's own validation.

Each body of ``_protocol_corpus.corpus()`` goes to vLLM's request validation (``_vllm_protocol.py``,
run in the vLLM virtualenv: its pydantic models, exception handlers and pre-engine checks, no model)
and through a real gateway to a backend that records what reaches it. For every body:

- vLLM takes it: the gateway takes it too and forwards it byte for byte, having read ``stream``,
  ``stream_options.include_usage``, ``max_tokens``, ``priority`` and the number of answers as vLLM
  reads them (pydantic's lax mode: ``"5"`` and ``5.0`` are 5, ``"yes"`` is true); the only
  exceptions are the gateway's documented limits, ``n`` over ``MAX_N`` and ``|priority|`` over
  ``MAX_ABS_PRIORITY``;
- both refuse it: the gateway's answer has vLLM's status, in OpenAI's error shape;
- the gateway takes what vLLM refuses: vLLM's own answer goes back (counted, allowed: the gateway
  checks only what it reads).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from headway.integrations._server import default_vllm_paths
from headway.serve import serve_in_thread
from headway.serve._wire import MAX_ABS_PRIORITY, MAX_N, BadRequest, loads_json, validate_body

from ._protocol_corpus import corpus
from .test_vllm_requests import Recorder

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

HERE = Path(__file__).resolve().parent


class VllmProtocol:
    """vLLM's request validation in a process of its virtualenv (``_vllm_protocol.py``)."""

    def __init__(self, python: Path) -> None:
        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
        self.proc = subprocess.Popen(
            [str(python), str(HERE / "_vllm_protocol.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline()
        if not first:
            raise RuntimeError(f"{HERE / '_vllm_protocol.py'} exited with {self.proc.wait()} before it was ready")

    def check_all(self, bodies: list[tuple[bool, bytes]]) -> list[dict[str, Any]]:
        """vLLM's answer to each body: ``{"status", "body"}``."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        stdin = self.proc.stdin

        def write() -> None:
            for chat, raw in bodies:
                stdin.write(json.dumps({"chat": chat, "raw": raw.decode("latin-1")}) + "\n")
            stdin.flush()

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        out = [json.loads(self.proc.stdout.readline()) for _ in bodies]
        writer.join()
        return out

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture(scope="module")
def vllm_protocol() -> Iterator[VllmProtocol]:
    python, _ = default_vllm_paths()
    if not python.exists():
        why = f"no vLLM python at {python}; run bash scripts/setup_vllm_env.sh"
        if os.environ.get("HEADWAY_REQUIRE_VLLM") == "1":
            pytest.fail(f"{why} (HEADWAY_REQUIRE_VLLM=1)")
        pytest.skip(why)
    oracle = VllmProtocol(python)
    yield oracle
    oracle.close()


def _gateway_reading(chat: bool, raw: bytes, vllm: dict[str, Any]) -> list[str]:
    """Where the gateway reads a body vLLM takes otherwise than vLLM does."""
    body = loads_json(raw)
    parsed = validate_body(body, chat)
    want = vllm["read"]
    wrong = []
    if parsed.stream != want["stream"]:
        wrong.append(f"stream {parsed.stream} != {want['stream']}")
    if parsed.wants_usage != want["include_usage"]:
        wrong.append(f"include_usage {parsed.wants_usage} != {want['include_usage']}")
    if parsed.priority != want["priority"]:
        wrong.append(f"priority {parsed.priority} != {want['priority']}")
    asked = body.get("max_completion_tokens") if chat else None
    asked = body.get("max_tokens") if asked is None else asked
    if asked is not None and parsed.max_tokens != max(want["max_tokens"], 1):  # (echo with 0: one token is run)
        wrong.append(f"max_tokens {parsed.max_tokens} != {want['max_tokens']}")
    if parsed.answers != (want["n"] or 1) * want["prompts"]:
        wrong.append(f"answers {parsed.answers} != n {want['n']} x prompts {want['prompts']}")
    return wrong


def _documented_limit(chat: bool, raw: bytes) -> str | None:
    """The gateway's documented limit a body vLLM takes goes past, if any."""
    try:
        validate_body(loads_json(raw), chat)
    except BadRequest as exc:
        msg = str(exc)
        if exc.param == "n" and f"at most {MAX_N}" in msg:
            return "n over MAX_N"
        if exc.param == "priority" and f"{MAX_ABS_PRIORITY}" in msg:
            return "priority over MAX_ABS_PRIORITY"
    except ValueError:
        pass
    return None


def test_the_gateway_takes_what_vllm_takes(vllm_protocol, make_gateway, servers, capsys):
    rec = Recorder()
    gw = make_gateway([servers.enter_context(serve_in_thread(rec.app()))])
    bodies = list(corpus())
    answers = vllm_protocol.check_all(bodies)
    counts: Counter[str] = Counter()
    problems: Counter[str] = Counter()
    examples: dict[str, bytes] = {}

    def problem(kind: str, raw: bytes) -> None:
        problems[kind] += 1
        examples.setdefault(kind, raw)

    with gw.client() as c:
        for (chat, raw), vllm in zip(bodies, answers, strict=True):
            vllm_ok = vllm["status"] == 200
            rec.stream = vllm_ok and vllm["body"]["read"]["stream"]
            before = len(rec.seen)
            path = "/v1/chat/completions" if chat else "/v1/completions"
            r = c.post(path, content=raw, headers={"Content-Type": "application/json"})
            gw_ok = r.status_code == 200
            counts[f"vllm {'takes' if vllm_ok else 'refuses'}, gateway {'takes' if gw_ok else 'refuses'}"] += 1
            if vllm_ok and gw_ok:
                if rec.seen[before:] != [raw]:
                    problem("forwarded otherwise than sent", raw)
                for wrong in _gateway_reading(chat, raw, vllm["body"]):
                    problem(f"read otherwise: {wrong.split()[0]}", raw)
            elif vllm_ok:
                limit = _documented_limit(chat, raw)
                if limit is not None:
                    counts[f"documented limit: {limit}"] += 1
                else:
                    problem(f"vLLM takes, gateway refuses ({r.json()['error'].get('param')})", raw)
            elif not gw_ok:
                if vllm["status"] == 500 and r.status_code == 400:
                    # vLLM's own crash on a bad body (its structured_outputs check calls .get on a
                    # string or a list: AttributeError, a 500); the gateway's 400 names another field
                    assert "object has no attribute" in vllm["body"]["error"]["message"], vllm
                    counts["both refuse, vLLM with its own 500"] += 1
                elif r.status_code != vllm["status"]:
                    problem(f"status {r.status_code} != vLLM's {vllm['status']}", raw)
                err = r.json().get("error")
                if not isinstance(err, dict) or set(err) != {"message", "type", "param", "code"}:
                    problem("not OpenAI's error shape", raw)
                counts["both refuse, same param"] += _same_param(err, vllm["body"]["error"])
    with capsys.disabled():
        print(f"\n{len(bodies)} bodies: " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
        for kind, n in problems.most_common():
            print(f"  {n} x {kind}: e.g. {examples[kind][:200]!r}")
    assert not problems, dict(problems)


def _same_param(ours: dict[str, Any], theirs: dict[str, Any]) -> bool:
    """The gateway's ``param`` names the field vLLM's does (vLLM's pydantic errors say ``body.x``)."""
    p, q = ours.get("param") or "", (theirs.get("param") or "").removeprefix("body.")
    return bool(p) and (p == q or q.startswith(p + ".") or p.startswith(q + "["))
