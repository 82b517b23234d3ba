"""Optional dependencies: the core install (the gateway's) has no scientific or plotting stack.

``pip install .`` brings numpy and rich only; the ``sim`` extra adds scipy (noisy-oracle
scorers, TRAIL's refinement, cost-model fits, Kendall's tau) and matplotlib (the figures of
reports); ``serve`` the gateway's web stack. Code that needs an extra imports it where it is
used, through :func:`require`, so a missing one is a clear error naming the extra and how to
install it from the checkout (:func:`install_hint`; headway is not on PyPI).
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

__all__ = ["MissingExtraError", "available", "install_hint", "require"]


class MissingExtraError(ModuleNotFoundError):
    """A feature needs a package of an extra that is not installed (the message says which, and how
    to install it)."""


def install_hint(extra: str) -> str:
    """How to install ``extra`` into a checkout's environment (``./dev setup`` installs them all)."""
    return f"pip install -e '.[{extra}]'"


def available(module: str) -> bool:
    """Whether ``module`` (a top-level package name) can be imported."""
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a finder that refuses it (or a broken install)
        return False


def require(module: str, extra: str, what: str) -> ModuleType:
    """``import module``, or :class:`MissingExtraError`: "``what`` needs ``package``: pip install -e
    '.[extra]'"."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module.startswith(exc.name):
            raise
        raise MissingExtraError(f"{what} needs {exc.name}: {install_hint(extra)}", name=exc.name) from None
