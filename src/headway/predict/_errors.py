"""Errors raised by :mod:`headway.predict`; each message names the record, file or path at fault."""

from __future__ import annotations

__all__ = ["CheckpointError", "DataError", "EncoderError", "PredictError"]


class PredictError(ValueError):
    """Base class of the predictor's errors."""


class DataError(PredictError):
    """A data file or record is malformed (the message names the file and line or record)."""


class EncoderError(PredictError):
    """A path given as an encoder is not a usable Hugging Face encoder (the message names the path)."""


class CheckpointError(PredictError):
    """A predictor checkpoint is missing, incomplete, corrupt or inconsistent (names the path)."""
