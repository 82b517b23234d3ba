"""One prompt, one score: the shipped predictor's score of the same request through each front end.

Real prompts (alpaca_eval instructions and ShareGPT first turns, the longest ShareGPT ones among them
so that truncation is exercised) are sent as three kinds of request, each scored the way each front
end scores it:

- the simulator: a workload request carrying the prompt (the predictor JSONL format's ``prompt``),
  scored on arrival by ``pars.scorer=default``, one request at a time (``ScoredPolicy.score_of``);
- the gateway: the OpenAI body parsed and kept as ``headway serve`` keeps it (``validate_body``,
  ``Intake.new_request``; a prompt of token ids decoded by ``Intake.token_text`` with ``--tokenizer``
  the tiny Llama's, as the gateway's arrival decodes it), all prompts scored in one mixed-length batch
  by ``--scorer default``, in process and with ``--scorer-process``;
- the vLLM plugin, in vLLM's virtualenv: the token ids vLLM's renderer gives the engine (the chat
  template and tokenizer of the tiny Llama, ``.venv-vllm/tiny-llama``), detokenized by
  ``HeadwayScheduler._hw_decode`` and scored by the plugin's ``PolicyAdapter`` with
  ``scorer: default``, ``scoring: inline`` and ``background``.

The requests: a completions request (``prompt`` = the text); the same as token ids (``prompt`` = the
ids the plugin's side got for it, so the plugin's score of them is its completions request's); a chat
request with the text as its only user message; a chat request with a system prompt and an earlier
exchange before it. Each path's
scores are compared with the simulator's: the largest absolute difference and Kendall tau_b.
Scoring runs in a fresh cache (``HEADWAY_CACHE_DIR``), so ``default`` is the shipped predictor.

    python benchmarks/scoring_paths.py    # writes benchmarks/results/scoring_paths.md
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scipy import stats

ROOT = Path(__file__).resolve().parent.parent
SYSTEM = (
    "You are a helpful assistant for a hardware shop. Answer politely, never invent prices or stock "
    "levels, prefer metric units, and keep personal data private. "
)
EARLIER = ("What is a torque wrench?", "A torque wrench applies a set torque to a fastener, such as a bolt.")

PLUGIN = r"""
import json, sys, time, types
sys.path.insert(0, {tests!r})
from transformers import AutoTokenizer
from headway.core import make_policy
from headway.integrations.vllm import HeadwayScheduler, PolicyAdapter
from headway.integrations.vllm._scorers import load_text_scorer
from integrations._fake import FakeRequest

reqs = json.load(open({requests!r}))
tok = AutoTokenizer.from_pretrained({model!r})
me = types.SimpleNamespace(_hw_tokenizer=None, _hw_tokenizer_path={model!r}, _hw_chat=None)
decode = lambda batch: HeadwayScheduler._hw_decode(me, batch)
fn = load_text_scorer("default")
out = {{}}
for mode in ("inline", "background"):
    a = PolicyAdapter(make_policy("pars"), score_batch=fn, decode=decode, background=mode == "background",
                      clock=time.monotonic, epoch=0.0)
    q = a.make_queue()
    for r in reqs:
        if "messages" in r:  # vLLM's chat path: the template rendered and tokenized, no special tokens added
            ids = tok.apply_chat_template(r["messages"], tokenize=True, add_generation_prompt=True,
                                          return_dict=False)
        else:  # the completions path: the prompt tokenized with the tokenizer's special tokens
            ids = tok(r["prompt"])["input_ids"]
        q.add_request(FakeRequest(r["id"], 0.0, len(ids), 16, prompt_token_ids=list(ids)))
        if mode == "inline" and "messages" not in r:
            out.setdefault("ids", {{}})[r["id"]] = list(ids)
    deadline = time.monotonic() + 600
    while a.reqs and any(h.score is None for h in a.reqs.values()) and time.monotonic() < deadline:
        a.flush()
        time.sleep(0.01)
    a.close()
    out[mode] = {{rid: h.score for rid, h in a.reqs.items()}}
    out[mode + "_text"] = {{rid: h.prompt for rid, h in a.reqs.items()}}
print(json.dumps(out))
"""


def prompts(data: Path, n_alpaca: int, n_sharegpt: int) -> list[str]:
    rows = [json.loads(x) for x in (data / "alpaca_eval" / "instructions.jsonl").open()]
    alpaca = [r["instruction"] for r in rows[:: max(1, len(rows) // n_alpaca)][:n_alpaca]]
    with gzip.open(data / "sharegpt" / "sharegpt_first_turn.jsonl.gz", "rt") as f:
        share = [json.loads(x)["prompt"] for _, x in zip(range(2000), f, strict=False)]
    share = [p for p in share if p.strip()]
    longest = sorted(share, key=len)[-(n_sharegpt // 3) :]  # over the predictor's window: cut
    rest = [p for p in share if p not in longest][: n_sharegpt - len(longest)]
    return alpaca + rest + longest


ODD = {  # hostile or odd prompts: each sent as a completions request and a chat request after a system prompt
    "whitespace only": " \n\t ",
    "emoji": "\U0001f642\U0001f680 write a poem \U0001f389",
    "CJK": "\u8bf7\u5199\u4e00\u9996\u5173\u4e8e\u5927\u6d77\u7684\u8bd7",
    "RTL (Arabic)": "\u0627\u0643\u062a\u0628 \u0642\u0635\u064a\u062f\u0629 "
    "\u0639\u0646 \u0627\u0644\u0628\u062d\u0631",
    "NUL characters": "Write\x00 a poem\x00 about\x00 the sea",
    "1 MB": "word " * 200_000,
    "20,000 spaces, then a request": " " * 20_000 + "Write a very long story about dragons.",
}


def odd_requests() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, p in enumerate([*ODD.values(), ""]):
        if p:  # (an empty completions prompt is refused by vLLM and the gateway alike)
            out.append({"id": f"odd{i}-completion", "text": p, "prompt": p})
        chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": p}]
        out.append({"id": f"odd{i}-chat", "text": p, "messages": chat})
    return out


def requests(texts: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, p in enumerate(texts):
        out.append({"id": f"{i}-completion", "text": p, "prompt": p})
        out.append({"id": f"{i}-chat", "text": p, "messages": [{"role": "user", "content": p}]})
        history = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": EARLIER[0]},
            {"role": "assistant", "content": EARLIER[1]},
            {"role": "user", "content": p},
        ]
        out.append({"id": f"{i}-history", "text": p, "messages": history})
    return out


def simulator(reqs: list[dict[str, Any]]) -> dict[str, float]:
    from headway.core import Request, make_policy

    policy: Any = make_policy("pars", scorer="default")
    out = {}
    for r in reqs:  # the simulator's workload holds the user prompt itself, scored on arrival
        req = Request(request_id=r["id"], arrival_time=0.0, num_prompt_tokens=1, max_tokens=1, prompt=r["text"])
        out[r["id"]] = policy.score_of(req)
    return out


def gateway(
    reqs: list[dict[str, Any]], process: bool, tokenizer: str = ""
) -> tuple[dict[str, float], dict[str, str | None]]:
    from headway.serve import BackendConfig, GatewayConfig
    from headway.serve._intake import Intake
    from headway.serve._scorer import ProcessScoreFn, load_score_fn
    from headway.serve._tenants import ANONYMOUS
    from headway.serve._wire import validate_body

    config = GatewayConfig(backends=(BackendConfig("http://127.0.0.1:1"),), scorer="default", tokenizer=tokenizer)
    intake = Intake(config, hash_prefixes=False)
    kept: dict[str, str | None] = {}
    for r in reqs:
        chat = "messages" in r
        body = {"model": "m", "messages": r["messages"]} if chat else {"model": "m", "prompt": r["prompt"]}
        parsed = validate_body(body, chat)
        prompt = intake.new_request(r["id"], 0.0, body, parsed, ANONYMOUS).prompt
        kept[r["id"]] = intake.token_text(parsed) if prompt is None else prompt  # (token ids: Arrivals.arrive)
    fn: Any = ProcessScoreFn("default") if process else load_score_fn("default")
    try:
        ids = [k for k, v in kept.items() if v is not None]  # (None: no text, the fallback score)
        scores: dict[str, float] = {}
        for a in range(0, len(ids), 32):  # the gateway's batches (scorer_batch_size 32)
            chunk = ids[a : a + 32]
            scores.update(zip(chunk, map(float, fn([kept[k] for k in chunk])), strict=True))
    finally:
        if process:
            fn.close()
    return scores, kept


def model_dir() -> str:
    return os.environ.get("HEADWAY_VLLM_MODEL", str(ROOT / ".venv-vllm" / "tiny-llama"))


def token_requests(reqs: list[dict[str, Any]], ids: dict[str, list[int]]) -> list[dict[str, Any]]:
    """Each completions request again, its prompt the token ids the plugin's side got for it."""
    return [{"id": k.removesuffix("completion") + "tokens", "text": r["text"], "prompt": ids[k]}
            for r in reqs if (k := r["id"]).endswith("-completion")]  # fmt: skip


def plugin(reqs: list[dict[str, Any]], workdir: Path) -> dict[str, Any]:
    path = workdir / "requests.json"
    path.write_text(json.dumps(reqs))
    model = model_dir()
    python = os.environ.get("HEADWAY_VLLM_PYTHON", str(ROOT / ".venv-vllm" / "bin" / "python"))
    code = PLUGIN.format(tests=str(ROOT / "tests"), requests=str(path), model=model)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, timeout=900, check=False)
    if out.returncode:
        raise SystemExit(f"the plugin's side failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def compare(base: dict[str, float], other: dict[str, float | None], ids: list[str]) -> tuple[str, str, str]:
    pairs = [(base[i], other.get(i)) for i in ids]
    missing = sum(o is None for _, o in pairs)
    both = [(b, o) for b, o in pairs if o is not None]
    if len(both) < 2:  # (none scored: nothing to compare)
        return "n/a", "n/a", f"{missing}"
    diff = max(abs(b - o) for b, o in both)
    tau = stats.kendalltau([b for b, _ in both], [o for _, o in both]).statistic
    return f"{diff:.2e}", f"{tau:.4f}", f"{missing}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--alpaca", type=int, default=20)
    ap.add_argument("--sharegpt", type=int, default=18)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "scoring_paths.md")
    args = ap.parse_args()
    from headway.workload import find_data_dir

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["HEADWAY_CACHE_DIR"] = str(Path(tmp) / "cache")
        texts = prompts(find_data_dir(), args.alpaca, args.sharegpt)
        reqs = requests(texts) + odd_requests()
        pl = plugin(reqs, Path(tmp))
        tokens = token_requests(reqs, pl["ids"])
        for mode in ("inline", "background"):  # the same ids: the plugin's score of the completions request
            for r in tokens:
                done = r["id"].removesuffix("tokens") + "completion"
                pl[mode][r["id"]], pl[mode + "_text"][r["id"]] = pl[mode][done], pl[mode + "_text"][done]
        reqs += tokens
        sim = simulator(reqs)
        gw, gw_text = gateway(reqs, process=False, tokenizer=model_dir())
        gwp, _ = gateway(reqs, process=True, tokenizer=model_dir())
        bare, _ = gateway(tokens, process=False)
    wall = time.perf_counter() - t0
    kinds = {"completion": "completions request", "tokens": "completions request of token ids",
             "chat": "chat, user message alone",
             "history": "chat after a system prompt and an earlier exchange"}  # fmt: skip
    paths = [("gateway", gw), ("gateway, --scorer-process", gwp), ("plugin, inline", pl["inline"]),
             ("plugin, background", pl["background"])]  # fmt: skip
    lines = [
        "# One prompt, one score: the shipped predictor through each front end",
        "",
        "Command:",
        "",
        "```",
        "python " + " ".join(shlex.quote(a) for a in ["benchmarks/scoring_paths.py", *sys.argv[1:]]),
        "```",
        "",
        f"- prompts: {len(texts)} ({args.alpaca} alpaca_eval instructions, {args.sharegpt} ShareGPT first turns, "
        f"{args.sharegpt // 3} of them the longest of the first 2,000: {min(map(len, texts[-(args.sharegpt // 3) :]))}"
        f" to {max(map(len, texts))} characters); each sent as the four requests below",
        "- the reference: the simulator's score of the prompt (a workload request, scored alone on arrival)",
        "- the plugin's token ids: the tiny Llama's tokenizer and chat template (`.venv-vllm/tiny-llama`); a "
        "completions request of token ids carries the ids the plugin got for the text, decoded at the gateway "
        "with `--tokenizer` the tiny Llama's (the plugin's score of them is its completions request's)",
        f"- wall time {wall:.0f} s",
        "",
        "| request | path | max abs difference | Kendall tau_b | unscored |",
        "|---|---|---:|---:|---:|",
    ]
    for kind, label in kinds.items():
        ids = [r["id"] for r in reqs if r["id"].endswith("-" + kind) and not r["id"].startswith("odd")]
        for name, scores in paths:
            name = f"{name}, --tokenizer" if kind == "tokens" and name.startswith("gateway") else name
            lines.append(f"| {label} | {name} | " + " | ".join(compare(sim, scores, ids)) + " |")
        if kind == "tokens":  # (before --tokenizer: the fallback score)
            lines.append(f"| {label} | gateway, no --tokenizer | " + " | ".join(compare(sim, bare, ids)) + " |")
    real = [r for r in reqs if not r["id"].startswith("odd")]
    same = sum(gw_text[r["id"]] == pl["inline_text"][r["id"]] for r in real)
    lines += ["", f"Text kept for scoring, gateway against plugin: identical for {same} of {len(real)} requests."]
    lines += [
        "",
        "## Odd prompts: each path's score",
        "",
        "Completions request / the same as token ids / chat request after the system prompt; the simulator "
        "scores the prompt itself.",
        "",
        "| prompt | simulator | gateway | gateway, --scorer-process | plugin, inline | plugin, background |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for i, name in enumerate([*ODD, "empty (chat only)"]):
        cells = [f"{sim[f'odd{i}-chat']:.4f}"]
        for _, scores in paths:
            got = [scores.get(f"odd{i}-{k}") for k in ("completion", "tokens", "chat") if f"odd{i}-{k}" in sim]
            cells.append(" / ".join("fallback" if g is None else f"{g:.4f}" for g in got))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
