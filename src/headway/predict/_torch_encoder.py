"""Frozen mean-pooled prompt embeddings from any packaged or local encoder, run by torch.

:class:`~headway.predict.encoder.OnnxEncoder` builds its ONNX graph for BERT encoders only (the bundled
MiniLM); this runs the others (all-mpnet-base-v2: ``"mpnet"``) with the same tokenization limit, the same
length-aware batching and the same pooling, for offline evaluation such as ``headway predictor
cross-source --encoder mpnet``. A head fitted on these vectors needs this encoder to score: it cannot be
packed with the MiniLM of the shipped predictor.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from headway.predict._chunks import _padding_chunks
from headway.predict.encoder import DEFAULT_EMBED_LENGTH


class TorchEncoder:
    """``embed(prompts) -> (n, hidden)`` float32, the attention-masked mean of the encoder's last layer."""

    def __init__(
        self,
        encoder: str | Path,
        *,
        max_length: int = DEFAULT_EMBED_LENGTH,
        threads: int = 2,
        batch_size: int = 32,
    ) -> None:
        if max_length < 2:
            raise ValueError(f"max_length must be >= 2, got {max_length}")
        if threads < 1 or batch_size < 1:
            raise ValueError(f"threads and batch_size must be >= 1, got {threads} and {batch_size}")
        import torch

        from headway.predict.model import load_encoder, position_limit

        torch.set_num_threads(threads)
        model, tokenizer = load_encoder(encoder)
        self._model: Any = model.eval()
        self._tokenizer: Any = tokenizer
        limit = position_limit(model.config)
        self.max_length = min(max_length, limit) if limit is not None else max_length
        self.hidden_size = int(model.config.hidden_size)
        self.batch_size = batch_size
        self._pad_id = int(tokenizer.pad_token_id or 0)

    def token_ids(self, prompts: Sequence[str]) -> list[list[int]]:
        from headway.predict.model import tokenize

        return tokenize(self._tokenizer, prompts, self.max_length)

    def embed(self, prompts: Sequence[str]) -> npt.NDArray[np.float32]:
        """One vector per prompt, rows aligned with ``prompts``; batched as ``OnnxEncoder.embed``."""
        import torch

        from headway.predict.model import mean_pool, pad_batch

        out = np.zeros((len(prompts), self.hidden_size), dtype=np.float32)
        if not prompts:
            return out
        ids = self.token_ids(prompts)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        with torch.inference_mode():
            for a, b in _padding_chunks([len(ids[i]) for i in order], self.batch_size):
                rows = order[a:b]
                input_ids, mask = (torch.from_numpy(x) for x in pad_batch([ids[r] for r in rows], self._pad_id))
                hidden = self._model(input_ids=input_ids, attention_mask=mask).last_hidden_state
                out[rows] = mean_pool(hidden, mask).numpy()
        return out
