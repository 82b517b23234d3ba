"""Length-prediction data: (prompt, output length, model) examples, loaders, prompt-disjoint splits, pairs.

Loaders read the public data under ``data_dir`` (default: :func:`default_data_dir`, ``$HEADWAY_DATA_DIR``
or ``../shared/data``) and never copy it. Every :class:`ExampleSet` carries its length unit (``tokens``,
``words`` or ``chars``) and, for tokens, how they were counted, so reports can state it.

The generic JSONL format, one object per line::

    {"prompt": str, "output_tokens": int, "model": str?, "reasoning_tokens": int?, "output": str?,
     "reasoning": str?}

``output_tokens`` (required, > 0) counts the answer. For reasoning models, ``reasoning_tokens`` (or a
``reasoning`` text) counts the reasoning trace; the example's length is answer + trace, because the engine
generates both. ``words``/``chars`` units need the ``output`` text (or ``output_words``/``output_chars``).

Nothing here imports torch.
"""

from __future__ import annotations

import csv
import difflib
import gzip
import hashlib
import json
import math
import string
import zlib
from collections import defaultdict
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, cast, get_args

import numpy as np
import numpy.typing as npt

from headway.predict._errors import DataError
from headway.predict._paths import default_data_dir, default_encoder_path

__all__ = [
    "DEFAULT_DELTA",
    "Example",
    "ExampleSet",
    "LengthUnit",
    "Split",
    "alpaca_eval_models",
    "keep_pair",
    "load_alpaca_eval",
    "load_alpaca_eval_consensus",
    "load_codealpaca",
    "load_dataset",
    "load_jsonl",
    "load_sharegpt",
    "make_pairs",
    "normalized_prompt",
    "prompt_key",
    "split_by_prompt",
    "write_jsonl",
]

LengthUnit = Literal["tokens", "words", "chars"]
UNITS: tuple[str, ...] = get_args(LengthUnit)

DEFAULT_DELTA = 0.2
"""Pairs whose relative length gap ``|a - b| / max(a, b)`` is below this are too close to call."""

CL100K = "cl100k_base"
WORDPIECE = "wordpiece (all-MiniLM-L6-v2 vocabulary)"


def _check_unit(unit: str) -> LengthUnit:
    if unit not in UNITS:
        raise DataError(f"unknown length unit {unit!r}; choose one of {', '.join(UNITS)}")
    return cast(LengthUnit, unit)


def _resolve_data_dir(data_dir: str | Path | None) -> Path:
    """``data_dir``, else the shared data folder; DataError when it is not a directory."""
    if data_dir is None:
        try:
            return default_data_dir()
        except FileNotFoundError as exc:
            raise DataError(str(exc)) from None
    path = Path(data_dir)
    if not path.is_dir():
        raise DataError(f"data directory {path} does not exist (set HEADWAY_DATA_DIR or pass data_dir)")
    return path


def _need(path: Path) -> Path:
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    return path


def prompt_key(prompt: str) -> str:
    """Stable identity of a prompt (SHA-256 of the stripped text): what splits and caches key on."""
    return hashlib.sha256(prompt.strip().encode("utf-8")).hexdigest()


_END_PUNCTUATION = string.punctuation + " "


def normalized_prompt(prompt: str) -> str:
    """The prompt as duplicates are matched: case-folded, each run of whitespace one space, punctuation at
    either end dropped (``"What is  the meaning of life?"`` and ``"what is the meaning of life"`` match).
    A prompt of punctuation alone keeps it."""
    text = " ".join(prompt.casefold().split())
    return text.strip(_END_PUNCTUATION) or text


@dataclass(frozen=True, slots=True)
class Example:
    """One prompt and the length of one model's response to it (answer plus any reasoning trace)."""

    prompt: str
    length: int
    model: str | None = None
    record: str = ""
    """Where the example came from (``file:line`` or ``dataset:model:idx``), for error messages."""

    def __post_init__(self) -> None:
        where = self.record or "example"
        if not isinstance(self.prompt, str) or not self.prompt.strip():
            raise DataError(f"{where}: empty prompt")
        if isinstance(self.length, bool) or not isinstance(self.length, int | np.integer):
            raise DataError(f"{where}: length must be an integer, got {self.length!r}")
        if self.length <= 0:
            raise DataError(f"{where}: length must be positive, got {self.length}")


@dataclass(frozen=True)
class ExampleSet:
    """Examples that share one length unit; ``tokenizer`` says how tokens were counted."""

    name: str
    unit: LengthUnit
    examples: tuple[Example, ...]
    tokenizer: str | None = None
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_unit(self.unit)

    def __len__(self) -> int:
        return len(self.examples)

    def __iter__(self) -> Iterator[Example]:
        return iter(self.examples)

    def __getitem__(self, index: int) -> Example:
        return self.examples[index]

    @property
    def unit_label(self) -> str:
        """The unit as reports state it, e.g. ``tokens (cl100k_base)``."""
        if self.unit == "tokens" and self.tokenizer:
            return f"tokens ({self.tokenizer})"
        return self.unit

    def prompts(self) -> list[str]:
        return [e.prompt for e in self.examples]

    def lengths(self) -> npt.NDArray[np.float64]:
        return np.array([e.length for e in self.examples], dtype=np.float64)

    def models(self) -> list[str | None]:
        """Distinct model names, in first-seen order."""
        return list(dict.fromkeys(e.model for e in self.examples))

    def with_examples(self, examples: Sequence[Example], name: str | None = None) -> ExampleSet:
        """The same unit and provenance over other examples."""
        return ExampleSet(name or self.name, self.unit, tuple(examples), self.tokenizer, self.notes)


# ---------------------------------------------------------------------------------------------------------
# Generic JSONL


def _int_field(obj: dict[str, Any], name: str, where: str, *, required: bool, minimum: int) -> int | None:
    if name not in obj or obj[name] is None:
        if required:
            raise DataError(f"{where}: missing field {name!r}")
        return None
    value = obj[name]
    if isinstance(value, bool) or not (
        isinstance(value, int) or (isinstance(value, float) and math.isfinite(value) and value.is_integer())
    ):
        raise DataError(f"{where}: {name!r} must be an integer, got {value!r}")
    value = int(value)
    if value < minimum:
        kind = "positive" if minimum == 1 else f">= {minimum}"
        raise DataError(f"{where}: {name!r} must be {kind}, got {value}")
    return value


def _str_field(obj: dict[str, Any], name: str, where: str) -> str | None:
    value = obj.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise DataError(f"{where}: {name!r} must be a string, got {type(value).__name__}")
    return value


def _text_length(text: str, unit: LengthUnit) -> int:
    return len(text.split()) if unit == "words" else len(text)


def load_jsonl(path: str | Path, unit: str = "tokens", *, name: str | None = None) -> ExampleSet:
    """Read the generic JSONL format (see the module docstring); errors name ``path:line``.

    Blank lines are skipped. Lengths include the reasoning trace when a record has one.
    """
    unit_ = _check_unit(unit)
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    opener = gzip.open if path.suffix == ".gz" else open
    examples: list[Example] = []
    try:
        with opener(path, "rb") as fh:
            for lineno, raw in enumerate(fh, start=1):
                try:  # a byte order mark before the first line (Windows tools write one) is no part of it
                    line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
                except UnicodeDecodeError as exc:
                    raise DataError(f"{path}:{lineno}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
                example = _jsonl_example(line, f"{path}:{lineno}", unit_)
                if example is not None:
                    examples.append(example)
    except (OSError, EOFError, zlib.error) as exc:  # a damaged or not gzipped .gz (gzip.BadGzipFile is an OSError)
        raise DataError(f"{path}: cannot read it ({exc})") from None
    if not examples:
        raise DataError(f"{path}: no records")
    return ExampleSet(name or path.name, unit_, tuple(examples), "as given" if unit_ == "tokens" else None)


def _jsonl_example(line: str, where: str, unit_: LengthUnit) -> Example | None:
    """The example of one generic-JSONL line (None for a blank line); ``where`` is ``path:line``."""
    if not line.strip():
        return None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: invalid JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if "prompt" not in obj:
        raise DataError(f"{where}: missing field 'prompt'")
    prompt = obj["prompt"]
    if not isinstance(prompt, str):
        raise DataError(f"{where}: 'prompt' must be a string, got {type(prompt).__name__}")
    if not prompt.strip():
        raise DataError(f"{where}: empty prompt")
    tokens = _int_field(obj, "output_tokens", where, required=True, minimum=1)
    assert tokens is not None
    reasoning_tokens = _int_field(obj, "reasoning_tokens", where, required=False, minimum=0) or 0
    model = _str_field(obj, "model", where)
    if unit_ == "tokens":
        length = tokens + reasoning_tokens
    else:
        output = _str_field(obj, "output", where)
        reasoning = _str_field(obj, "reasoning", where) or ""
        if output is not None:
            length = _text_length(output, unit_) + _text_length(reasoning, unit_)
        else:
            given = _int_field(obj, f"output_{unit_}", where, required=False, minimum=1)
            if given is None:
                raise DataError(f"{where}: unit {unit_!r} needs an 'output' text or an 'output_{unit_}' field")
            extra = _int_field(obj, f"reasoning_{unit_}", where, required=False, minimum=0)
            length = given + (extra or 0)
        if length <= 0:
            raise DataError(f"{where}: output length in {unit_} must be positive, got {length}")
    return Example(prompt, length, model, where)


def write_jsonl(data: ExampleSet | Sequence[Example], path: str | Path) -> Path:
    """Write examples in the generic JSONL format (token lengths only: ``output_tokens`` means tokens)."""
    if isinstance(data, ExampleSet) and data.unit != "tokens":
        raise DataError(f"write_jsonl: the generic format stores tokens; {data.name!r} is in {data.unit}")
    path = Path(path)
    with path.open("w", encoding="utf-8") as fh:
        for ex in data:
            obj: dict[str, Any] = {"prompt": ex.prompt, "output_tokens": int(ex.length)}
            if ex.model is not None:
                obj["model"] = ex.model
            fh.write(json.dumps(obj, ensure_ascii=False) + "\n")
    return path


# ---------------------------------------------------------------------------------------------------------
# alpaca_eval


@lru_cache(maxsize=4)
def _alpaca_tables(
    data_dir: Path,
) -> tuple[dict[int, str], dict[str, dict[int, tuple[int, int, int]]]]:
    folder = data_dir / "alpaca_eval"
    instructions: dict[int, str] = {}
    with _need(folder / "instructions.jsonl").open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                obj = json.loads(line)
                instructions[int(obj["idx"])] = str(obj["instruction"])
    lengths: dict[str, dict[int, tuple[int, int, int]]] = defaultdict(dict)
    with gzip.open(_need(folder / "output_lengths_long.csv.gz"), "rt", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            lengths[row["model"]][int(row["idx"])] = (
                int(row["cl100k_tokens"]),
                int(row["words"]),
                int(row["chars"]),
            )
    return instructions, dict(lengths)


def alpaca_eval_models(data_dir: str | Path | None = None) -> list[str]:
    """The models (227) whose alpaca_eval output lengths are in the data, sorted."""
    _, lengths = _alpaca_tables(_resolve_data_dir(data_dir))
    return sorted(lengths)


def _unknown_model(model: str, known: Sequence[str]) -> DataError:
    close = difflib.get_close_matches(model, known, n=5, cutoff=0.5)
    hint = f"; close matches: {', '.join(close)}" if close else ""
    return DataError(f"alpaca_eval has no model {model!r} ({len(known)} models known){hint}")


def load_alpaca_eval(
    models: str | Sequence[str] = "gpt4",
    unit: str = "tokens",
    data_dir: str | Path | None = None,
) -> ExampleSet:
    """alpaca_eval's 805 instructions with the lengths of one or more of its 227 models.

    ``models`` is a name, a list of names or ``"all"``. Tokens are cl100k_base counts. Empty answers
    (length 0) are skipped and counted in ``notes``.
    """
    unit_ = _check_unit(unit)
    instructions, lengths = _alpaca_tables(_resolve_data_dir(data_dir))
    names = sorted(lengths) if models == "all" else [models] if isinstance(models, str) else list(models)
    col = UNITS.index(unit_)
    examples: list[Example] = []
    skipped = 0
    for model in names:
        if model not in lengths:
            raise _unknown_model(model, sorted(lengths))
        for idx, values in sorted(lengths[model].items()):
            if idx not in instructions:
                raise DataError(f"alpaca_eval:{model}: idx {idx} has no instruction")
            if values[col] <= 0:
                skipped += 1
                continue
            examples.append(Example(instructions[idx], values[col], model, f"alpaca_eval:{model}:idx={idx}"))
    notes = (f"skipped {skipped} empty answers",) if skipped else ()
    label = ",".join(names) if len(names) <= 3 else f"{len(names)} models"
    return ExampleSet(f"alpaca_eval:{label}", unit_, tuple(examples), CL100K if unit_ == "tokens" else None, notes)


def load_alpaca_eval_consensus(
    models: str | Sequence[str] = "all",
    unit: str = "tokens",
    data_dir: str | Path | None = None,
) -> ExampleSet:
    """alpaca_eval's instructions, each labelled with the geometric mean of several models' lengths.

    One example per instruction (model ``"mean"``): ``exp(mean(log length))`` over ``models``
    (``"all"`` = the 227 models) that gave a non-empty answer. A single model's length is one noisy
    sample of how long a prompt's answer tends to be (the same prompt resampled ranks at Spearman
    ~0.8); the consensus keeps the prompt's part and averages the sampling noise away, so a ranker
    trained on it learns what makes prompts long rather than one sample's accidents. Split by
    prompt as usual: held-out prompts stay held out for every model.
    """
    unit_ = _check_unit(unit)
    instructions, lengths = _alpaca_tables(_resolve_data_dir(data_dir))
    names = sorted(lengths) if models == "all" else [models] if isinstance(models, str) else list(models)
    col = UNITS.index(unit_)
    logs: dict[int, list[float]] = defaultdict(list)
    for model in names:
        if model not in lengths:
            raise _unknown_model(model, sorted(lengths))
        for idx, values in lengths[model].items():
            if values[col] > 0:
                logs[idx].append(math.log(values[col]))
    examples = []
    for idx in sorted(logs):
        if idx not in instructions:
            raise DataError(f"alpaca_eval:mean: idx {idx} has no instruction")
        length = max(1, round(math.exp(sum(logs[idx]) / len(logs[idx]))))
        examples.append(Example(instructions[idx], length, "mean", f"alpaca_eval:mean:idx={idx}"))
    label = ",".join(names) if len(names) <= 3 else f"{len(names)} models"
    notes = (f"geometric mean length over {label}",)
    return ExampleSet("alpaca_eval:mean", unit_, tuple(examples), CL100K if unit_ == "tokens" else None, notes)


# ---------------------------------------------------------------------------------------------------------
# ShareGPT and CodeAlpaca


def load_sharegpt(unit: str = "tokens", data_dir: str | Path | None = None, limit: int | None = None) -> ExampleSet:
    """ShareGPT first turns (prompt, ChatGPT response), the first ``limit`` (>= 1) of them if given.
    Tokens are the published cl100k_base counts."""
    unit_ = _check_unit(unit)
    if limit is not None and limit < 1:
        raise DataError(f"sharegpt: the number of examples must be >= 1, got {limit}")
    folder = _resolve_data_dir(data_dir) / "sharegpt"
    token_counts: dict[str, int] = {}
    if unit_ == "tokens":
        with gzip.open(_need(folder / "sharegpt_all_turn_lengths.csv.gz"), "rt", encoding="utf-8") as fh:
            for row in csv.DictReader(fh):
                if row["turn"] == "0":
                    token_counts[row["conv_id"]] = int(row["response_tokens"])
    examples: list[Example] = []
    skipped = 0
    with gzip.open(_need(folder / "sharegpt_first_turn.jsonl.gz"), "rt", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            obj = json.loads(line)
            prompt, response = str(obj.get("prompt") or ""), str(obj.get("response") or "")
            tokens = token_counts.get(str(obj.get("id")), 0)
            length = tokens if unit_ == "tokens" else _text_length(response, unit_)
            if not prompt.strip() or length <= 0:
                skipped += 1
                continue
            examples.append(Example(prompt, length, "chatgpt", f"sharegpt:{obj.get('id', lineno)}"))
            if limit is not None and len(examples) >= limit:
                break
    notes = (f"skipped {skipped} records with an empty prompt or answer",) if skipped else ()
    return ExampleSet("sharegpt", unit_, tuple(examples), CL100K if unit_ == "tokens" else None, notes)


@lru_cache(maxsize=1)
def _wordpiece() -> Any:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(default_encoder_path() / "tokenizer.json"))
    tok.no_padding()  # the bundled tokenizer.json pads and truncates to 128: every count came out 128
    tok.no_truncation()
    return tok


def count_wordpiece_tokens(texts: Sequence[str]) -> list[int]:
    """Token counts with the bundled encoder's WordPiece tokenizer (no special tokens)."""
    encodings = _wordpiece().encode_batch(list(texts), add_special_tokens=False)
    return [len(e.ids) for e in encodings]


def load_codealpaca(
    which: Literal["2k", "new", "all"] = "all",
    unit: str = "tokens",
    data_dir: str | Path | None = None,
) -> ExampleSet:
    """CodeAlpaca instructions (instruction + input) with their answers' lengths.

    The data ships no cl100k counts, so tokens are counted with the bundled WordPiece tokenizer
    (stated in the unit label).
    """
    unit_ = _check_unit(unit)
    folder = _resolve_data_dir(data_dir) / "codealpaca"
    files: dict[str, list[tuple[str, str | None]]] = {
        "2k": [("code_alpaca_2k.json", "text-davinci-003")],
        "new": [("new_codealpaca.json", None)],
    }
    files["all"] = files["2k"] + files["new"]
    if which not in files:
        raise DataError(f"codealpaca: unknown subset {which!r}; choose 2k, new or all")
    rows: list[tuple[str, str, str | None, str]] = []
    for fname, model in files[which]:
        with _need(folder / fname).open(encoding="utf-8") as fh:
            records = json.load(fh)
        for i, rec in enumerate(records):
            prompt = str(rec.get("instruction") or "").strip()
            extra = str(rec.get("input") or "").strip()
            if extra:
                prompt = f"{prompt}\n\n{extra}"
            answer = str(rec.get("response") or rec.get("output") or "")
            rows.append((prompt, answer, model or "codealpaca-new", f"codealpaca:{fname}:{i}"))
    if unit_ == "tokens":
        lengths = count_wordpiece_tokens([r[1] for r in rows])
    else:
        lengths = [_text_length(r[1], unit_) for r in rows]
    examples = [Example(p, n, m, rec) for (p, _, m, rec), n in zip(rows, lengths, strict=True) if p and n > 0]
    skipped = len(rows) - len(examples)
    notes = (f"skipped {skipped} records with an empty prompt or answer",) if skipped else ()
    return ExampleSet(f"codealpaca:{which}", unit_, tuple(examples), WORDPIECE if unit_ == "tokens" else None, notes)


def load_dataset(spec: str, unit: str = "tokens", data_dir: str | Path | None = None) -> ExampleSet:
    """Load by name: ``alpaca_eval:MODEL[,MODEL...]`` (or ``alpaca_eval:all``), ``alpaca_eval:mean[:MODEL,...]``
    (one consensus length per prompt), ``sharegpt[:N]``,
    ``codealpaca[:2k|new|all]``, or a path to a generic ``.jsonl`` file; ``A+B`` concatenates data sets
    that count lengths the same way."""
    if "+" in spec and not Path(spec).exists():  # trained together, e.g. alpaca_eval:mean+sharegpt:2000
        parts = [load_dataset(part, unit, data_dir) for part in spec.split("+") if part]
        if not parts:
            raise DataError(f"{spec!r}: no data set named around '+' (e.g. alpaca_eval:mean+sharegpt:2000)")
        counted = {p.tokenizer for p in parts if p.unit == "tokens"}
        if len(counted) > 1:
            raise DataError(f"{spec!r}: the parts count tokens differently ({', '.join(sorted(map(str, counted)))})")
        return ExampleSet(
            spec,
            parts[0].unit,
            tuple(ex for p in parts for ex in p.examples),
            parts[0].tokenizer,
            tuple(n for p in parts for n in p.notes),
        )
    name, _, arg = spec.partition(":")
    if name == "alpaca_eval":
        head, _, rest = arg.partition(":")
        if head == "mean":  # alpaca_eval:mean[:MODEL,...]: consensus lengths (see load_alpaca_eval_consensus)
            chosen: str | list[str] = [m for m in rest.split(",") if m] if rest else "all"
            return load_alpaca_eval_consensus(chosen, unit, data_dir)
        models: str | list[str] = "all" if arg == "all" else [m for m in (arg or "gpt4").split(",") if m]
        return load_alpaca_eval(models, unit, data_dir)
    if name == "sharegpt":
        try:
            limit = int(arg) if arg else None
        except ValueError:
            raise DataError(f"{spec!r}: sharegpt:N takes a number of examples N, got {arg!r}") from None
        return load_sharegpt(unit, data_dir, limit)
    if name == "codealpaca":
        return load_codealpaca(cast(Literal["2k", "new", "all"], arg or "all"), unit, data_dir)
    path = Path(spec)
    if path.suffix in {".jsonl", ".gz"} or path.exists():
        return load_jsonl(path, unit)
    raise DataError(f"unknown dataset {spec!r}: use alpaca_eval:MODEL, sharegpt, codealpaca[:2k|new] or a .jsonl path")


# ---------------------------------------------------------------------------------------------------------
# Splits


@dataclass(frozen=True)
class Split:
    """Prompt-disjoint train / validation / test parts of one :class:`ExampleSet`."""

    train: ExampleSet
    val: ExampleSet
    test: ExampleSet
    seed: int
    test_frac: float
    val_frac: float
    meta: dict[str, object] = field(default_factory=dict, compare=False)


def _unit_interval(seed: int, key: str) -> float:
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def split_by_prompt(data: ExampleSet, test_frac: float = 0.2, val_frac: float = 0.0, seed: int = 0) -> Split:
    """Assign each distinct prompt (all its examples, whatever the model) to one part.

    A prompt's part depends only on ``(seed, prompt text)``, so the same prompts are held out for every
    model and every subset of the data; the fractions hold in expectation.
    """
    if not (0.0 <= test_frac < 1.0 and 0.0 <= val_frac < 1.0 and test_frac + val_frac < 1.0):
        raise DataError(f"split fractions must be in [0, 1) and sum below 1: test {test_frac}, val {val_frac}")
    parts: dict[str, list[Example]] = {"train": [], "val": [], "test": []}
    memo: dict[str, str] = {}
    for ex in data.examples:
        key = prompt_key(ex.prompt)
        part = memo.get(key)
        if part is None:
            u = _unit_interval(seed, key)
            part = "test" if u < test_frac else "val" if u < test_frac + val_frac else "train"
            memo[key] = part
        parts[part].append(ex)
    return Split(
        train=data.with_examples(parts["train"], f"{data.name}/train"),
        val=data.with_examples(parts["val"], f"{data.name}/val"),
        test=data.with_examples(parts["test"], f"{data.name}/test"),
        seed=seed,
        test_frac=test_frac,
        val_frac=val_frac,
    )


# ---------------------------------------------------------------------------------------------------------
# Pairs


def keep_pair(len_a: float, len_b: float, delta: float = DEFAULT_DELTA) -> bool:
    """True iff ``|a - b| / max(a, b) >= delta`` and ``a != b`` (a tie says neither is longer)."""
    if len_a == len_b:
        return False
    return abs(len_a - len_b) / max(len_a, len_b) >= delta


def _check_delta(delta: float) -> None:
    if not (0.0 <= delta < 1.0):
        raise DataError(f"delta must be in [0, 1), got {delta}")


def make_pairs(
    lengths: Sequence[float] | npt.NDArray[np.float64],
    partners: int = 16,
    delta: float = DEFAULT_DELTA,
    seed: int | np.random.Generator = 0,
    groups: Sequence[Hashable] | None = None,
) -> npt.NDArray[np.int64]:
    """Training pairs: for each example, sample up to ``partners`` others (same group), keep a pair only
    if ``|lenA - lenB| / max(lenA, lenB) >= delta``.

    Returns an ``(n, 3)`` int array of rows ``(a, b, label)``; ``label`` is 1 if ``a`` is longer, else 0.
    Unordered duplicates are dropped. ``groups`` (e.g. the model of each example) keeps pairs within a
    group, because lengths of different models are not comparable.
    """
    _check_delta(delta)
    if partners < 0:
        raise DataError(f"partners must be >= 0, got {partners}")
    lens = np.asarray(lengths, dtype=np.float64)
    if lens.size and not np.all(lens > 0):
        bad = int(np.flatnonzero(~(lens > 0))[0])
        raise DataError(f"make_pairs: length of example {bad} must be positive, got {lens[bad]}")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    if groups is None:
        members = [np.arange(lens.size)]
    else:
        if len(groups) != lens.size:
            raise DataError(f"make_pairs: {len(groups)} groups for {lens.size} lengths")
        by_group: dict[Hashable, list[int]] = defaultdict(list)
        for i, g in enumerate(groups):
            by_group[g].append(i)
        members = [np.array(v, dtype=np.int64) for v in by_group.values()]
    chunks: list[npt.NDArray[np.int64]] = []
    for idx in members:
        m = idx.size
        k = min(partners, m - 1)
        if k <= 0:
            continue
        # k distinct partners per example, never itself: offsets 1..m-1 drawn without replacement
        offsets = np.stack([rng.choice(m - 1, size=k, replace=False) for _ in range(m)]) + 1
        a_local = np.repeat(np.arange(m), k)
        b_local = (a_local + offsets.ravel()) % m
        a, b = idx[a_local], idx[b_local]
        la, lb = lens[a], lens[b]
        keep = (la != lb) & (np.abs(la - lb) / np.maximum(la, lb) >= delta)
        a, b = a[keep], b[keep]
        lo, hi = np.minimum(a, b), np.maximum(a, b)
        _, first = np.unique(lo * lens.size + hi, return_index=True)
        first.sort()
        a, b = a[first], b[first]
        chunks.append(np.stack([a, b, (lens[a] > lens[b]).astype(np.int64)], axis=1))
    if not chunks:
        return np.zeros((0, 3), dtype=np.int64)
    return np.concatenate(chunks).astype(np.int64)
