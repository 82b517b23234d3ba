"""Encoding prompts with a predictor's encoder, for training: pooled embeddings with gradients
(:func:`embed_ids`, full fine-tuning) and frozen features, memoized in memory and on disk
(:func:`embed_prompts`, keyed by :func:`embedding_tag`); and the progress bar that training and
embedding show."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from headway._files import replacing
from headway.predict._chunks import _length_sorted_batches
from headway.predict._paths import default_cache_dir
from headway.predict.data import prompt_key
from headway.predict.model import LengthPredictor, pad_batch, tokenize

__all__ = ["embed_ids", "embed_prompts", "embedding_tag", "progress_bar"]


_EMBED_CACHE: dict[str, dict[str, npt.NDArray[np.float32]]] = {}


def run_length_sorted(lengths: Sequence[int], size: int, run: Callable[[list[int]], torch.Tensor]) -> torch.Tensor:
    """``run(batch)`` (one output row per index) over the length-sorted batches of indices of
    ``lengths``, the rows put back in index order."""
    parts: list[torch.Tensor] = []
    where: list[int] = []
    for chunk in _length_sorted_batches(lengths, size):
        parts.append(run(chunk))
        where.extend(chunk)
    out = torch.cat(parts)
    inverse = torch.empty(len(where), dtype=torch.long)
    inverse[torch.tensor(where, dtype=torch.long)] = torch.arange(len(where))
    return out[inverse]


def embed_ids(
    model: LengthPredictor, ids: Sequence[Sequence[int]], rows: Sequence[int], micro: int, pad_id: int
) -> torch.Tensor:
    """Pooled embeddings of ``rows`` (in that order), encoded in length-sorted micro-batches."""

    def run(chunk: list[int]) -> torch.Tensor:
        input_ids, mask = pad_batch([ids[rows[c]] for c in chunk], pad_id)
        return model.embed(torch.from_numpy(input_ids), torch.from_numpy(mask))

    return run_length_sorted([len(ids[r]) for r in rows], micro, run)


def embedding_tag(encoder: str | Path | None, pooling: str, max_length: int, layers: int | None = None) -> str:
    """Identity of frozen features: encoder directory (and its weights' size and mtime), layers kept,
    pooling, length."""
    from headway.predict._paths import encoder_path

    root = encoder_path(encoder)
    stamp = [str(root.resolve()), pooling, str(max_length)]
    if layers is not None:
        stamp.append(f"layers={layers}")
    for f in sorted(root.glob("*.safetensors")) + sorted(root.glob("*.bin")):
        st = f.stat()
        stamp.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("|".join(stamp).encode()).hexdigest()[:20]


def _disk_cache_file(tag: str) -> Path:
    return default_cache_dir() / "embeddings" / f"{tag}.npz"


def _load_disk_cache(tag: str) -> dict[str, npt.NDArray[np.float32]]:
    path = _disk_cache_file(tag)
    if not path.is_file():
        return {}
    try:
        with np.load(path, allow_pickle=False) as z:
            keys, emb = z["keys"], z["emb"]
        return {str(k): emb[i] for i, k in enumerate(keys)}
    except (OSError, ValueError, KeyError):
        return {}  # a damaged cache is only a cache: recompute


def _save_disk_cache(tag: str, table: dict[str, npt.NDArray[np.float32]]) -> None:
    path = _disk_cache_file(tag)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        keys = np.array(list(table), dtype="U64")
        with replacing(path, "wb") as fh:
            np.savez(fh, keys=keys, emb=np.stack(list(table.values())).astype(np.float32))
    except OSError:
        pass


def embed_prompts(
    model: LengthPredictor,
    tokenizer: Any,
    prompts: Sequence[str],
    max_length: int = 128,
    batch_size: int = 64,
    progress: bool = False,
    cache_tag: str | None = None,
    disk_cache: bool = True,
) -> npt.NDArray[np.float32]:
    """Frozen-encoder features of ``prompts`` (eval mode, no grad).

    With a ``cache_tag`` (see :func:`embedding_tag`) features are memoized in memory and, with
    ``disk_cache``, under ``~/.cache/headway/embeddings/`` keyed by prompt hash.
    """
    cache: dict[str, npt.NDArray[np.float32]] | None = None
    if cache_tag is not None:
        if cache_tag not in _EMBED_CACHE:
            _EMBED_CACHE[cache_tag] = _load_disk_cache(cache_tag) if disk_cache else {}
        cache = _EMBED_CACHE[cache_tag]
    keys = [prompt_key(p) for p in prompts]
    todo = sorted({k: i for i, k in enumerate(keys) if cache is None or k not in cache}.values())
    fresh: dict[str, npt.NDArray[np.float32]] = {}
    if todo:
        ids = tokenize(tokenizer, [prompts[i] for i in todo], max_length)
        was_training = model.training
        model.eval()
        chunks = _length_sorted_batches([len(x) for x in ids], batch_size)
        bar = progress_bar(len(todo), "embedding", progress)
        with torch.inference_mode():
            for chunk in chunks:
                input_ids, mask = pad_batch([ids[c] for c in chunk], tokenizer.pad_token_id or 0)
                out = model.embed(torch.from_numpy(input_ids), torch.from_numpy(mask)).float().numpy()
                for row, c in enumerate(chunk):
                    fresh[keys[todo[c]]] = out[row]
                bar.update(len(chunk))
        bar.close()
        model.train(was_training)
        if cache is not None and cache_tag is not None:
            cache.update(fresh)
            if disk_cache:
                _save_disk_cache(cache_tag, cache)
    table = cache if cache is not None else fresh
    return np.stack([table[k] for k in keys]).astype(np.float32)


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, desc: str, enabled: bool) -> Any:
    """A progress bar on stderr when ``enabled`` and stderr is a terminal (a log file gets none)."""
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="it", leave=False, dynamic_ncols=True, disable=None)
