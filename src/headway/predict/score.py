"""Serving-time scoring: batched, dynamically padded, cached by prompt hash; torch or ONNX Runtime.

``Scorer.score(prompts)`` returns one float per prompt, higher = longer expected output. The ``pars``
policy orders by it; :func:`score_workload` precomputes scores for a simulator workload.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from headway.predict._backends import BACKENDS, Backend, OnnxBackend, TorchBackend, _Runner, scoring_backend
from headway.predict._chunks import _padding_chunks
from headway.predict._errors import CheckpointError
from headway.predict._export import (
    ONNX_FILE,
    ONNX_INT8_FILE,
    _derived_dir,
    _int8_problem,
    _onnx_problem,
    derived_dir,
    export_onnx,
    quantize_onnx,
)
from headway.predict._paths import set_offline
from headway.predict._resolve import MIN_SCORING_LENGTH
from headway.predict._text import MAX_CHARS_PER_TOKEN, scoring_text

if TYPE_CHECKING:
    from headway.predict.shipped import ShippedPredictor
    from headway.predict.train import TrainConfig
    from headway.workload import Workload

_log = logging.getLogger("headway.predict.score")

__all__ = [
    "BACKENDS",
    "MAX_CHARS_PER_TOKEN",
    "MIN_SCORING_LENGTH",
    "CacheInfo",
    "OnnxBackend",
    "Scorer",
    "ScoringLengthError",
    "TorchBackend",
    "default_scorer",
    "derived_dir",
    "ensure_predictor",
    "export_onnx",
    "quantize_onnx",
    "score_workload",
    "scoring_backend",
    "scoring_text",
]


class ScoringLengthError(ValueError):
    """A scoring ``max_length`` outside ``MIN_SCORING_LENGTH`` .. the checkpoint's own length."""


@dataclass(frozen=True)
class CacheInfo:
    hits: int
    misses: int
    size: int
    maxsize: int


def _hash(prompt: str) -> bytes:
    # surrogatepass: a lone surrogate (JSON "\\ud800") hashes too; it never raises
    return hashlib.blake2b(prompt.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _scoring_length(requested: int | None, trained: int) -> int:
    """The prompt length to score at: ``requested`` (``MIN_SCORING_LENGTH`` tokens up to the
    checkpoint's own), or the checkpoint's."""
    if requested is None:
        return trained
    if not MIN_SCORING_LENGTH <= requested <= trained:
        raise ScoringLengthError(
            f"max_length must be {MIN_SCORING_LENGTH}..{trained} tokens (the checkpoint's length), got {requested}"
        )
    return requested


class Scorer:
    """Scores prompts with a trained predictor.

    Prompts are tokenized (truncated to ``max_length``), sorted by length and run in batches of
    at most ``batch_size``, each padded only to its longest prompt. The batch boundaries are the
    ones that run the fewest tokens, padding included, counting each forward pass as
    :data:`_PASS_COST_TOKENS` more (:func:`_padding_chunks`): prompts that arrive together (a
    gateway's scoring batch) are often mostly short with a few long ones, and one batch padded to
    the longest took about twice as long (``benchmarks/results/predictor_bench_padding.md``).
    Scores are cached (LRU, ``cache_size`` entries, 0 disables) under a 128-bit BLAKE2b hash of
    the prompt text. Threads may share a scorer: the cache is read and written under a lock, the
    encoder runs outside it.

    The int8 model quantizes each token's activations on its own (:mod:`headway.predict._rowquant`),
    so, as with the float backends, a prompt's score does not depend on the batch it lands in.
    """

    def __init__(
        self,
        runner: _Runner,
        tokenizer: Any,
        *,
        max_length: int = 128,
        batch_size: int = 32,
        cache_size: int = 100_000,
        name: str = "",
        meta: dict[str, Any] | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.runner = runner
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.batch_size = batch_size
        self.cache_size = max(0, cache_size)
        self.name = name
        self.meta = dict(meta or {})
        self._pad_id = int(getattr(tokenizer, "pad_token_id", 0) or 0)
        self._cache: OrderedDict[bytes, float] = OrderedDict()
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0

    @property
    def backend(self) -> str:
        return self.runner.name

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        backend: Backend = "torch",
        *,
        batch_size: int = 32,
        threads: int = 2,
        cache_size: int = 100_000,
        export_if_missing: bool = True,
        max_length: int | None = None,
    ) -> Scorer:
        """Load a checkpoint directory for scoring. With ``backend="onnx"``, ``model.onnx`` in the
        checkpoint is used (exported first when missing or stale and ``export_if_missing``); with
        ``"onnx-int8"``, its dynamically int8-quantized copy ``model.int8.onnx`` (made the same way;
        about twice as fast on CPU, see ``benchmarks/results/predictor_bench.md``).

        ``max_length`` truncates prompts at scoring time to fewer tokens than the checkpoint was
        trained with (default: the checkpoint's): scoring time grows with the longest prompts."""
        import torch

        from headway.predict.model import (
            checkpoint_max_length,
            load_checkpoint,
            read_checkpoint_meta,
            verify_checkpoint_files,
        )

        torch.set_num_threads(max(1, threads))
        p = Path(path).expanduser().resolve()
        if backend == "torch":
            loaded = load_checkpoint(p)
            return cls(
                TorchBackend(loaded.model),
                loaded.tokenizer,
                max_length=_scoring_length(max_length, loaded.max_length),
                batch_size=batch_size,
                cache_size=cache_size,
                name=p.name,
                meta=loaded.meta,
            )
        scoring_backend(backend)
        meta = read_checkpoint_meta(p)
        hashes = verify_checkpoint_files(p, meta)
        where = _derived_dir(p, hashes, backend)
        onnx_path = where / ONNX_FILE
        problem = _onnx_problem(where, hashes)
        if problem:
            if not export_if_missing:
                raise CheckpointError(f"{onnx_path}: {problem}; run `headway predictor export-onnx --model {p}`")
            _log.info("exporting %s's ONNX graph once (%s); cached at %s", p.name, problem, where)
            export_onnx(p, into=where)
        if backend == "onnx-int8":
            int8_path = where / ONNX_INT8_FILE
            problem = _int8_problem(where)
            if problem:
                if not export_if_missing:
                    raise CheckpointError(
                        f"{int8_path}: {problem}; run `headway predictor export-onnx --int8 --model {p}`"
                    )
                _log.info("building %s's int8 scorer once (%s); cached at %s", p.name, problem, int8_path)
                quantize_onnx(p, into=where)
            onnx_path = int8_path
        set_offline()
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(p / "tokenizer"), local_files_only=True)
        return cls(
            OnnxBackend(onnx_path, threads, name=backend),
            tokenizer,
            max_length=_scoring_length(max_length, checkpoint_max_length(p, meta)),
            batch_size=batch_size,
            cache_size=cache_size,
            name=p.name,
            meta=meta,
        )

    def cache_info(self) -> CacheInfo:
        return CacheInfo(self._hits, self._misses, len(self._cache), self.cache_size)

    def clear_cache(self) -> None:
        with self._lock:
            self._cache.clear()
            self._hits = self._misses = 0

    def score_one(self, prompt: str) -> float:
        return float(self.score([prompt])[0])

    def score(self, prompts: Sequence[str]) -> npt.NDArray[np.float64]:
        """One score per prompt (higher = longer output expected). An empty or blank prompt is a
        request too (a client may send one): it is scored as its tokenizer's special tokens alone.
        Each prompt is read as :func:`scoring_text` (a bounded prefix, lone surrogates replaced)."""
        if isinstance(prompts, str):
            raise TypeError("score() takes a sequence of prompts; use score_one() for one prompt")
        out = np.empty(len(prompts), dtype=np.float64)
        keyed: list[tuple[bytes, str]] = []
        for i, prompt in enumerate(prompts):
            if not isinstance(prompt, str):
                raise TypeError(f"prompt {i} is not a string: {prompt!r:.40}")
            text = scoring_text(prompt, self.max_length)
            keyed.append((_hash(text), text))
        todo: dict[bytes, list[int]] = {}
        texts_of: dict[bytes, str] = {}
        with self._lock:  # (another thread's scores may evict an entry between its lookup and its move)
            for i, (key, text) in enumerate(keyed):
                cached = self._cache.get(key) if self.cache_size else None
                if cached is not None:
                    self._cache.move_to_end(key)
                    out[i] = cached
                    self._hits += 1
                else:
                    todo.setdefault(key, []).append(i)
                    texts_of.setdefault(key, text)
            self._misses += len(todo)
        if todo:
            keys = list(todo)
            texts = [texts_of[k] for k in keys]
            scores = self._run(texts)  # (outside the lock: threads score side by side)
            with self._lock:
                for key, s in zip(keys, scores, strict=True):
                    out[todo[key]] = s
                    if self.cache_size:
                        self._cache[key] = float(s)
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return out

    def _run(self, texts: Sequence[str]) -> npt.NDArray[np.float64]:
        from headway.predict.model import pad_batch, tokenize

        ids = tokenize(self.tokenizer, texts, self.max_length)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        result = np.empty(len(ids), dtype=np.float64)
        for a, b in _padding_chunks([len(ids[i]) for i in order], self.batch_size):
            chunk = order[a:b]
            input_ids, mask = pad_batch([ids[i] for i in chunk], self._pad_id)
            result[chunk] = self.runner.run(input_ids, mask).reshape(-1)
        return result


# ---------------------------------------------------------------------------------------------------------
# ONNX export


def score_workload(workload: Workload, scorer: Scorer | ShippedPredictor, *, require_prompts: bool = False) -> Workload:
    """A copy of ``workload`` whose requests carry ``score = scorer.score(prompt)``.

    ``scorer`` is a :class:`Scorer` or a :class:`~headway.predict.ShippedPredictor` (what
    :func:`default_scorer` returns). Requests without a prompt keep ``score=None`` (or raise, with
    ``require_prompts``).
    """
    specs = list(workload.requests)
    with_prompt = [i for i, s in enumerate(specs) if s.prompt is not None and s.prompt.strip()]
    if require_prompts and len(with_prompt) != len(specs):
        missing = next(s.request_id for i, s in enumerate(specs) if i not in set(with_prompt))
        raise ValueError(f"workload {workload.name!r}: request {missing!r} has no prompt to score")
    scores = scorer.score([specs[i].prompt or "" for i in with_prompt]) if with_prompt else np.empty(0)
    for i, s in zip(with_prompt, scores, strict=True):
        specs[i] = dataclasses.replace(specs[i], score=float(s))
    label = scorer.name if isinstance(scorer, Scorer) else scorer.path.stem  # (a pack: its file's name)
    meta = {**workload.meta, "scorer": label or scorer.backend, "scored": len(with_prompt)}
    return dataclasses.replace(workload, requests=tuple(specs), meta=meta)


def ensure_predictor(
    name_or_path: str | Path | None = None,
    *,
    train_if_missing: bool = True,
    config: TrainConfig | None = None,
    log: Callable[[str], None] | None = print,
) -> Path:
    """Path of a usable checkpoint: ``name_or_path`` if it is a checkpoint directory, else
    ``~/.cache/headway/predictors/<name>`` (default :data:`DEFAULT_PREDICTOR_NAME`), trained there with
    ``config`` (default: the settings of ``headway predictor train``) when missing. A corrupt
    checkpoint raises :class:`CheckpointError`; it is never silently replaced or loaded."""
    from headway.predict._paths import DEFAULT_PREDICTOR_NAME, default_predictor_dir
    from headway.predict.model import read_checkpoint_meta, verify_checkpoint_files

    candidate = Path(name_or_path).expanduser() if name_or_path is not None else None
    if candidate is not None and (candidate.is_dir() or candidate.is_absolute() or len(candidate.parts) > 1):
        path = candidate
    else:
        path = default_predictor_dir(str(name_or_path or DEFAULT_PREDICTOR_NAME))
    if path.exists():
        verify_checkpoint_files(path, read_checkpoint_meta(path))
        return path
    if not train_if_missing:
        raise CheckpointError(f"{path}: no predictor checkpoint; run `headway predictor train --out {path}`")
    if log:
        log(f"no predictor at {path}; training one (headway predictor train defaults)")
    from headway.predict.train import train_predictor

    return train_predictor(config, out_dir=path, log=log).path


def default_scorer(
    backend: Backend = "torch",
    *,
    train_if_missing: bool = True,
    threads: int = 2,
    batch_size: int = 32,
    max_length: int | None = None,
) -> Scorer | ShippedPredictor:
    """The scorer the ``pars`` policy and the simulator use by default: the predictor trained into the
    cache by ``headway predictor train`` when there is one, else the one shipped in the package
    (:class:`~headway.predict.shipped.ShippedPredictor`, torch-free, on ONNX Runtime: its int8 copy for
    ``backend="onnx-int8"``, else the float graph).
    ``train_if_missing`` is kept for callers; nothing is trained at first start any more."""
    from headway.predict._paths import DEFAULT_PREDICTOR_NAME, default_predictor_dir

    if not default_predictor_dir(DEFAULT_PREDICTOR_NAME).exists():
        from headway.predict.shipped import ShippedPredictor

        int8 = backend == "onnx-int8"
        return ShippedPredictor(threads=threads, batch_size=batch_size, max_length=max_length, int8=int8)
    path = ensure_predictor(train_if_missing=train_if_missing)
    return Scorer.from_checkpoint(path, backend, threads=threads, batch_size=batch_size, max_length=max_length)
