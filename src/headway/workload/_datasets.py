"""Readers for public prompt datasets: prompts with their responses or output lengths, no arrival times.

Formats:

- ShareGPT: the JSON list of ``{"id", "conversations": [{"from", "value"}, ...]}``
  (first ``human`` turn is the prompt, the ``gpt`` turn right after it the response),
  or JSONL with one such record, or one ``{"id", "prompt", "response"}`` record, per
  line (``sharegpt_first_turn.jsonl.gz``).
- alpaca_eval: ``instructions.jsonl`` (idx, dataset, instruction) plus
  ``output_lengths_long.csv.gz`` (model, idx, chars, words, cl100k_tokens); one model's
  ``cl100k_tokens`` are the output lengths.
- alpaca_eval model outputs, as the alpaca_eval leaderboard publishes them
  (``results/<model>/model_outputs.json``): a JSON list (or JSONL) of
  ``{"instruction", "output", "generator", "dataset"}``; the output's token count is the
  output length.

Text datasets have no token counts of their own model; lengths come from a
``count_tokens`` callable. The default, :func:`approx_token_count`, is an
*approximation* (``ceil(len(text) / 4)``, about 4 characters per token for English
BPE vocabularies), not a tokenizer. When ``count_tokens`` is left as ``None`` and a
record carries recorded counts (``prompt_tokens``/``response_tokens`` in the shared
ShareGPT first-turn file, ``instruction_cl100k_tokens`` in alpaca_eval; cl100k_base
counts), those are used instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from headway.workload._arrivals import ArrivalProcess, BurstArrivals, Seed
from headway.workload._errors import WorkloadFormatError
from headway.workload._records import (
    PathLike,
    Row,
    assemble,
    check_limit,
    csv_rows,
    existing_file,
    file_stem,
    int_value,
    json_records,
    jsonl_records,
    required_field,
    text_value,
)
from headway.workload._spec import Workload

__all__ = [
    "TokenCounter",
    "approx_token_count",
    "read_alpaca_eval",
    "read_alpaca_eval_outputs",
    "read_sharegpt",
]

TokenCounter = Callable[[str], int]
"""Maps a text to its number of tokens."""


def approx_token_count(text: str) -> int:
    """Approximate token count: ``ceil(len(text) / 4)``.

    An approximation (about 4 characters per token for English text with GPT/Llama
    BPE vocabularies), not a tokenizer; pass a real tokenizer's ``len(encode(text))``
    as ``count_tokens`` when exact counts matter.
    """
    return math.ceil(len(text) / 4)


def _count(count_tokens: TokenCounter, text: str) -> int:
    n = count_tokens(text)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"count_tokens must return a non-negative int, got {n!r}")
    return n


# ----------------------------------------------------------------------- ShareGPT
_PROMPT_ROLES = frozenset({"human", "user"})
_RESPONSE_ROLES = frozenset({"gpt", "chatgpt", "assistant", "bard", "bing"})


def _first_turn(path: Path, line: int, rec: Any) -> tuple[str, str, int | None, int | None] | None:
    """``(prompt, response, recorded prompt tokens, recorded response tokens)`` or None."""
    if not isinstance(rec, dict):
        raise WorkloadFormatError(path, line, "expected a JSON object", field="record", value=rec)
    if "conversations" in rec:
        turns = rec["conversations"]
        if not isinstance(turns, list):
            raise WorkloadFormatError(path, line, "expected a list of turns", field="conversations", value=turns)
        roles: list[str] = []
        for k, turn in enumerate(turns):
            if not isinstance(turn, dict):
                raise WorkloadFormatError(path, line, "expected an object", field=f"conversations[{k}]", value=turn)
            where = f"conversations[{k}]."
            roles.append(text_value(path, line, f"{where}from", required_field(path, line, turn, "from", where)))
            text_value(path, line, f"{where}value", required_field(path, line, turn, "value", where))
        for k, role in enumerate(roles):
            if role in _PROMPT_ROLES:
                if k + 1 < len(turns) and roles[k + 1] in _RESPONSE_ROLES:
                    return turns[k]["value"], turns[k + 1]["value"], None, None
                return None
        return None
    prompt = text_value(path, line, "prompt", required_field(path, line, rec, "prompt"))
    response = text_value(path, line, "response", required_field(path, line, rec, "response"))
    recorded: list[int | None] = []
    for key in ("prompt_tokens", "response_tokens"):
        v = rec.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise WorkloadFormatError(path, line, "expected a non-negative integer", field=key, value=v)
        recorded.append(v)
    return prompt, response, recorded[0], recorded[1]


def read_sharegpt(
    path: PathLike,
    *,
    count_tokens: TokenCounter | None = None,
    arrivals: ArrivalProcess | None = None,
    seed: Seed = 0,
    limit: int | None = None,
    name: str | None = None,
) -> Workload:
    """Read ShareGPT conversations (JSON list or JSONL) or first-turn records (JSONL).

    Each record gives one request: its first ``human`` turn is the prompt and the
    ``gpt`` turn right after it the response, whose token count is the output length.
    Records with no such pair, or whose prompt or response counts 0 tokens, are skipped
    (``meta["skipped"]``; why in ``meta["skipped_why"]``, as for the other readers). Token
    counts come from ``count_tokens`` (see the module doc for the default). ShareGPT has
    no times: ``arrivals`` assigns them in file order,
    default a burst at t = 0. Request ids are the records' ``id`` (``@<line>`` appended
    to a repeated id).
    """
    check_limit(limit)
    p = existing_file(path)
    counter = count_tokens or approx_token_count
    rows: list[Row] = []
    seen: set[str] = set()
    skipped = 0
    for line, rec in json_records(p):
        if limit is not None and len(rows) >= limit:
            break
        pair = _first_turn(p, line, rec)
        if pair is None:
            skipped += 1
            continue
        prompt, response, rec_p, rec_o = pair
        n_prompt = rec_p if count_tokens is None and rec_p is not None else _count(counter, prompt)
        n_output = rec_o if count_tokens is None and rec_o is not None else _count(counter, response)
        if n_prompt <= 0 or n_output <= 0:
            skipped += 1
            continue
        rid = str(rec.get("id", f"sharegpt-{len(rows)}"))
        if rid in seen:
            rid = f"{rid}@{line}"
        seen.add(rid)
        rows.append(Row(line, rid, n_prompt, n_output, prompt=prompt))
    meta: dict[str, object] = {
        "source": str(p),
        "format": "sharegpt",
        "timed": False,
        "skipped": skipped,
        "skipped_why": "no prompt/response pair or 0 tokens",
    }
    return assemble(name or file_stem(p), rows, meta, arrivals=arrivals or BurstArrivals(), seed=seed)


# --------------------------------------------------------------------- alpaca_eval
def _alpaca_lengths(path: Path, model: str) -> dict[int, tuple[int, int]]:
    """``{idx: (cl100k_tokens, line)}`` for ``model``; error listing close names if absent."""
    lengths: dict[int, tuple[int, int]] = {}
    models: set[str] = set()
    for line, cells, _ in csv_rows(path, ("model", "idx", "cl100k_tokens")):
        m = cells["model"]
        if m != model:
            models.add(m)
            continue
        idx_raw = cells["idx"].strip()
        if not idx_raw.isdigit():
            raise WorkloadFormatError(path, line, "expected a non-negative integer", field="idx", value=idx_raw)
        idx = int(idx_raw)
        if idx in lengths:
            raise WorkloadFormatError(
                path,
                line,
                f"duplicate row for model {model!r} (first on line {lengths[idx][1]})",
                field="idx",
                value=idx,
            )
        lengths[idx] = (int_value(path, line, "cl100k_tokens", cells["cl100k_tokens"]), line)
    if not lengths:
        import difflib

        by_lower = {m.lower(): m for m in sorted(models)}
        matches = difflib.get_close_matches(model.lower(), list(by_lower), n=8, cutoff=0.4)
        close = [by_lower[m] for m in matches]
        hint = f"; close matches: {', '.join(close)}" if close else ""
        raise ValueError(f"{path}: no rows for model {model!r} ({len(models)} models in the file{hint})")
    return lengths


def read_alpaca_eval(
    instructions: PathLike,
    lengths: PathLike,
    model: str,
    *,
    count_tokens: TokenCounter | None = None,
    arrivals: ArrivalProcess | None = None,
    seed: Seed = 0,
    limit: int | None = None,
    name: str | None = None,
) -> Workload:
    """alpaca_eval instructions answered by ``model``: prompt text plus that model's output length.

    ``instructions`` is ``instructions.jsonl`` (idx, dataset, instruction);
    ``lengths`` is ``output_lengths_long.csv[.gz]`` (model, idx, chars, words,
    cl100k_tokens): the output length is the model's ``cl100k_tokens``. Prompt tokens
    come from ``count_tokens`` (default: ``instruction_cl100k_tokens`` when present,
    else :func:`approx_token_count`). ``category`` is the instruction's dataset.
    Instructions the model has no length for are skipped (``meta["skipped"]``). No
    times: ``arrivals`` assigns them in file order, default a burst at t = 0.
    """
    check_limit(limit)
    ip, lp = existing_file(instructions), existing_file(lengths)
    by_idx = _alpaca_lengths(lp, model)
    counter = count_tokens or approx_token_count
    rows: list[Row] = []
    seen: dict[int, int] = {}
    skipped = 0
    for line, rec in jsonl_records(ip):
        if limit is not None and len(rows) >= limit:
            break
        idx = required_field(ip, line, rec, "idx")
        if isinstance(idx, bool) or not isinstance(idx, int) or idx < 0:
            raise WorkloadFormatError(ip, line, "expected a non-negative integer", field="idx", value=idx)
        if idx in seen:
            raise WorkloadFormatError(ip, line, f"duplicate idx (first on line {seen[idx]})", field="idx", value=idx)
        seen[idx] = line
        text = text_value(ip, line, "instruction", required_field(ip, line, rec, "instruction"))
        dataset = rec.get("dataset")
        recorded = rec.get("instruction_cl100k_tokens")
        if count_tokens is None and isinstance(recorded, int) and not isinstance(recorded, bool):
            n_prompt = recorded
        else:
            n_prompt = _count(counter, text)
        if idx not in by_idx or n_prompt <= 0:
            skipped += 1
            continue
        rows.append(
            Row(
                line=line,
                request_id=f"alpaca-{idx}",
                num_prompt_tokens=n_prompt,
                num_output_tokens=by_idx[idx][0],
                prompt=text,
                category=str(dataset) if dataset is not None else None,
            )
        )
    meta: dict[str, object] = {
        "source": str(ip),
        "lengths": str(lp),
        "format": "alpaca-eval",
        "timed": False,
        "model": model,
        "skipped": skipped,
        "skipped_why": f"no output length of {model}, or a prompt of 0 tokens",
    }
    return assemble(name or f"alpaca-eval:{model}", rows, meta, arrivals=arrivals or BurstArrivals(), seed=seed)


def _generator_error(path: Path, model: str | None, generators: set[str]) -> ValueError:
    import difflib

    names = sorted(generators)
    if model is None:
        return ValueError(
            f"{path}: outputs of {len(names)} generators ({', '.join(names[:8])}{', ...' if len(names) > 8 else ''});"
            " pick one with model= (--model)"
        )
    close = difflib.get_close_matches(model, names, n=8, cutoff=0.4)
    hint = f"; close matches: {', '.join(close)}" if close else ""
    return ValueError(f"{path}: no outputs of generator {model!r} ({len(names)} generators in the file{hint})")


def read_alpaca_eval_outputs(
    path: PathLike,
    *,
    model: str | None = None,
    count_tokens: TokenCounter | None = None,
    arrivals: ArrivalProcess | None = None,
    seed: Seed = 0,
    limit: int | None = None,
    name: str | None = None,
) -> Workload:
    """alpaca_eval model outputs as the leaderboard publishes them (``model_outputs.json``).

    A JSON list, or JSONL, of ``{"instruction", "output", "generator", "dataset"}``: the
    instruction is the prompt and the output's token count (``count_tokens``, default
    :func:`approx_token_count`) the output length; ``category`` is the dataset. ``model``
    keeps one generator's outputs; without it the file must hold a single generator.
    Records whose instruction or output counts 0 tokens are skipped (``meta["skipped"]``).
    No times: ``arrivals`` assigns them in file order, default a burst at t = 0.
    """
    check_limit(limit)
    p = existing_file(path)
    counter = count_tokens or approx_token_count
    rows: list[Row] = []
    generators: set[str] = set()
    skipped = 0
    for line, rec in json_records(p):
        if limit is not None and len(rows) >= limit:
            break
        if not isinstance(rec, dict):
            raise WorkloadFormatError(p, line, "expected a JSON object", field="record", value=rec)
        gen = rec.get("generator")
        if gen is not None:
            gen = text_value(p, line, "generator", gen)
            generators.add(gen)
        if model is not None and gen != model:
            continue
        prompt = text_value(p, line, "instruction", required_field(p, line, rec, "instruction"))
        output = text_value(p, line, "output", required_field(p, line, rec, "output"))
        n_prompt, n_output = _count(counter, prompt), _count(counter, output)
        if n_prompt <= 0 or n_output <= 0:
            skipped += 1
            continue
        dataset = rec.get("dataset")
        rows.append(
            Row(
                line,
                f"{file_stem(p)}-{len(rows)}",
                n_prompt,
                n_output,
                prompt=prompt,
                category=str(dataset) if dataset is not None else None,
            )
        )
    if (model is not None and not rows and not skipped) or (model is None and len(generators) > 1):
        raise _generator_error(p, model, generators)
    meta: dict[str, object] = {
        "source": str(p),
        "format": "alpaca-eval-outputs",
        "timed": False,
        "model": model if model is not None else next(iter(generators), None),
        "skipped": skipped,
        "skipped_why": "an instruction or output of 0 tokens",
    }
    return assemble(name or file_stem(p), rows, meta, arrivals=arrivals or BurstArrivals(), seed=seed)
