"""The vLLM plugin's errors."""

from __future__ import annotations

__all__ = ["PluginConfigError", "VllmVersionError"]


class PluginConfigError(ValueError):
    """The plugin's settings are invalid."""


class VllmVersionError(RuntimeError):
    """The installed vLLM is not one whose scheduler interface this plugin supports."""
