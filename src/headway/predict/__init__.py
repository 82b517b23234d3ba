"""Output-length prediction for the ``pars`` policy: data, models, training, evaluation, scoring.

Imports are lazy: ``import headway`` and ``import headway.predict`` work without torch; the names below
that need torch/transformers (``headway[predict]``) import them on first use; scoring with the shipped
predictor (:class:`ShippedPredictor`) and online learning need only ``headway[score]`` (ONNX Runtime).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from headway.predict._errors import CheckpointError, DataError, EncoderError, PredictError
    from headway.predict._paths import default_cache_dir, default_data_dir, default_encoder_path
    from headway.predict.crosssource import CrossSourceResult, cross_source_matrix
    from headway.predict.data import (
        Example,
        ExampleSet,
        Split,
        alpaca_eval_models,
        keep_pair,
        load_alpaca_eval,
        load_alpaca_eval_consensus,
        load_codealpaca,
        load_dataset,
        load_jsonl,
        load_sharegpt,
        make_pairs,
        split_by_prompt,
        write_jsonl,
    )
    from headway.predict.encoder import OnnxEncoder
    from headway.predict.evaluate import (
        MatrixResult,
        Metrics,
        cross_model_matrix,
        evaluate_scorer,
        rank_metrics,
        resampling_ceiling,
    )
    from headway.predict.head import RidgeHead
    from headway.predict.losses import list_mle_loss, margin_ranking_loss, pointwise_loss
    from headway.predict.model import LengthPredictor, load_checkpoint, load_encoder, save_checkpoint
    from headway.predict.online import OnlineConfig, OnlineLearner
    from headway.predict.score import (
        Scorer,
        default_scorer,
        ensure_predictor,
        export_onnx,
        quantize_onnx,
        score_workload,
    )
    from headway.predict.shipped import ShippedPredictor, pack_checkpoint
    from headway.predict.train import TrainConfig, TrainResult, train_predictor

_EXPORTS: dict[str, str] = {
    "CheckpointError": "_errors",
    "DataError": "_errors",
    "EncoderError": "_errors",
    "PredictError": "_errors",
    "default_cache_dir": "_paths",
    "default_data_dir": "_paths",
    "default_encoder_path": "_paths",
    "Example": "data",
    "ExampleSet": "data",
    "Split": "data",
    "alpaca_eval_models": "data",
    "keep_pair": "data",
    "load_alpaca_eval": "data",
    "load_alpaca_eval_consensus": "data",
    "load_codealpaca": "data",
    "load_dataset": "data",
    "load_jsonl": "data",
    "load_sharegpt": "data",
    "make_pairs": "data",
    "split_by_prompt": "data",
    "write_jsonl": "data",
    "MatrixResult": "evaluate",
    "Metrics": "evaluate",
    "cross_model_matrix": "evaluate",
    "evaluate_scorer": "evaluate",
    "rank_metrics": "evaluate",
    "resampling_ceiling": "evaluate",
    "list_mle_loss": "losses",
    "margin_ranking_loss": "losses",
    "pointwise_loss": "losses",
    "LengthPredictor": "model",
    "load_checkpoint": "model",
    "load_encoder": "model",
    "save_checkpoint": "model",
    "Scorer": "score",
    "default_scorer": "score",
    "ensure_predictor": "score",
    "export_onnx": "score",
    "quantize_onnx": "score",
    "score_workload": "score",
    "TrainConfig": "train",
    "TrainResult": "train",
    "train_predictor": "train",
    "CrossSourceResult": "crosssource",
    "cross_source_matrix": "crosssource",
    "OnnxEncoder": "encoder",
    "RidgeHead": "head",
    "OnlineConfig": "online",
    "OnlineLearner": "online",
    "ShippedPredictor": "shipped",
    "pack_checkpoint": "shipped",
}

__all__ = [
    "CheckpointError",
    "CrossSourceResult",
    "DataError",
    "EncoderError",
    "Example",
    "ExampleSet",
    "LengthPredictor",
    "MatrixResult",
    "Metrics",
    "OnlineConfig",
    "OnlineLearner",
    "OnnxEncoder",
    "PredictError",
    "RidgeHead",
    "Scorer",
    "ShippedPredictor",
    "Split",
    "TrainConfig",
    "TrainResult",
    "alpaca_eval_models",
    "cross_model_matrix",
    "cross_source_matrix",
    "default_cache_dir",
    "default_data_dir",
    "default_encoder_path",
    "default_scorer",
    "ensure_predictor",
    "evaluate_scorer",
    "export_onnx",
    "keep_pair",
    "list_mle_loss",
    "load_alpaca_eval",
    "load_alpaca_eval_consensus",
    "load_checkpoint",
    "load_codealpaca",
    "load_dataset",
    "load_encoder",
    "load_jsonl",
    "load_sharegpt",
    "make_pairs",
    "margin_ranking_loss",
    "pack_checkpoint",
    "pointwise_loss",
    "quantize_onnx",
    "rank_metrics",
    "resampling_ceiling",
    "save_checkpoint",
    "score_workload",
    "split_by_prompt",
    "train_predictor",
    "write_jsonl",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'headway.predict' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"headway.predict.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
