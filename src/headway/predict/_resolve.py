"""Resolve a scorer spec (``"pkg.module:attr"``) to a batch function ``list[str] -> scores``.

Shared by the gateway (``headway serve --scorer``) and the vLLM plugin (``scorer``
setting), as is :func:`predictor_spec`, which tells a trained predictor's spec from a module's;
imports nothing heavy, so either can use it without torch installed.
"""

from __future__ import annotations

import difflib
import importlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["MIN_SCORING_LENGTH", "not_a_spec_hint", "predictor_spec", "resolve_score_fn"]

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


def predictor_spec(spec: str) -> tuple[str | None, str | None] | None:
    """``(checkpoint, backend)`` when ``spec`` names a trained predictor, else ``None`` (a
    ``"module:attr"`` spec for :func:`resolve_score_fn`).

    ``"default"`` / ``"default:BACKEND"``: the default predictor (checkpoint ``None``);
    ``"DIR"`` / ``"DIR:BACKEND"``: the checkpoint in directory DIR, when DIR looks like a path
    (has a ``/`` or starts with ``~`` or ``.``; a module name never does) or holds a
    ``predictor.json`` (so ``"module:attr"`` stays a module even where a directory has the
    module's name). A spec that is an existing directory as a whole is that directory, even with a
    ``:`` in its name (``/ckpts/pars:v2``). ``backend`` is ``None`` when the spec names none (the
    caller's default). Neither the directory nor the backend is checked here: loading names what is
    missing."""
    if spec == "default" or spec.startswith("default:"):
        return None, spec.partition(":")[2] or None
    if ":" in spec and Path(spec).expanduser().is_dir():
        return spec, None
    head, sep, tail = spec.rpartition(":")
    backend: str | None = tail
    if not sep:
        head, backend = spec, None
    if head and tail and (_looks_like_path(head) or (Path(head).expanduser() / "predictor.json").is_file()):
        return head, backend
    return None


def not_a_spec_hint(spec: str, names: tuple[str, ...] = ("default",)) -> str:
    """What the error refusing ``spec`` (neither a predictor nor ``module:attr``) adds, starting with
    ``"; "``: the one of ``names`` it looks like a typo of, else why it is no checkpoint directory (a
    bare name is one only where that directory holds ``predictor.json``)."""
    close = difflib.get_close_matches(spec, names, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}?"
    if Path(spec).expanduser().is_dir():
        return f"; the directory {spec!r} holds no predictor.json, so it is no predictor checkpoint"
    return f"; there is no checkpoint directory {spec!r} in {Path.cwd()}"


def _looks_like_path(text: str) -> bool:
    return "/" in text or os.sep in text or text.startswith(("~", "."))
