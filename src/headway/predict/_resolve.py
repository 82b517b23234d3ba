"""Resolve a scorer spec (``"pkg.module:attr"``) to a batch function ``list[str] -> scores``.

Shared by the gateway (``headway serve --scorer``) and the vLLM plugin (``scorer``
setting); imports nothing heavy, so either can use it without torch installed.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["MIN_SCORING_LENGTH", "resolve_score_fn"]

MIN_SCORING_LENGTH = 8
"""The fewest prompt tokens a predictor's scorer may cut prompts to (its ``max_length``)."""


def resolve_score_fn(spec: str) -> Callable[[list[str]], Any]:
    """``"pkg.module:attr"`` names a callable taking a list of prompts, or an object with a
    ``score(prompts)`` method (e.g. :class:`headway.predict.Scorer`); ``"pkg.module:factory()"``
    calls a zero-argument factory first; a class is instantiated. Errors are ValueError
    naming the spec."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"scorer {spec!r} is not of the form 'module:attr' or 'module:factory()'")
    call = attr.endswith("()")
    attr = attr.removesuffix("()")
    try:
        obj: Any = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load scorer {spec!r}: {exc}") from None
    if call or isinstance(obj, type):
        obj = obj()
    method = getattr(obj, "score", None)
    if callable(method):
        obj = method
    if not callable(obj):
        raise ValueError(f"scorer {spec!r} is neither callable nor has a score(prompts) method")
    fn: Callable[[list[str]], Any] = obj
    return fn
