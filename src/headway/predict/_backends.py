"""Scoring backends: a checkpoint's encoder run by torch or by ONNX Runtime (``Scorer``'s runners)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast, get_args

import numpy as np
import numpy.typing as npt

from headway.predict._errors import CheckpointError

if TYPE_CHECKING:
    from headway.predict.model import LengthPredictor

__all__ = ["BACKENDS", "Backend", "OnnxBackend", "TorchBackend", "scoring_backend"]

Backend = Literal["torch", "onnx", "onnx-int8"]

BACKENDS: tuple[str, ...] = get_args(Backend)
"""The scoring backends by name (``--backend`` and ``scorer_backend`` choices)."""


def scoring_backend(name: str) -> Backend:
    """``name`` as a :data:`Backend`; ValueError naming the choices when it is none of them."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; use {', '.join(BACKENDS)}")
    return cast("Backend", name)


class _Runner(Protocol):
    name: str

    def run(self, input_ids: npt.NDArray[np.int64], attention_mask: npt.NDArray[np.int64]) -> npt.NDArray[Any]: ...


class TorchBackend:
    """Runs a :class:`LengthPredictor` in inference mode."""

    name = "torch"

    def __init__(self, model: LengthPredictor) -> None:
        self.model = model.eval()

    def run(self, input_ids: npt.NDArray[np.int64], attention_mask: npt.NDArray[np.int64]) -> npt.NDArray[Any]:
        import torch

        with torch.inference_mode():
            out = self.model(torch.from_numpy(input_ids), torch.from_numpy(attention_mask))
        return np.asarray(out.float().numpy())


class OnnxBackend:
    """Runs an exported ``model.onnx`` with ONNX Runtime's CPU provider.

    ONNX Runtime's worker threads busy-wait for the next run (its default).
    ``HEADWAY_ORT_SPINNING=0`` makes them sleep instead (``session.intra_op.allow_spinning``),
    which frees CPU on shared cores; in the gateway's burst benchmark it did not change latency
    (the gateway's measurement notes, ``git show 403bc55:benchmarks/results/gateway.md``).
    """

    def __init__(self, path: str | Path, threads: int = 2, *, name: str = "onnx") -> None:
        import onnxruntime as ort

        self.name = name
        """The backend's name (``onnx``, or ``onnx-int8`` for the quantized model)."""

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = max(1, threads)
        opts.inter_op_num_threads = 1
        spinning = os.environ.get("HEADWAY_ORT_SPINNING", "1")
        if spinning not in ("0", "1"):
            raise ValueError(f"HEADWAY_ORT_SPINNING must be 0 or 1, got {spinning!r}")
        opts.add_session_config_entry("session.intra_op.allow_spinning", spinning)
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        try:
            self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise CheckpointError(f"{path}: ONNX Runtime cannot load it ({exc})") from exc

    def run(self, input_ids: npt.NDArray[np.int64], attention_mask: npt.NDArray[np.int64]) -> npt.NDArray[Any]:
        out = self.session.run(["score"], {"input_ids": input_ids, "attention_mask": attention_mask})
        return np.asarray(out[0])
