"""Optional dependencies: the core install (the gateway's) has no scientific or plotting stack.

``pip install headway`` brings numpy and rich only; ``headway[sim]`` adds scipy (noisy-oracle
scorers, TRAIL's refinement, cost-model fits, Kendall's tau) and matplotlib (the figures of
reports); ``headway[serve]`` the gateway's web stack. Code that needs an extra imports it where
it is used, through :func:`require`, so a missing one is a clear error naming the extra.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

__all__ = ["MissingExtraError", "available", "require"]


class MissingExtraError(ImportError):
    """A feature needs a package of an extra that is not installed (the message says which)."""


def available(module: str) -> bool:
    """Whether ``module`` (a top-level package name) can be imported."""
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a finder that refuses it (or a broken install)
        return False


def require(module: str, extra: str, what: str) -> ModuleType:
    """``import module``, or :class:`MissingExtraError`: "``what`` needs ``package``: pip install
    'headway[extra]'"."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module.startswith(exc.name):
            raise
        raise MissingExtraError(f"{what} needs {exc.name}: pip install 'headway[{extra}]'") from None
